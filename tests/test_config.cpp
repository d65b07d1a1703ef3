// AttentionConfig: every validation path names its field; JSON round-trips exactly.
#include <cmath>
#include <cstdlib>
#include <limits>

#include "catch.hpp"
#include "core/rtattn.hpp"
#include "driver/driver.hpp"
#include "kernels/forward.hpp"
#include "plan/plan.hpp"

using rtattn::AttentionConfig;
using rtattn::ConfigError;

namespace {

// Expects validate() to throw a ConfigError for `field` whose message mentions `needle`.
void expect_field_error(const AttentionConfig& c, const std::string& field, const std::string& needle) {
    try {
        c.validate();
        FAIL("expected ConfigError for " << field);
    } catch (const ConfigError& e) {
        CHECK(e.field() == field);
        CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("defaults are valid", "[config]") {
    AttentionConfig c;
    REQUIRE_NOTHROW(c.validate());
    CHECK(c.dv() == 128);
    CHECK(c.scale() == Approx(1.0 / std::sqrt(128.0)));
}

TEST_CASE("head dims outside 1..256 are refused with the range", "[config]") {
    AttentionConfig c;
    for (int d : {0, -1, 257, 100000}) {
        c.head_dim_qk = d;
        expect_field_error(c, "head_dim_qk", "1..256");
    }
    c.head_dim_qk = 128;
    c.head_dim_v = 0;
    expect_field_error(c, "head_dim_v", "1..256");
    c.head_dim_v = 257;
    expect_field_error(c, "head_dim_v", "1..256");
    for (int d : {1, 17, 132, 255, 256}) {
        c.head_dim_qk = d;
        c.head_dim_v = d;
        CHECK_NOTHROW(c.validate());
    }
}

TEST_CASE("head counts must divide", "[config]") {
    AttentionConfig c;
    c.num_heads_q = 0;
    expect_field_error(c, "num_heads_q", "out of range");
    c.num_heads_q = 32;
    c.num_heads_kv = 0;
    expect_field_error(c, "num_heads_kv", "out of range");
    c.num_heads_kv = 64;
    expect_field_error(c, "num_heads_kv", "out of range");
    c.num_heads_kv = 6;
    expect_field_error(c, "num_heads_kv", "multiple");
    c.num_heads_kv = 8;
    CHECK_NOTHROW(c.validate());
    c.num_heads_kv = 1;  // MQA
    CHECK_NOTHROW(c.validate());
    // The query heads are the grid's y (at most 65535): 65536 passed here and then failed every launch.
    c.num_heads_q = 65536;
    expect_field_error(c, "num_heads_q", "1..65535");
    c.num_heads_q = 65535;
    CHECK_NOTHROW(c.validate());
}

TEST_CASE("softmax scale and arch are checked", "[config]") {
    AttentionConfig c;
    c.softmax_scale = 0.0;
    expect_field_error(c, "softmax_scale", "> 0");
    c.softmax_scale = -1.0;
    expect_field_error(c, "softmax_scale", "> 0");
    c.softmax_scale = std::numeric_limits<double>::infinity();
    expect_field_error(c, "softmax_scale", "finite");
    c.softmax_scale = std::numeric_limits<double>::quiet_NaN();
    expect_field_error(c, "softmax_scale", "finite");
    // Finite doubles that are not usable floats: infinity (or 0) in the kernel, all-NaN or uniform attention.
    for (double bad : {1e300, 3.5e38, 1e39, 1e-46, 1e-39, -1e-3}) {
        c.softmax_scale = bad;
        expect_field_error(c, "softmax_scale", "normal float32");
    }
    for (double good : {1.2e-38, 1e-30, 0.088388, 1e30, 2.3e38}) {
        c.softmax_scale = good;
        CHECK_NOTHROW(c.validate());
    }
    c.softmax_scale = 0.125;
    CHECK(c.scale() == 0.125);
    c.arch = "sm_75";
    expect_field_error(c, "arch", "sm_90a");
    c.arch = "sm_90a";
    CHECK_NOTHROW(c.validate());
}

TEST_CASE("dtype names", "[config]") {
    CHECK(rtattn::dtype_from_string("bf16") == rtattn::Dtype::bf16);
    CHECK(rtattn::dtype_from_string("fp16") == rtattn::Dtype::fp16);
    try {
        rtattn::dtype_from_string("fp8");
        FAIL("fp8 accepted");
    } catch (const ConfigError& e) {
        CHECK(e.field() == "dtype");
        CHECK(std::string(e.what()).find("fp16, bf16") != std::string::npos);
    }
}

TEST_CASE("JSON round trip is exact", "[config]") {
    AttentionConfig a;
    a.head_dim_qk = 192;
    a.head_dim_v = 128;
    a.dtype = rtattn::Dtype::fp16;
    a.causal = true;
    a.num_heads_q = 64;
    a.num_heads_kv = 8;
    a.softmax_scale = 0.1;
    a.arch = "sm_90a";
    CHECK(AttentionConfig::from_json(a.to_json()) == a);
    AttentionConfig b;  // optional fields unset survive too
    b.head_dim_qk = 132;
    CHECK(AttentionConfig::from_json(b.to_json()) == b);
    CHECK(b.to_json() == AttentionConfig::from_json(b.to_json()).to_json());
    AttentionConfig d;  // the serving fields
    d.decode = true;
    d.paged_kv = true;
    CHECK(AttentionConfig::from_json(d.to_json()) == d);
    CHECK(AttentionConfig::from_json(R"({"head_dim": 64})").decode == false);
    AttentionConfig v;
    v.varlen = true;
    CHECK(AttentionConfig::from_json(v.to_json()) == v);
    CHECK(v != AttentionConfig{});
}

// The field and message from_json's ConfigError names, or "<no error>" for both.
std::pair<std::string, std::string> json_error(const std::string& json) {
    try {
        AttentionConfig::from_json(json);
    } catch (const ConfigError& e) {
        return {e.field(), e.what()};
    }
    return {"<no error>", "<no error>"};
}

TEST_CASE("JSON errors name the field", "[config]") {
    auto field_of = [](const std::string& json) { return json_error(json).first; };
    CHECK(field_of("{") == "json");
    CHECK(field_of("[1]") == "json");
    CHECK(field_of(R"({"dtype":"bf16"})") == "head_dim_qk");
    CHECK(field_of(R"({"head_dim":"64"})") == "head_dim");
    CHECK(field_of(R"({"head_dim":64,"dtype":7})") == "dtype");
    CHECK(field_of(R"({"head_dim":64,"causal":"yes"})") == "causal");
    CHECK(field_of(R"({"head_dim":64,"heads":8})") == "heads");
    CHECK(field_of(R"({"head_dim":300})") == "head_dim");  // the spelling the caller used
    CHECK(field_of(R"({"head_dim_qk":300})") == "head_dim_qk");
    CHECK(field_of(R"({"head_dim":64,"num_heads_q":8,"num_heads_kv":3})") == "num_heads_kv");
    CHECK(field_of(R"({"head_dim":64,"arch":"sm_70"})") == "arch");
    CHECK(field_of(R"({"head_dim":64,"softmax_scale":"x"})") == "softmax_scale");
    CHECK(field_of(R"({"head_dim":99999999999})") == "head_dim");
    // Both spellings are checked, and must agree.
    CHECK(field_of(R"({"head_dim":"abc","head_dim_qk":64})") == "head_dim");
    CHECK(field_of(R"({"head_dim":64,"head_dim_qk":128})") == "head_dim");
    CHECK(AttentionConfig::from_json(R"({"head_dim":64,"head_dim_qk":64})").head_dim_qk == 64);
    const auto c = AttentionConfig::from_json(R"({"head_dim":80,"num_heads_q":32})");
    CHECK(c.head_dim_qk == 80);
    CHECK(c.num_heads_kv == 32);  // MHA unless told otherwise
}

TEST_CASE("JSON error messages echo values as written, escaped and short", "[config]") {
    auto message_of = [](const std::string& json) { return json_error(json).second; };
    CHECK(message_of(R"({"head_dim":18446744073709551615})")
              .find("18446744073709551615 is out of range; allowed 1..256") != std::string::npos);
    CHECK(message_of(R"({"head_dim":-5})").find("-5 is out of range") != std::string::npos);
    const std::string nul = message_of(R"({"head_dim":64,"dtype":"bf\u0000x\u001b[2J"})");
    CHECK(nul.find("'bf\\x00x\\x1b[2J'") != std::string::npos);
    const std::string huge = message_of(R"({"head_dim":64,"arch":")" + std::string(1 << 20, 'a') + R"("})");
    CHECK(huge.size() < 400);
    CHECK(huge.find("(1048576 bytes)") != std::string::npos);
    const std::string key = message_of("{\"head_dim\":64,\"x\\u001by\":1}");
    for (const char ch : key) CHECK((ch >= 0x20 && ch < 0x7f));
}

TEST_CASE("decode and paged_kv: booleans; a paged cache serves decode and prefill", "[config]") {
    AttentionConfig c;
    c.paged_kv = true;
    CHECK_NOTHROW(c.validate());  // a prefill against a paged cache
    CHECK(c.describe() == "d128 bf16 noncausal h1:1 paged");  // not the dense config's label
    c.varlen = true;
    CHECK_NOTHROW(c.validate());  // with packed queries
    c.varlen = false;
    c.decode = true;
    CHECK_NOTHROW(c.validate());
    CHECK(c.describe().find("decode paged") != std::string::npos);
    CHECK(json_error(R"({"head_dim": 64, "decode": 1})").first == "decode");
    CHECK(json_error(R"({"head_dim": 64, "paged_kv": 1})").first == "paged_kv");
}

TEST_CASE("varlen: a boolean, the packed prefill (not with decode)", "[config]") {
    AttentionConfig c;
    c.varlen = true;
    CHECK_NOTHROW(c.validate());
    CHECK(c.describe().find("varlen") != std::string::npos);
    c.decode = true;
    try {
        c.validate();
        FAIL("varlen with decode was accepted");
    } catch (const ConfigError& e) {
        CHECK(e.field() == "varlen");
    }
    CHECK(json_error(R"({"head_dim": 64, "varlen": "yes"})").first == "varlen");
    CHECK(AttentionConfig::from_json(R"({"head_dim": 64, "varlen": true})").varlen);
}

TEST_CASE("local: a boolean, a sliding window for every pass", "[config][local]") {
    AttentionConfig c;
    c.local = true;
    CHECK_NOTHROW(c.validate());
    CHECK(c.describe().find("local") != std::string::npos);
    c.varlen = c.causal = true;
    CHECK_NOTHROW(c.validate());
    c.varlen = false, c.paged_kv = true;  // a paged prefill (chunked prefill) with a window
    CHECK_NOTHROW(c.validate());
    c.decode = true;  // paged decode
    CHECK_NOTHROW(c.validate());
    CHECK(json_error(R"({"head_dim": 64, "local": 1})").first == "local");
    const AttentionConfig j = AttentionConfig::from_json(R"({"head_dim": 64, "local": true})");
    CHECK(j.local);
    CHECK(AttentionConfig::from_json(j.to_json()) == j);
    CHECK_FALSE(AttentionConfig::from_json(R"({"head_dim": 64})").local);
}

TEST_CASE("sinks: a boolean, for every pass", "[config][sinks]") {
    AttentionConfig c;
    c.sinks = true;
    CHECK_NOTHROW(c.validate());
    CHECK(c.describe().find("sinks") != std::string::npos);
    c.varlen = c.causal = c.local = true;
    CHECK_NOTHROW(c.validate());
    c.varlen = false, c.paged_kv = c.decode = true;
    CHECK_NOTHROW(c.validate());
    CHECK(json_error(R"({"head_dim": 64, "sinks": 1})").first == "sinks");
    const AttentionConfig j = AttentionConfig::from_json(R"({"head_dim": 64, "sinks": true})");
    CHECK(j.sinks);
    CHECK(AttentionConfig::from_json(j.to_json()) == j);
    CHECK_FALSE(AttentionConfig::from_json(R"({"head_dim": 64})").sinks);
}

TEST_CASE("softcap: a boolean, for every forward pass", "[config][softcap]") {
    AttentionConfig c;
    c.softcap = true;
    CHECK_NOTHROW(c.validate());
    CHECK(c.describe().find("softcap") != std::string::npos);
    c.varlen = c.causal = c.local = c.sinks = true;
    CHECK_NOTHROW(c.validate());
    c.varlen = false, c.paged_kv = c.decode = true;
    CHECK_NOTHROW(c.validate());
    CHECK(json_error(R"({"head_dim": 64, "softcap": 30})").first == "softcap");  // the flag; the cap is per call
    const AttentionConfig j = AttentionConfig::from_json(R"({"head_dim": 64, "softcap": true})");
    CHECK(j.softcap);
    CHECK(AttentionConfig::from_json(j.to_json()) == j);
}

TEST_CASE("alibi: a boolean, planned in every pass", "[config][alibi]") {
    AttentionConfig c;
    c.alibi = true;
    CHECK_NOTHROW(c.validate());
    CHECK(c.describe().find("alibi") != std::string::npos);
    c.varlen = c.causal = c.local = c.sinks = c.softcap = true;
    CHECK_NOTHROW(c.validate());
    const AttentionConfig j = AttentionConfig::from_json(R"({"head_dim": 64, "alibi": true})");
    CHECK(j.alibi);
    CHECK(AttentionConfig::from_json(j.to_json()) == j);
    CHECK(json_error(R"({"head_dim": 64, "alibi": [0.5]})").first == "alibi");  // the flag; the slopes are per call
    AttentionConfig d;
    d.head_dim_qk = 128, d.arch = "sm_90a", d.decode = true, d.alibi = true;
    CHECK(rtattn::plan::plan(d).mask.alibi);
    d.decode = false, d.paged_kv = true, d.alibi = true;  // a prefill against a paged cache has it
    CHECK(rtattn::plan::plan(d).mask.alibi);
}

// Issue 21: bad input never corrupts memory, hangs or crashes.

TEST_CASE("JSON nested deeper than 64 levels is refused before a value is built, naming json", "[config]") {
    const auto nested = [](int levels) {
        return std::string(std::size_t(levels), '[') + std::string(std::size_t(levels), ']');
    };
    // A deep value in a field used to be printed into the error message, recursing once per level: SIGSEGV.
    for (const std::string& text : {"{\"head_dim\":" + nested(1000000) + "}", nested(1000000),
                                    "{\"head_dim\":64,\"x\":" + nested(64) + "}"}) {
        const auto [field, message] = json_error(text);
        CHECK(field == "json");
        CHECK(message.find("nested deeper than 64 levels") != std::string::npos);
        CHECK(message.size() < 300);
    }
    // 64 levels (the object and 63 arrays) are JSON like any other: the field's own check answers.
    CHECK(json_error("{\"head_dim\":" + nested(63) + "}").first == "head_dim");
    // Brackets inside strings are text, escaped quotes included.
    CHECK(json_error(R"({"head_dim":64,"arch":"\")" + std::string(1000, '[') + "\"}").first == "arch");
}

TEST_CASE("a JSON key given twice is refused, naming the key", "[config]") {
    // nlohmann keeps the last value silently: this config was read as head_dim 128.
    const auto [field, message] = json_error(R"({"head_dim":64,"causal":true,"head_dim":128})");
    CHECK(field == "json");
    CHECK(message.find("'head_dim' appears twice") != std::string::npos);
    const std::string escaped = json_error("{\"head_dim\":64,\"\\u001b\":1,\"\\u001b\":2}").second;
    CHECK(escaped.find("'\\x1b' appears twice") != std::string::npos);
    CHECK(AttentionConfig::from_json(R"({"head_dim":64,"causal":true})").causal);
}

TEST_CASE("RTATTN_TMA takes 0, 1, true or false; any other value is an error naming it", "[config][env]") {
    // `false` used to be ignored silently (only "0" turned TMA off). The value is checked before anything of the
    // call is read or the driver is asked, so no GPU is needed to see it.
    AttentionConfig c;
    c.head_dim_qk = 128;
    c.arch = "sm_90a";
    const auto p = rtattn::plan::plan(c);
    REQUIRE(std::string(p.family->name()) == "fwd_sm90_ws");
    REQUIRE(p.swizzle);
    const rtattn::ForwardArgs args;
    const rtattn::driver::Module module;
    ::setenv("RTATTN_TMA", "yes", 1);
    try {
        p.family->launch({p, c, args, module, nullptr, 1});
        FAIL("RTATTN_TMA=yes was accepted");
    } catch (const ConfigError& e) {
        CHECK(e.field() == "RTATTN_TMA");
        CHECK(std::string(e.what()).find("allowed: 1, 0, true, false") != std::string::npos);
    } catch (const std::exception& e) {
        FAIL("RTATTN_TMA=yes gave no ConfigError but: " << e.what());
    }
    ::unsetenv("RTATTN_TMA");
}
