// A request's output constraint (runtime/grammar/constraint.h): the compile budget on alternatives
// that every step's token mask would walk, per rule and at the output's start.
#include <catch2/catch.hpp>

#include <string>

#include "grammar/constraint.h"

using namespace steward;

namespace {

// root ::= "w0" | "w1" | ... (n distinct literals), optionally behind a prefix rule.
std::string flat_alternation(int n, bool behind_prefix) {
    std::string alts;
    for (int i = 0; i < n; i++) alts += (i ? " | \"w" : "\"w") + std::to_string(i) + "\"";
    return behind_prefix ? "root ::= \"{\" words \"}\"\nwords ::= " + alts + "\n" : "root ::= " + alts + "\n";
}

}  // namespace

TEST_CASE("a grammar with more alternatives than the budget is refused naming the rule and the limit", "[grammar]") {
    for (bool behind : {false, true}) {
        auto over = compile_constraint(ConstraintKind::GBNF, flat_alternation(5000, behind));
        REQUIRE_FALSE(over);
        CHECK_THAT(over.error().message, Catch::Contains("5000 alternatives") && Catch::Contains("at most 4096") &&
                                             Catch::Contains(behind ? "'words'" : "'root'") &&
                                             Catch::Contains("factor common prefixes"));
        CHECK(compile_constraint(ConstraintKind::GBNF, flat_alternation(4000, behind)));
    }
}

TEST_CASE("nested rules that multiply past the budget at the output's start are refused", "[grammar]") {
    // 80 x 80 = 6400 stacks at the first byte, though no rule has more than 80 alternatives.
    std::string a, b;
    for (int i = 0; i < 80; i++) {
        a += (i ? " | b \"x" : "b \"x") + std::to_string(i) + "\"";
        b += (i ? " | \"y" : "\"y") + std::to_string(i) + "\"";
    }
    auto r = compile_constraint(ConstraintKind::GBNF, "root ::= " + a + "\nb ::= " + b + "\n");
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains("start matches 6400 alternatives"));
}

TEST_CASE("a JSON Schema enum of 60000 values is within the budget", "[grammar]") {
    std::string schema = R"({"type":"object","properties":{"v":{"enum":[)";
    for (int i = 0; i < 60000; i++) schema += (i ? ",\"k" : "\"k") + std::to_string(i) + "\"";
    schema += R"(]}},"required":["v"]})";
    CHECK(compile_constraint(ConstraintKind::JSON_SCHEMA, schema));
}
