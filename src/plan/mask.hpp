// The mask a kernel is built for, stated once on the host: its traits, its program name's suffix, its words in the
// generated source's comment and in the plan's JSON. Every family's stub asks it; the templates pick the device
// mask's kind from these traits (common/mask.cuh: mask_kind). A window's bounds are not here: they are run-time
// values (FwdParams / BwdParams window_left, window_right), so one cubin serves every window.
#pragma once
#include <string>

namespace rtattn::plan {

struct MaskSpec {
    bool causal = false;  // bottom-right aligned
    bool local = false;   // a sliding window (with causal: its right bound is 0)

    // The traits, as add(name, value) calls: kCausal, kLocal.
    template <class Add>
    void traits(Add add) const {
        add("kCausal", causal);
        add("kLocal", local);
    }
    std::string suffix() const { return std::string(causal ? "_causal" : "") + (local ? "_local" : ""); }
    std::string words() const { return std::string(causal ? ", causal" : "") + (local ? ", local" : ""); }
    template <class Json>
    void to_json(Json& j) const {
        j["causal"] = causal;
        j["local"] = local;
    }
};

}  // namespace rtattn::plan
