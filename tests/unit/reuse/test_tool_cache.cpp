// Tests for runtime/reuse/tool_cache: canonical arguments, keys, TTL staleness, the first-stored
// time of a resent result, scopes (session / tenant / public, and the tenant salt), LRU bounds, and
// random store / lookup / time / session-end sequences checked against a naive model of the scope
// rules: a hit is exactly the model's answer and never an entry of another scope.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "reuse/tool_cache.h"

using namespace steward::reuse;
using nlohmann::json;

namespace {

ToolCachePolicy policy(const std::string& tool, ToolScope scope, double ttl_s = 60, std::vector<std::string> key = {}) {
    ToolCachePolicy p;
    p.tool = tool;
    p.scope = scope;
    p.ttl_s = ttl_s;
    p.key = std::move(key);
    return p;
}

ToolCaller caller(const std::string& tenant, uint64_t salt, const std::string& session = "",
                  std::vector<std::string> labels = {}) {
    return ToolCaller{tenant, salt, session, std::move(labels)};
}

const json paris = json::parse(R"({"city": "Paris"})");

}  // namespace

TEST_CASE("tool cache: scope names", "[reuse]") {
    for (auto s : {ToolScope::SESSION, ToolScope::TENANT, ToolScope::PUBLIC})
        CHECK(parse_tool_scope(tool_scope_name(s)) == s);
    CHECK(std::string(tool_scope_name(ToolScope::SESSION)) == "session");
    CHECK(std::string(tool_scope_name(ToolScope::TENANT)) == "tenant");
    CHECK(std::string(tool_scope_name(ToolScope::PUBLIC)) == "public");
    CHECK_FALSE(parse_tool_scope("Public"));
    CHECK_FALSE(parse_tool_scope(""));
}

TEST_CASE("tool cache: canonical arguments", "[reuse]") {
    auto a = canonical_arguments(json::parse(R"({"b":1,"a":2})"), {});
    auto b = canonical_arguments(json::parse(R"({ "a" : 2,  "b": 1 })"), {});
    REQUIRE(a);
    REQUIRE(b);
    CHECK(*a == *b);
    CHECK(*a == R"({"a":2,"b":1})");
    // Sorted at every depth, arrays keep their order, no whitespace.
    auto n = canonical_arguments(json::parse(R"({"z": {"y": 1, "x": [{"d": 1, "c": "s p"}, 3]}, "m": null})"), {});
    REQUIRE(n);
    CHECK(*n == R"({"m":null,"z":{"x":[{"c":"s p","d":1},3],"y":1}})");
    // Key fields: only those, all required.
    auto k = canonical_arguments(json::parse(R"({"units": "c", "city": "Paris", "day": 1})"), {"day", "city"});
    REQUIRE(k);
    CHECK(*k == R"({"city":"Paris","day":1})");
    CHECK(canonical_arguments(json::parse(R"({"city": "Paris", "units": "f"})"), {"city"}) ==
          canonical_arguments(json::parse(R"({"units": "c", "city": "Paris"})"), {"city"}));
    CHECK_FALSE(canonical_arguments(json::parse(R"({"units": "c"})"), {"city"}));
    CHECK_FALSE(canonical_arguments(json::parse(R"({"city": "Paris"})"), {"city", "day"}));
    // Only objects.
    CHECK_FALSE(canonical_arguments(json::parse("[1, 2]"), {}));
    CHECK_FALSE(canonical_arguments(json::parse("\"x\""), {}));
    CHECK(canonical_arguments(json::object(), {}) == std::string("{}"));
    // Values are told apart.
    CHECK(canonical_arguments(json::parse(R"({"a": 1})"), {}) != canonical_arguments(json::parse(R"({"a": "1"})"), {}));
}

