// AttentionConfig: every validation path names its field; JSON round-trips exactly.
#include <cmath>
#include <limits>

#include "catch.hpp"
#include "core/rtattn.hpp"

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
}

TEST_CASE("softmax scale and arch are checked", "[config]") {
    AttentionConfig c;
    c.softmax_scale = 0.0;
    expect_field_error(c, "softmax_scale", "> 0");
    c.softmax_scale = -1.0;
    expect_field_error(c, "softmax_scale", "> 0");
    c.softmax_scale = std::numeric_limits<double>::infinity();
    expect_field_error(c, "softmax_scale", "finite");
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
