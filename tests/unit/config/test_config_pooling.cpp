// [[pool]] pooling: how /v1/embeddings pools a pool's hidden states; read as written, refused with
// the pool, the value and the three that exist.
#include <catch2/catch.hpp>
#include <string>

#include "config/config.h"

using namespace steward;

namespace {
std::string pool_with(const std::string& line) {
    return "[[pool]]\nname = \"p\"\nmodel = \"m.gguf\"\n" + line + "\n";
}
}  // namespace

TEST_CASE("a pool's pooling is mean, last, cls or unset", "[config]") {
    auto unset = parse_config(pool_with(""), "x.toml");
    REQUIRE(unset.ok());
    CHECK(unset->pools[0].pooling.empty());  // the GGUF's pooling_type, else last
    for (const char* p : {"mean", "last", "cls"}) {
        auto c = parse_config(pool_with(std::string("pooling = \"") + p + "\""), "x.toml");
        REQUIRE(c.ok());
        CHECK(c->pools[0].pooling == p);
    }
    auto bad = parse_config(pool_with("pooling = \"avg\""), "x.toml");
    REQUIRE(!bad.ok());
    CHECK_THAT(bad.error().message, Catch::Contains("x.toml:") &&
                                        Catch::Contains("pool 'p' pooling must be \"mean\", \"last\" or \"cls\"") &&
                                        Catch::Contains("got \"avg\""));
    auto wrong_type = parse_config(pool_with("pooling = 1"), "x.toml");
    REQUIRE(!wrong_type.ok());
    CHECK_THAT(wrong_type.error().message, Catch::Contains("pooling"));
}

TEST_CASE("a pool's KV cache types are read, checked and default to kv_dtype", "[config][kv_quant]") {
    auto c = parse_config(pool_with("kv_dtype = \"F16\"\nkv_type_k = \"q8_0\"\nkv_type_v = \"Q4_0\""), "x.toml");
    REQUIRE(c.ok());
    CHECK(c->pools[0].kv_dtype == "f16");
    CHECK(c->pools[0].kv_type_k == "q8_0");
    CHECK(c->pools[0].kv_type_v == "q4_0");
    auto unset = parse_config(pool_with("kv_dtype = \"bf16\""), "x.toml");
    REQUIRE(unset.ok());
    CHECK(unset->pools[0].kv_type_k.empty());  // kv_dtype's (pool.cpp kv_types_of)
    auto bad = parse_config(pool_with("kv_type_v = \"q4_1\""), "x.toml");
    REQUIRE(!bad.ok());
    CHECK_THAT(bad.error().message, Catch::Contains("pool 'p' kv_type_v = \"q4_1\" is not a KV cache type") &&
                                        Catch::Contains("f32, f16, bf16, q8_0, q4_0, fp8"));
    auto fp8 = parse_config(pool_with("kv_dtype = \"fp8\""), "x.toml");
    REQUIRE(!fp8.ok());
    CHECK_THAT(fp8.error().message, Catch::Contains("needs backend = \"cuda\""));
    CHECK(parse_config(pool_with("backend = \"cuda\"\nkv_type_k = \"fp8\""), "x.toml").ok());
}