TEST_CASE("tool cache: keys", "[reuse]") {
    auto s = policy("weather", ToolScope::SESSION);
    auto t = policy("weather", ToolScope::TENANT);
    auto p = policy("weather", ToolScope::PUBLIC);
    CHECK_FALSE(tool_cache_key(s, caller("acme", 1), paris));
    REQUIRE(tool_cache_key(s, caller("acme", 1, "s1"), paris));
    CHECK_FALSE(tool_cache_key(s, caller("acme", 1, "s1"), json::parse("[]")));
    // The scope, the owner and the tool each make a different key.
    std::set<std::string> keys = {*tool_cache_key(s, caller("acme", 1, "s1"), paris),
                                  *tool_cache_key(s, caller("acme", 1, "s2"), paris),
                                  *tool_cache_key(s, caller("acme", 2, "s1"), paris),
                                  *tool_cache_key(s, caller("beta", 1, "s1"), paris),
                                  *tool_cache_key(t, caller("acme", 1, "s1"), paris),
                                  *tool_cache_key(t, caller("acme", 1, "s1", {"x"}), paris),
                                  *tool_cache_key(t, caller("acme", 2, "s1"), paris),
                                  *tool_cache_key(p, caller("acme", 1, "s1"), paris),
                                  *tool_cache_key(policy("search", ToolScope::PUBLIC), caller("acme", 1), paris)};
    CHECK(keys.size() == 9);
    // The label set counts, not its order or repeats; the session does not for TENANT; nothing of the caller for
    // PUBLIC.
    CHECK(tool_cache_key(t, caller("acme", 1, "", {"b", "a"}), paris) ==
          tool_cache_key(t, caller("acme", 1, "s9", {"a", "b", "a"}), paris));
    CHECK(tool_cache_key(p, caller("acme", 1, "s1", {"x"}), paris) == tool_cache_key(p, caller("zeta", 7), paris));
    // A separator inside a name cannot forge another owner.
    CHECK(tool_cache_key(policy("x", ToolScope::SESSION), caller("a", 1, "s\x1fweather"), paris) !=
          tool_cache_key(policy("weather\x1fx", ToolScope::SESSION), caller("a", 1, "s"), paris));
}

TEST_CASE("tool cache: ttl staleness", "[reuse]") {
    ToolResultCache c;
    auto p = policy("weather", ToolScope::TENANT, 10);
    auto who = caller("acme", 1);
    REQUIRE(c.store(p, who, paris, "Sunny", 100));
    bool stale = true;
    auto hit = c.lookup(p, who, paris, 109.5, &stale);
    REQUIRE(hit);
    CHECK_FALSE(stale);
    CHECK(hit->result == "Sunny");
    CHECK(hit->age_s == 9.5);
    CHECK(hit->scope == ToolScope::TENANT);
    // At exactly ttl_s old: stale, removed, counted.
    CHECK_FALSE(c.lookup(p, who, paris, 110, &stale));
    CHECK(stale);
    CHECK(c.stats().stale_refused == 1);
    CHECK(c.stats().entries == 0);
    CHECK_FALSE(c.lookup(p, who, paris, 110, &stale));
    CHECK_FALSE(stale);
    CHECK(c.stats().misses == 1);
    CHECK(c.stats().hits == 1);
    // ttl_s <= 0 never serves.
    REQUIRE(c.store(p, who, paris, "Rain", 200));
    CHECK_FALSE(c.lookup(policy("weather", ToolScope::TENANT, 0), who, paris, 200, &stale));
    CHECK(stale);
    // The looking policy's ttl applies: a shorter one refuses what a longer one would serve.
    REQUIRE(c.store(p, who, paris, "Fog", 300));
    CHECK_FALSE(c.lookup(policy("weather", ToolScope::TENANT, 2), who, paris, 302));
    CHECK(c.stats().stale_refused == 3);
}

TEST_CASE("tool cache: resent result keeps its time", "[reuse]") {
    ToolResultCache c;
    auto p = policy("weather", ToolScope::SESSION, 30);
    auto who = caller("acme", 1, "s1");
    REQUIRE(c.store(p, who, paris, "Sunny", 0));
    REQUIRE(c.store(p, who, json::parse(R"({"city":"Paris"})"), "Sunny", 20));
    auto hit = c.lookup(p, who, paris, 25);
    REQUIRE(hit);
    CHECK(hit->age_s == 25);
    // Still stale at 30, though resent at 20.
    REQUIRE(c.store(p, who, paris, "Sunny", 29));
    CHECK_FALSE(c.lookup(p, who, paris, 30));
    // A different result restarts the clock.
    REQUIRE(c.store(p, who, paris, "Sunny", 40));
    REQUIRE(c.store(p, who, paris, "Cloudy", 50));
    hit = c.lookup(p, who, paris, 55);
    REQUIRE(hit);
    CHECK(hit->result == "Cloudy");
    CHECK(hit->age_s == 5);
    CHECK(c.stats().entries == 1);
    CHECK(c.stats().stores == 5);
}

