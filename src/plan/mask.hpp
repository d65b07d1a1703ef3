// The mask a kernel is built for and what joins its softmax, stated once on the host: its traits, its program name's
// suffix, its words in the generated source's comment and in the plan's JSON. Every family's stub asks it; the
// templates pick the device mask's kind from these traits (common/mask.cuh: mask_kind) and the sinks' code from
// kSinks. A window's bounds and the sinks' values are not here: they are run-time values (the params' window_left,
// window_right, sinks), so one cubin serves every window and every sink.
#pragma once
#include <string>

namespace rtattn::plan {

struct MaskSpec {
    bool causal = false;  // bottom-right aligned
    bool local = false;   // a sliding window (with causal: its right bound is 0)
    bool sinks = false;   // a per-head logit in every row's softmax denominator (the epilogues; dsinks)

    // The traits, as add(name, value) calls: kCausal, kLocal, kSinks.
    template <class Add>
    void traits(Add add) const {
        add("kCausal", causal);
        add("kLocal", local);
        add("kSinks", sinks);
    }
    std::string suffix() const {
        return std::string(causal ? "_causal" : "") + (local ? "_local" : "") + (sinks ? "_sinks" : "");
    }
    std::string words() const {
        return std::string(causal ? ", causal" : "") + (local ? ", local" : "") + (sinks ? ", sinks" : "");
    }
    template <class Json>
    void to_json(Json& j) const {
        j["causal"] = causal;
        j["local"] = local;
        j["sinks"] = sinks;
    }
};

}  // namespace rtattn::plan
