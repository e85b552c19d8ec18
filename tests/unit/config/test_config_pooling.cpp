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