TEST_CASE("tool cache: session scope", "[reuse]") {
    ToolResultCache c;
    auto p = policy("weather", ToolScope::SESSION);
    CHECK_FALSE(c.store(p, caller("acme", 1), paris, "no session", 0));
    CHECK(c.stats().entries == 0);
    REQUIRE(c.store(p, caller("acme", 1, "s1", {"x"}), paris, "acme s1", 0));
    CHECK(c.lookup(p, caller("acme", 1, "s1"), paris, 1));  // labels do not matter
    CHECK_FALSE(c.lookup(p, caller("acme", 1, "s2"), paris, 1));
    CHECK_FALSE(c.lookup(p, caller("acme", 1), paris, 1));
    CHECK_FALSE(c.lookup(p, caller("beta", 1, "s1"), paris, 1));
    CHECK_FALSE(c.lookup(p, caller("acme", 2, "s1"), paris, 1));
    // Another scope's policy does not find it either.
    CHECK_FALSE(c.lookup(policy("weather", ToolScope::TENANT), caller("acme", 1, "s1", {"x"}), paris, 1));
    CHECK_FALSE(c.lookup(policy("weather", ToolScope::PUBLIC), caller("acme", 1, "s1"), paris, 1));
    CHECK_FALSE(c.lookup(policy("forecast", ToolScope::SESSION), caller("acme", 1, "s1"), paris, 1));
}

TEST_CASE("tool cache: tenant scope", "[reuse]") {
    ToolResultCache c;
    auto p = policy("weather", ToolScope::TENANT);
    REQUIRE(c.store(p, caller("acme", 1, "s1", {"team:a", "user:1"}), paris, "acme a+1", 0));
    auto hit = c.lookup(p, caller("acme", 1, "other", {"user:1", "team:a", "user:1"}), paris, 1);
    REQUIRE(hit);
    CHECK(hit->result == "acme a+1");
    CHECK_FALSE(c.lookup(p, caller("acme", 1, "s1", {"team:a"}), paris, 1));
    CHECK_FALSE(c.lookup(p, caller("acme", 1, "s1", {"team:a", "user:1", "user:2"}), paris, 1));
    CHECK_FALSE(c.lookup(p, caller("acme", 1, "s1"), paris, 1));
    CHECK_FALSE(c.lookup(p, caller("beta", 1, "s1", {"team:a", "user:1"}), paris, 1));
    // The same tenant name with another salt is another tenant.
    CHECK_FALSE(c.lookup(p, caller("acme", 2, "s1", {"team:a", "user:1"}), paris, 1));
    // No labels is one label set of its own.
    REQUIRE(c.store(p, caller("acme", 1), paris, "acme none", 0));
    hit = c.lookup(p, caller("acme", 1, "zz"), paris, 1);
    REQUIRE(hit);
    CHECK(hit->result == "acme none");
}

TEST_CASE("tool cache: public scope", "[reuse]") {
    ToolResultCache c;
    auto p = policy("fx_rate", ToolScope::PUBLIC, 60, {"pair"});
    REQUIRE(c.store(p, caller("acme", 1, "s1", {"x"}), json::parse(R"({"pair": "EURUSD", "note": "a"})"), "1.08", 0));
    for (const auto& who : {caller("beta", 9), caller("acme", 2, "s7", {"y"}), caller("", 0)}) {
        auto hit = c.lookup(p, who, json::parse(R"({"note": "b", "pair": "EURUSD"})"), 2);
        REQUIRE(hit);
        CHECK(hit->result == "1.08");
        CHECK(hit->scope == ToolScope::PUBLIC);
        CHECK(hit->age_s == 2);
    }
    CHECK_FALSE(c.lookup(p, caller("beta", 9), json::parse(R"({"pair": "EURGBP"})"), 2));
    CHECK_FALSE(c.lookup(p, caller("beta", 9), json::parse(R"({"note": "b"})"), 2));
    CHECK_FALSE(c.lookup(policy("fx_rate", ToolScope::TENANT, 60, {"pair"}), caller("acme", 1, "s1", {"x"}),
                         json::parse(R"({"pair": "EURUSD"})"), 2));
}

