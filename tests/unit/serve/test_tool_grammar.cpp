// The tool-call grammar (tool_choice required / a named function): random walks over the grammar's
// bytes give outputs that the server's own parser (parse_tool_calls) reads as exactly one call,
// whose arguments parse and pass checks written here from the tools' parameters, for every format.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <climits>
#include <random>
#include <set>
#include <regex>
#include <string>

#include "grammar/grammar.h"
#include "serve/tool_calls.h"

using namespace steward;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

const ojson k_tools = ojson::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "city":{"type":"string","maxLength":12},"unit":{"enum":["c","f"]},"days":{"type":"integer","minimum":1,"maximum":14}},
     "required":["city","days"]}}},
  {"type":"function","function":{"name":"set_alarm","parameters":{"type":"object","properties":{
     "hour":{"type":"integer","minimum":0,"maximum":23},"label":{"type":"string","pattern":"^[a-z ]{1,10}$"}},
     "required":["hour"],"additionalProperties":false}}},
  {"type":"function","function":{"name":"ping"}}
])");

// The checks of each tool's parameters, written out by hand (independent of the grammar compiler).
bool valid_args(const std::string& name, const json& a) {
    if (!a.is_object()) return false;
    if (name == "get_weather") {
        for (auto it = a.begin(); it != a.end(); ++it)
            if (it.key() != "city" && it.key() != "unit" && it.key() != "days") return false;
        if (!a.contains("city") || !a["city"].is_string()) return false;
        size_t n = 0;
        for (unsigned char c : a["city"].get<std::string>()) n += (c & 0xC0) != 0x80;
        if (n > 12) return false;
        if (a.contains("unit") && a["unit"] != "c" && a["unit"] != "f") return false;
        return a.contains("days") && a["days"].is_number_integer() && a["days"].get<int64_t>() >= 1 &&
               a["days"].get<int64_t>() <= 14;
    }
    if (name == "set_alarm") {
        for (auto it = a.begin(); it != a.end(); ++it)
            if (it.key() != "hour" && it.key() != "label") return false;
        if (!a.contains("hour") || !a["hour"].is_number_integer() || a["hour"].get<int64_t>() < 0 || a["hour"].get<int64_t>() > 23)
            return false;
        return !a.contains("label") ||
               (a["label"].is_string() && std::regex_search(a["label"].get<std::string>(), std::regex("^[a-z ]{1,10}$")));
    }
    if (name == "ping") return a.empty();
    return false;
}

// Random printable bytes the grammar allows; after `wander` bytes, ones that leave the shortest
// stack (closing strings and objects), until the grammar may end.
std::string byte_walk(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng, int wander) {
    GrammarMatcher m(g);
    std::string out;
    for (int step = 0; step < 3000; ++step) {
        if (m.is_accepting() && (step >= wander || rng() % 8 == 0)) return out;
        std::vector<char> ok;
        long best = LONG_MAX;
        std::vector<char> closing;
        for (int c = 0x0A; c < 0x7F; ++c) {
            if (c > 0x0A && c < 0x20) continue;
            GrammarMatcher f = m.fork();
            if (!f.accept_bytes(std::string(1, (char)c))) continue;
            ok.push_back((char)c);
            long depth = LONG_MAX - 1;
            const StackSet& st = f.state();
            for (size_t i = 0; i < st.size(); ++i) depth = std::min(depth, (long)(st.offs[i + 1] - st.offs[i]));
            if (depth < best) best = depth, closing.clear();
            if (depth == best) closing.push_back((char)c);
        }
        if (ok.empty() && m.is_accepting()) return out;  // the call is complete: nothing may follow
        REQUIRE_FALSE(ok.empty());
        const char c = step >= wander ? closing[rng() % closing.size()] : ok[rng() % ok.size()];
        REQUIRE(m.accept_bytes(std::string(1, c)));
        out += c;
    }
    FAIL("the walk did not end in 3000 bytes: " << out.substr(0, 300));
    return out;
}

}  // namespace

TEST_CASE("tool-call grammars: every output is one call the server's parser extracts, with valid arguments", "[tools][grammar]") {
    for (ToolCallFormat f : {ToolCallFormat::hermes, ToolCallFormat::mistral, ToolCallFormat::llama3_json}) {
        for (const char* only : {"", "set_alarm"}) {
            INFO(tool_call_format_name(f) << " only=" << only);
            auto text = tool_call_gbnf(f, k_tools, only);
            if (!text) FAIL(text.error().message);
            auto g = CompiledGrammar::from_gbnf(*text);
            if (!g) FAIL(g.error().message << "\n" << *text);
            std::mt19937 rng(17);
            std::set<std::string> names;
            for (int walk = 0; walk < 40; ++walk) {
                const std::string out = byte_walk(*g, rng, 10 + walk * 3);
                INFO(out);
                const ParsedOutput p = parse_tool_calls(f, out, 1);
                REQUIRE(p.tool_calls.size() == 1);
                CHECK(p.content.empty());
                const ToolCall& c = p.tool_calls[0];
                names.insert(c.name);
                if (*only) CHECK(c.name == only);
                const json args = json::parse(c.arguments, nullptr, false);
                REQUIRE_FALSE(args.is_discarded());
                CHECK(valid_args(c.name, args));
            }
            CHECK(names.size() == (*only ? 1u : 3u));  // every tool is reachable
        }
    }
}

TEST_CASE("tool-call grammars refuse what they cannot enforce, naming the fix", "[tools][grammar]") {
    auto err = [](ToolCallFormat f, const ojson& tools, const char* only = "") {
        auto r = tool_call_gbnf(f, tools, only);
        REQUIRE_FALSE(r.ok());
        return r.error().message;
    };
    CHECK_THAT(err(ToolCallFormat::none, k_tools), Catch::Contains("tool_choice \"auto\""));
    CHECK_THAT(err(ToolCallFormat::hermes, k_tools, "nope"), Catch::Contains("no tool is named \"nope\""));
    CHECK_THAT(err(ToolCallFormat::hermes, ojson::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"string"}}}])")),
               Catch::Contains("tools[0].function.parameters must describe an object"));
    CHECK_THAT(err(ToolCallFormat::hermes, ojson::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"number","maximum":3}}}}}])")),
               Catch::Contains("tools[0].function.parameters: schema /properties/x/maximum"));
    CHECK_THAT(err(ToolCallFormat::mistral, ojson::parse(R"([{"type":"function","function":{}}])")),
               Catch::Contains("tools[0].function.name"));
}
