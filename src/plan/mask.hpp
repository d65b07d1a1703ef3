// The mask a kernel is built for and what joins its softmax, stated once on the host: its traits, its program name's
// suffix, its words in the generated source's comment and in the plan's JSON. Every family's stub asks it; the
// templates pick the device mask's kind from these traits (common/mask.cuh: mask_kind) and the sinks' code from
// kSinks, the cap's tanh from kSoftcap and ALiBi's bias from kAlibi. A window's bounds, the sinks' values, the cap and
// the slopes are not here: they are run-time values (the params' window_left, window_right, sinks, softcap_scale,
// alibi_slopes), so one cubin serves every value.
#pragma once
#include <string>

namespace rtattn::plan {

struct MaskSpec {
    bool causal = false;  // bottom-right aligned
    bool local = false;   // a sliding window (with causal: its right bound is 0)
    bool sinks = false;   // a per-head logit in every row's softmax denominator (the epilogues; dsinks)
    bool softcap = false; // scores capped by a tanh before the mask and the softmax (common/softmax.cuh)
    bool alibi = false;   // scores minus slope * distance from the diagonal, after the cap (common/mask.cuh)

    // The traits, as add(name, value) calls: kCausal, kLocal, kSinks, kSoftcap, kAlibi.
    template <class Add>
    void traits(Add add) const {
        add("kCausal", causal);
        add("kLocal", local);
        add("kSinks", sinks);
        add("kSoftcap", softcap);
        add("kAlibi", alibi);
    }
    std::string suffix() const {
        return std::string(causal ? "_causal" : "") + (local ? "_local" : "") + (sinks ? "_sinks" : "") +
               (softcap ? "_softcap" : "") + (alibi ? "_alibi" : "");
    }
    std::string words() const {
        return std::string(causal ? ", causal" : "") + (local ? ", local" : "") + (sinks ? ", sinks" : "") +
               (softcap ? ", softcap" : "") + (alibi ? ", alibi" : "");
    }
    template <class Json>
    void to_json(Json& j) const {
        j["causal"] = causal;
        j["local"] = local;
        j["sinks"] = sinks;
        j["softcap"] = softcap;
        j["alibi"] = alibi;
    }
};

}  // namespace rtattn::plan