TEST_CASE("tool cache: end session", "[reuse]") {
    ToolResultCache c;
    auto s = policy("weather", ToolScope::SESSION);
    auto t = policy("weather", ToolScope::TENANT);
    REQUIRE(c.store(s, caller("acme", 1, "s1"), paris, "a s1", 0));
    REQUIRE(c.store(s, caller("acme", 2, "s1"), paris, "a salt2 s1", 0));
    REQUIRE(c.store(s, caller("acme", 1, "s2"), paris, "a s2", 0));
    REQUIRE(c.store(s, caller("beta", 1, "s1"), paris, "b s1", 0));
    REQUIRE(c.store(t, caller("acme", 1, "s1"), paris, "a tenant", 0));
    c.end_session("acme", "s1");
    CHECK(c.stats().entries == 3);
    CHECK_FALSE(c.lookup(s, caller("acme", 1, "s1"), paris, 1));
    CHECK_FALSE(c.lookup(s, caller("acme", 2, "s1"), paris, 1));
    CHECK(c.lookup(s, caller("acme", 1, "s2"), paris, 1));
    CHECK(c.lookup(s, caller("beta", 1, "s1"), paris, 1));
    CHECK(c.lookup(t, caller("acme", 1, "s1"), paris, 1));
}

TEST_CASE("tool cache: result size bound", "[reuse]") {
    ToolCacheLimits lim;
    lim.max_result_bytes = 8;
    ToolResultCache c(lim);
    auto p = policy("weather", ToolScope::PUBLIC);
    CHECK_FALSE(c.store(p, caller("a", 1), paris, "123456789", 0));
    CHECK(c.stats().entries == 0);
    CHECK(c.stats().stores == 0);
    CHECK(c.store(p, caller("a", 1), paris, "12345678", 0));
    CHECK(c.stats().stores == 1);
}

TEST_CASE("tool cache: global lru bound", "[reuse]") {
    ToolCacheLimits lim;
    lim.max_entries = 3;
    ToolResultCache c(lim);
    auto p = policy("f", ToolScope::PUBLIC);
    auto arg = [](int i) { return json{{"i", i}}; };
    auto who = caller("a", 1);
    for (int i = 0; i < 3; i++) REQUIRE(c.store(p, who, arg(i), "r" + std::to_string(i), 0));
    REQUIRE(c.lookup(p, who, arg(0), 1));       // 0 is now the most recent; 1 the least
    REQUIRE(c.store(p, who, arg(2), "r2", 1));  // a re-store counts as a use: 1 is still the least
    REQUIRE(c.store(p, who, arg(3), "r3", 1));
    CHECK(c.stats().entries == 3);
    CHECK(c.stats().evicted == 1);
    CHECK_FALSE(c.lookup(p, who, arg(1), 1));
    CHECK(c.lookup(p, who, arg(0), 1));
    CHECK(c.lookup(p, who, arg(2), 1));
    CHECK(c.lookup(p, who, arg(3), 1));
}

TEST_CASE("tool cache: per tenant lru bound", "[reuse]") {
    ToolCacheLimits lim;
    lim.max_entries_per_tenant = 2;
    ToolResultCache c(lim);
    auto s = policy("f", ToolScope::SESSION);
    auto t = policy("f", ToolScope::TENANT);
    auto pub = policy("f", ToolScope::PUBLIC);
    auto arg = [](int i) { return json{{"i", i}}; };
    auto a = caller("a", 1, "s1"), b = caller("b", 1, "s1");
    REQUIRE(c.store(s, a, arg(0), "a0", 0));
    REQUIRE(c.store(s, b, arg(0), "b0", 0));
    REQUIRE(c.store(pub, a, arg(0), "p0", 0));
    REQUIRE(c.store(pub, a, arg(1), "p1", 0));
    REQUIRE(c.store(t, a, arg(1), "a1", 0));
    CHECK(c.stats().evicted == 0);  // public entries are nobody's
    REQUIRE(c.store(s, a, arg(2), "a2", 0));
    CHECK(c.stats().evicted == 1);
    CHECK(c.stats().entries == 5);
    CHECK_FALSE(c.lookup(s, a, arg(0), 1));  // a's least recently used
    CHECK(c.lookup(t, a, arg(1), 1));
    CHECK(c.lookup(s, a, arg(2), 1));
    CHECK(c.lookup(s, b, arg(0), 1));  // b's untouched
    CHECK(c.lookup(pub, b, arg(0), 1));
    CHECK(c.lookup(pub, b, arg(1), 1));
}

// Random stores, lookups, time steps and session ends against a model written from the scope rules
// alone (a list of records searched linearly). The bounds are large enough that nothing is evicted,
// so the model is exact.
TEST_CASE("tool cache: property vs model", "[reuse][property]") {
    const std::vector<std::string> tenants = {"t0", "t1", "t2"};
    const std::vector<uint64_t> salts = {11, 22};
    const std::vector<std::string> sessions = {"", "s1", "s2"};
    const std::vector<std::string> label_pool = {"x", "y"};
    const std::vector<ToolScope> scopes = {ToolScope::SESSION, ToolScope::TENANT, ToolScope::PUBLIC};
    struct Rec {
        std::string tenant;
        uint64_t salt;
        std::string session;
        std::set<std::string> labels;
        ToolScope scope;
        std::string tool;
        json args;
        std::string result;
        double stored_at;
    };
    // "weather" is keyed by its "city" field; "search" by all its arguments.
    auto same_call = [](const Rec& r, const std::string& tool, const json& args) {
        if (r.tool != tool) return false;
        return tool == "weather" ? r.args.at("city") == args.at("city") : r.args == args;
    };
    auto in_scope = [](const Rec& r, ToolScope scope, const ToolCaller& who) {
        if (r.scope != scope) return false;
        std::set<std::string> labels(who.labels.begin(), who.labels.end());
        switch (scope) {
            case ToolScope::SESSION:
                return r.tenant == who.tenant && r.salt == who.salt && !who.session.empty() && r.session == who.session;
            case ToolScope::TENANT: return r.tenant == who.tenant && r.salt == who.salt && r.labels == labels;
            case ToolScope::PUBLIC: return true;
        }
        return false;
    };
    // A result names who stored it, so that a hit's owner is checked from the result itself.
    auto owner_tag = [](ToolScope scope, const ToolCaller& who) {
        std::set<std::string> labels(who.labels.begin(), who.labels.end());
        std::string l;
        for (const auto& x : labels) l += x + ",";
        switch (scope) {
            case ToolScope::SESSION:
                return "S|" + who.tenant + "|" + std::to_string(who.salt) + "|" + who.session + "|";
            case ToolScope::TENANT: return "T|" + who.tenant + "|" + std::to_string(who.salt) + "|" + l + "|";
            case ToolScope::PUBLIC: return std::string("P|");
        }
        return std::string();
    };

    for (uint32_t seed = 1; seed <= 20; seed++) {
        CAPTURE(seed);
        std::mt19937 rng(seed * 7919);
        auto pick = [&](size_t n) { return (size_t)std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
        auto random_caller = [&] {
            ToolCaller w{tenants[pick(3)], salts[pick(2)], sessions[pick(3)], {}};
            for (size_t i = 0, n = pick(4); i < n; i++) w.labels.push_back(label_pool[pick(2)]);  // repeats, any order
            return w;
        };
        // The arguments as text with the keys in a random order (and sometimes without the key field).
        auto random_args = [&](const std::string& tool) {
            std::vector<std::string> fields;
            if (tool == "weather") {
                if (pick(20)) fields.push_back("\"city\": \"" + std::string(pick(2) ? "Paris" : "Oslo") + "\"");
                fields.push_back("\"units\": \"" + std::string(pick(2) ? "c" : "f") + "\"");
            } else {
                fields.push_back("\"q\": \"" + std::string(pick(2) ? "cats" : "dogs") + "\"");
                std::vector<std::string> inner = {"\"n\": " + std::to_string(pick(2)), "\"lang\": \"en\""};
                std::shuffle(inner.begin(), inner.end(), rng);
                fields.push_back("\"opts\": {" + inner[0] + ", " + inner[1] + "}");
            }
            std::shuffle(fields.begin(), fields.end(), rng);
            std::string text = "{";
            for (size_t i = 0; i < fields.size(); i++) text += (i ? ", " : "") + fields[i];
            return json::parse(text + "}");
        };

        ToolCacheLimits lim;
        lim.max_entries = 1 << 20;
        lim.max_entries_per_tenant = 1 << 20;
        ToolResultCache c(lim);
        std::vector<Rec> model;
        double now = 0;
        uint64_t hits = 0, stale_refused = 0;
        for (int op = 0; op < 2000; op++) {
            CAPTURE(op);
            const size_t kind = pick(20);
            const ToolCaller who = random_caller();
            const ToolScope scope = scopes[pick(3)];
            const std::string tool = pick(2) ? "weather" : "search";
            const ToolCachePolicy p =
                policy(tool, scope, pick(2) ? 5 : 10,
                       tool == "weather" ? std::vector<std::string>{"city"} : std::vector<std::string>{});
            const json args = random_args(tool);
            const bool keyable = args.contains(tool == "weather" ? "city" : "q") &&
                                 !(scope == ToolScope::SESSION && who.session.empty());
            auto found = std::find_if(model.begin(), model.end(), [&](const Rec& r) {
                return keyable && same_call(r, tool, args) && in_scope(r, scope, who);
            });
            if (kind < 8) {  // store
                const std::string result = owner_tag(scope, who) + tool + "#" + std::to_string(pick(2));
                const bool stored = c.store(p, who, args, result, now);
                CHECK(stored == keyable);
                if (!keyable) continue;
                if (found == model.end()) {
                    model.push_back(Rec{who.tenant, who.salt, who.session,
                                        std::set<std::string>(who.labels.begin(), who.labels.end()), scope, tool, args,
                                        result, now});
                } else if (found->result != result) {
                    found->result = result;
                    found->stored_at = now;
                }
            } else if (kind < 16) {  // lookup
                bool stale = true;
                auto hit = c.lookup(p, who, args, now, &stale);
                if (found == model.end()) {
                    CHECK_FALSE(hit);
                    CHECK_FALSE(stale);
                } else if (now - found->stored_at >= p.ttl_s) {
                    CHECK_FALSE(hit);
                    CHECK(stale);
                    stale_refused++;
                    model.erase(found);
                } else {
                    REQUIRE(hit);
                    CHECK_FALSE(stale);
                    CHECK(hit->result == found->result);
                    CHECK(hit->age_s == now - found->stored_at);
                    CHECK(hit->scope == scope);
                    hits++;
                }
                if (hit) {
                    // The key property, read from the result alone: stored by someone of the caller's scope.
                    const std::string want = owner_tag(scope, who) + tool + "#";
                    CHECK(hit->result.compare(0, want.size(), want) == 0);
                }
            } else if (kind < 19) {  // time passes
                now += std::vector<double>{0.5, 1, 2.5, 5, 11}[pick(5)];
            } else {  // a conversation ends
                c.end_session(who.tenant, who.session);
                model.erase(std::remove_if(model.begin(), model.end(),
                                           [&](const Rec& r) {
                                               return r.scope == ToolScope::SESSION && r.tenant == who.tenant &&
                                                      r.session == who.session;
                                           }),
                            model.end());
            }
            CHECK(c.stats().entries == model.size());
        }
        CHECK(c.stats().hits == hits);
        CHECK(c.stats().stale_refused == stale_refused);
        CHECK(c.stats().evicted == 0);
    }
}
