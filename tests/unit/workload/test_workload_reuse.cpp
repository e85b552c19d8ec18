// Tests for the workload's reuse fields (docs/workloads.md, docs/reuse.md): document header lines,
// a request's documents and documents_at, an agent turn's tool_call; their round trip, errors and
// placement in the prompt; the generator's rag bucket (Zipf popularity, positions) and agent tools
// (repeated calls, identical results); and the standard workload left byte for byte as it was.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "chi_square.h"
#include "workload/workload.h"

using namespace steward;

namespace {

const char* k_reuse_example =
    R"({"segment": "sys", "text": "you are a helpful model\n"})"
    "\n"
    R"({"document": "policy", "text": "refunds within 30 days", "version": 3})"
    "\n"
    R"({"segment": "sys-a", "text": "tenant a rules\n"})"
    "\n"
    R"({"document": "faq", "text": "open all week"})"
    "\n"
    R"({"arrival_ms": 0, "tenant": "a", "bucket": "rag", "segments": [{"shared": "sys"}, {"shared": "sys-a"}, {"text": "question: when?"}], "documents": ["policy", "faq"], "documents_at": 3, "max_tokens": 16})"
    "\n"
    R"({"arrival_ms": 1, "tenant": "a", "prompt": "what is open?", "documents": ["faq"], "max_tokens": 8})"
    "\n"
    R"({"arrival_ms": 2, "tenant": "a", "bucket": "agent", "session": "s1", "turn": 1, "prompt": "task: weather", "max_tokens": 8, "tools": true, "tool_pause_ms": 100})"
    "\n"
    R"({"arrival_ms": 3, "tenant": "a", "bucket": "agent", "session": "s1", "turn": 2, "tool_call": {"tool": "get_weather", "arguments": {"units": "c", "city": "Paris"}, "result": "tool result: sunny\n", "ttl_s": 60}, "max_tokens": 8, "tools": true})"
    "\n"
    R"({"arrival_ms": 4, "tenant": "a", "bucket": "agent", "session": "s1", "turn": 3, "tool_call": {"tool": "ping", "result": "pong"}, "max_tokens": 8})"
    "\n";

std::string block(const std::string& id, int version, const std::string& text) {
    return "<document id=\"" + id + "\" version=\"" + std::to_string(version) + "\">\n" + text + "\n</document>";
}

// The error of parsing `line` after a segment line and two document lines, or "" when it parses.
std::string error_of(const std::string& line) {
    std::string text = R"({"segment": "sys", "text": "s"})"
                       "\n"
                       R"({"document": "d1", "text": "one"})"
                       "\n"
                       R"({"document": "d2", "text": "two"})"
                       "\n"
                       R"({"arrival_ms": 0, "session": "s", "turn": 1, "prompt": "a", "max_tokens": 4})"
                       "\n" +
                       line + "\n";
    auto w = parse_workload(text);
    return w ? std::string() : w.error().message;
}

}  // namespace

TEST_CASE("documents and tool calls parse and round-trip", "[workload][reuse]") {
    auto w = parse_workload(k_reuse_example);
    REQUIRE(w.ok());
    REQUIRE(w->documents.size() == 2);
    CHECK(w->documents[0] == WorkloadDocument{"policy", "refunds within 30 days", 3});
    CHECK(w->documents[1] == WorkloadDocument{"faq", "open all week", 1});
    CHECK(w->segments.size() == 2);
    REQUIRE(w->requests.size() == 5);

    const WorkloadRequest& rag = w->requests[0];
    CHECK(rag.documents == std::vector<std::string>{"policy", "faq"});
    CHECK(rag.documents_at == 3);
    CHECK(w->requests[1].documents_at == 0);

    const WorkloadRequest& t2 = w->requests[3];
    REQUIRE(t2.tool_call);
    CHECK(t2.tool_call->tool == "get_weather");
    CHECK(t2.tool_call->arguments == R"({"city":"Paris","units":"c"})");  // keys sorted, no whitespace
    CHECK(t2.tool_call->ttl_s == 60.0);
    CHECK(t2.prompt_kind == PromptKind::TEXT);
    CHECK(t2.prompt == "tool result: sunny\n");  // the result is the turn's content
    const WorkloadRequest& t3 = w->requests[4];
    REQUIRE(t3.tool_call);
    CHECK(t3.tool_call->arguments == "{}");
    CHECK(t3.tool_call->ttl_s == 600.0);
    CHECK(t3.prompt == "pong");
    CHECK(!w->requests[2].tool_call);

    const std::string text = write_workload(*w);
    auto back = parse_workload(text);
    REQUIRE(back.ok());
    CHECK(*back == *w);
    CHECK(write_workload(*back) == text);
    // Segment lines, then document lines, then requests; defaults left out.
    CHECK(text.find("{\"segment\":\"sys-a\"") < text.find("{\"document\":\"policy\""));
    CHECK(text.find("{\"document\":\"faq\",\"text\":\"open all week\"}\n") != std::string::npos);
    CHECK(text.find("\"version\":3") != std::string::npos);
    CHECK(text.find("\"tool_call\":{\"tool\":\"ping\",\"arguments\":{},\"result\":\"pong\"}") != std::string::npos);
    CHECK(text.find("\"prompt\":\"pong\"") == std::string::npos);
}

TEST_CASE("documents go sorted after the shared segments or where documents_at says", "[workload][reuse]") {
    auto w = parse_workload(k_reuse_example);
    REQUIRE(w.ok());
    const std::string sys = "you are a helpful model\n", sys_a = "tenant a rules\n", q = "question: when?";
    const std::string faq = block("faq", 1, "open all week"), policy = block("policy", 3, "refunds within 30 days");
    WorkloadRequest r = w->requests[0];

    // Reuse on: sorted by name, right after the leading shared segments, whatever documents_at says.
    const std::string canonical_block = faq + "\n" + policy + "\n";
    for (int at : {0, 1, 3}) {
        r.documents_at = at;
        const PlacedPrompt p = w->place_prompt(r, DocumentPlacement::CANONICAL);
        CHECK(p.text == sys + sys_a + canonical_block + q);
        CHECK(p.text.substr(p.doc_begin, p.doc_end - p.doc_begin) == canonical_block);
        CHECK(w->prompt_text(r) == p.text);
    }
    // Reuse off: in the listed order, before segments entry documents_at (0: the canonical place;
    // past the end: after the last entry, on a line of its own).
    const std::string listed = policy + "\n" + faq + "\n";
    const std::map<int, std::string> want = {{0, sys + sys_a + listed + q},
                                             {1, sys + listed + sys_a + q},
                                             {2, sys + sys_a + listed + q},
                                             {3, sys + sys_a + q + "\n" + listed},
                                             {99, sys + sys_a + q + "\n" + listed}};
    for (const auto& [at, text] : want) {
        r.documents_at = at;
        const PlacedPrompt p = w->place_prompt(r, DocumentPlacement::AS_LISTED);
        INFO("documents_at " << at);
        CHECK(p.text == text);
        CHECK(p.text.substr(p.doc_begin, p.doc_end - p.doc_begin) == listed);
    }

    // A text prompt: 0 before the text, >= 1 after it.
    WorkloadRequest t = w->requests[1];
    CHECK(w->prompt_text(t) == faq + "\nwhat is open?");
    t.documents_at = 1;
    CHECK(w->place_prompt(t, DocumentPlacement::AS_LISTED).text == "what is open?\n" + faq + "\n");
    CHECK(w->place_prompt(t, DocumentPlacement::CANONICAL).text == faq + "\nwhat is open?");

    // Without documents: the prompt as before, an empty span.
    const PlacedPrompt none = w->place_prompt(w->requests[2], DocumentPlacement::AS_LISTED);
    CHECK(none.text == "task: weather");
    CHECK(none.doc_begin == none.doc_end);
}

TEST_CASE("bad documents and tool calls give an error naming the line, the field and the fix", "[workload][reuse]") {
    struct Case {
        const char* line;
        std::vector<const char*> expect;
    };
    const std::vector<Case> cases = {
        {R"({"arrival_ms": 0, "prompt": "a", "documents": ["d3"], "max_tokens": 4})",
         {"documents[0] names document \"d3\"", "not defined", "{\"document\": \"d3\""}},
        {R"({"arrival_ms": 0, "prompt": "a", "documents": ["d1", "d1"], "max_tokens": 4})", {"lists \"d1\" twice"}},
        {R"({"arrival_ms": 0, "prompt": "a", "documents": [], "max_tokens": 4})", {"documents is []", "1 to 16"}},
        {R"({"arrival_ms": 0, "prompt": "a", "documents": "d1", "max_tokens": 4})", {"documents is \"d1\"", "array"}},
        {R"({"arrival_ms": 0, "prompt": "a", "documents": [7], "max_tokens": 4})", {"documents[0] is 7"}},
        {R"({"arrival_ms": 0, "prompt": "a", "documents": ["d1","d1","d1","d1","d1","d1","d1","d1","d1","d1","d1","d1","d1","d1","d1","d1","d1"], "max_tokens": 4})",
         {"1 to 16"}},
        {R"({"arrival_ms": 0, "prompt_ids": [1], "documents": ["d1"], "max_tokens": 4})", {"with prompt_ids", "prompt or segments"}},
        {R"({"arrival_ms": 0, "prompt": "a", "documents": ["d1"], "documents_at": -1, "max_tokens": 4})",
         {"documents_at is -1", "integer >= 0"}},
        {R"({"arrival_ms": 0, "prompt": "a", "documents": ["d1"], "documents_at": 1.5, "max_tokens": 4})", {"documents_at is 1.5"}},
        {R"({"arrival_ms": 0, "prompt": "a", "documents_at": 1, "max_tokens": 4})", {"documents_at is given without documents"}},
        {R"({"arrival_ms": 0, "session": "s", "turn": 2, "tool_call": "get_weather", "max_tokens": 4})",
         {"tool_call is \"get_weather\"", "an object"}},
        {R"({"arrival_ms": 0, "session": "s", "turn": 2, "tool_call": {"result": "r"}, "max_tokens": 4})",
         {"tool_call.tool is missing"}},
        {R"({"arrival_ms": 0, "session": "s", "turn": 2, "tool_call": {"tool": "", "result": "r"}, "max_tokens": 4})",
         {"tool_call.tool is \"\""}},
        {R"({"arrival_ms": 0, "session": "s", "turn": 2, "tool_call": {"tool": "t"}, "max_tokens": 4})",
         {"tool_call.result is missing", "the turn's new content"}},
        {R"({"arrival_ms": 0, "session": "s", "turn": 2, "tool_call": {"tool": "t", "result": 3}, "max_tokens": 4})",
         {"tool_call.result is 3"}},
        {R"({"arrival_ms": 0, "session": "s", "turn": 2, "tool_call": {"tool": "t", "arguments": [1], "result": "r"}, "max_tokens": 4})",
         {"tool_call.arguments is [1]", "JSON object"}},
        {R"({"arrival_ms": 0, "session": "s", "turn": 2, "tool_call": {"tool": "t", "result": "r", "ttl_s": 0}, "max_tokens": 4})",
         {"tool_call.ttl_s is 0", "(0, 1e9]"}},
        {R"({"arrival_ms": 0, "session": "s", "turn": 2, "tool_call": {"tool": "t", "result": "r"}, "prompt": "p", "max_tokens": 4})",
         {"tool_call is given with a prompt", "drop"}},
        {R"({"arrival_ms": 0, "tool_call": {"tool": "t", "result": "r"}, "max_tokens": 4})", {"not a later turn of a session"}},
        {R"({"document": "d1", "text": "again"})", {"document \"d1\" is defined twice", "unique name"}},
        {R"({"document": "a b", "text": "x"})", {"document is \"a b\"", "letters, digits"}},
        {R"({"document": "d9", "text": ""})", {"text is \"\""}},
        {R"({"document": "d9", "text": "x", "version": 0})", {"version is 0", "integer >= 1"}},
    };
    for (const Case& c : cases) {
        const std::string e = error_of(c.line);
        INFO("line: " << c.line << "\nerror: " << e);
        REQUIRE(!e.empty());
        // A document line after the request line is refused for that before its own checks.
        const bool doc_line = std::string(c.line).rfind("{\"document\"", 0) == 0;
        CHECK(e.rfind("workload line 5: ", 0) == 0);
        if (!doc_line)
            for (const char* s : c.expect) CHECK(e.find(s) != std::string::npos);
    }
    // Document lines: at the top they are checked on their own; after a request they are refused.
    for (const Case& c : cases) {
        if (std::string(c.line).rfind("{\"document\"", 0) != 0) continue;
        const std::string text = std::string(R"({"document": "d1", "text": "one"})") + "\n" + c.line + "\n";
        auto w = parse_workload(text);
        INFO(c.line);
        REQUIRE(!w.ok());
        CHECK(w.error().message.rfind("workload line 2: ", 0) == 0);
        for (const char* s : c.expect) CHECK(w.error().message.find(s) != std::string::npos);
    }
    CHECK(error_of(R"({"document": "d9", "text": "x"})").find("move document lines to the top") != std::string::npos);
    // A tool call on a session's first turn is refused too.
    auto first = parse_workload(R"({"arrival_ms": 0, "session": "s", "turn": 1, "tool_call": {"tool": "t", "result": "r"}, "max_tokens": 4})");
    REQUIRE(!first.ok());
    CHECK(first.error().message.find("not a later turn of a session") != std::string::npos);
}

// The new parameters default to off: the standard workload carries no documents and no tool calls,
// and naming rag at weight 0 or agent_tools = false gives the very same text as leaving them out.
TEST_CASE("the standard workload has no documents or tool calls unless asked", "[workload][reuse]") {
    for (uint64_t seed : {0ull, 1ull, 7ull}) {
        WorkloadGenParams p;
        p.n_requests = 200;
        p.seed = seed;
        const Workload w = generate_workload(p);
        INFO("seed " << seed);
        CHECK(w.documents.empty());
        for (const WorkloadRequest& r : w.requests) {
            CHECK(r.documents.empty());
            CHECK(!r.tool_call);
            CHECK(r.bucket != "rag");
        }
        WorkloadGenParams q = p;
        q.mix["rag"] = 0.0;  // named at 0: the same as not named
        q.agent_tools = false;
        CHECK(write_workload(generate_workload(q)) == write_workload(w));
    }
}

TEST_CASE("rag documents follow the Zipf popularity and cover every position", "[workload][reuse]") {
    WorkloadGenParams p;
    p.n_requests = 12000;
    p.seed = 21;
    p.scale = 0.1;  // lengths do not matter here
    p.mix = {{"short_qa", 0}, {"long_doc", 0}, {"long_output", 0}, {"agent", 0}, {"high_temp", 0}, {"structured", 0}, {"rag", 1}};
    REQUIRE(check_workload_gen(p));
    const Workload w = generate_workload(p);
    REQUIRE(w.documents.size() == 12);
    for (int d = 0; d < 12; ++d) CHECK(w.documents[(size_t)d].name == "doc-" + std::to_string(d));

    std::vector<int64_t> first(12, 0);
    std::map<int, int> at;
    std::map<size_t, int> n_docs;
    for (const WorkloadRequest& r : w.requests) {
        REQUIRE(r.bucket == "rag");
        REQUIRE(r.documents.size() >= 2);
        REQUIRE(r.documents.size() <= 3);
        ++n_docs[r.documents.size()];
        CHECK(std::set<std::string>(r.documents.begin(), r.documents.end()).size() == r.documents.size());
        ++first[(size_t)std::stoi(r.documents[0].substr(4))];
        ++at[r.documents_at];
        CHECK(r.temperature == 0.0);
        REQUIRE(r.segments.size() == 3);
        CHECK(r.segments[0].shared == "sys-public");
        CHECK(r.segments[1].shared == "sys-" + r.tenant);
        CHECK(r.segments[2].shared.empty());
    }
    // The first draw of each request is exactly Zipf(1.1) over the ranks doc-0..doc-11.
    std::vector<double> zipf(12), uniform(12, 1.0 / 12);
    double h = 0;
    for (int k = 1; k <= 12; ++k) h += zipf[(size_t)k - 1] = 1.0 / std::pow(k, 1.1);
    for (double& z : zipf) z /= h;
    const auto fit = steward_test::chi_square(first, zipf);
    INFO("chi-square " << fit.statistic << " df " << fit.df << " p " << fit.p_value);
    CHECK(fit.p_value > 1e-3);
    CHECK(steward_test::chi_square(first, uniform).p_value < 1e-9);  // the test has the power to tell
    CHECK(first[0] > 3 * first[5]);
    // Positions 0 (canonical), 1, 2, 3 about equally often; 2 and 3 documents about equally often.
    REQUIRE(at.size() == 4);
    for (int k = 0; k < 4; ++k) CHECK(std::abs(at[k] - 3000) < 4 * std::sqrt(12000 * 0.25 * 0.75));
    CHECK(std::abs(n_docs[2] - 6000) < 4 * std::sqrt(12000 * 0.25));

    // Shapes at scale 1, and the round trip of a mixed workload.
    WorkloadGenParams q;
    q.n_requests = 200;
    q.seed = 5;
    q.mix = {{"rag", 1.0}};
    const Workload m = generate_workload(q);
    for (const WorkloadDocument& d : m.documents) {
        CHECK(count_words(d.text) >= 192);
        CHECK(count_words(d.text) <= 320);
    }
    int n_rag = 0;
    for (const WorkloadRequest& r : m.requests) {
        if (r.bucket != "rag") continue;
        ++n_rag;
        const int words = count_words(r.segments[2].text);
        CHECK(words >= 16);
        CHECK(words <= 32);
        CHECK(r.max_tokens >= 16);
        CHECK(r.max_tokens <= 32);
        CHECK(r.public_prefix == "sys-public");
    }
    CHECK(n_rag > 10);
    auto back = parse_workload(write_workload(m));
    REQUIRE(back.ok());
    CHECK(*back == m);
    CHECK(parse_workload_mix("rag=1,agent=1").value() == std::map<std::string, double>{{"rag", 1.0}, {"agent", 1.0}});
}

TEST_CASE("agent tools repeat idempotent calls whose results are identical", "[workload][reuse]") {
    WorkloadGenParams p;
    p.n_requests = 600;
    p.seed = 8;
    p.mix = {{"agent", 1.0}};
    p.agent_tools = true;
    const Workload w = generate_workload(p);
    std::map<std::pair<std::string, std::string>, std::string> result_of;  // (tool, arguments) -> result
    std::map<std::tuple<std::string, std::string, std::string>, std::set<std::string>> sessions_of;  // (tenant, tool, args)
    int n_calls = 0, n_repeats = 0;
    for (const WorkloadRequest& r : w.requests) {
        if (r.bucket != "agent") continue;
        if (r.turn == 1) {
            CHECK(!r.tool_call);
            continue;
        }
        REQUIRE(r.tool_call);
        ++n_calls;
        CHECK(r.prompt_kind == PromptKind::TEXT);
        const int words = count_words(r.prompt);
        CHECK(words >= 32);
        CHECK(words <= 96);
        const auto key = std::make_pair(r.tool_call->tool, r.tool_call->arguments);
        auto [it, fresh] = result_of.emplace(key, r.prompt);
        if (!fresh) {
            ++n_repeats;
            CHECK(it->second == r.prompt);  // the same call, the same result
        }
        sessions_of[{r.tenant, r.tool_call->tool, r.tool_call->arguments}].insert(r.session);
    }
    CHECK(n_calls > 200);
    CHECK(n_repeats > n_calls / 2);
    CHECK(result_of.size() <= 24);
    // Different calls, different results.
    std::set<std::string> distinct;
    for (const auto& [_, res] : result_of) distinct.insert(res);
    CHECK(distinct.size() == result_of.size());
    // Calls repeat across the sessions of a tenant (what a tenant-scoped cache can reuse).
    int shared_across_sessions = 0;
    for (const auto& [_, s] : sessions_of) shared_across_sessions += s.size() >= 2;
    CHECK(shared_across_sessions >= 5);
    // The round trip keeps the calls.
    auto back = parse_workload(write_workload(w));
    REQUIRE(back.ok());
    CHECK(*back == w);
    // Deterministic, and the same seed without agent_tools has no tool calls.
    CHECK(generate_workload(p) == w);
    p.agent_tools = false;
    for (const WorkloadRequest& r : generate_workload(p).requests) CHECK(!r.tool_call);
}

namespace {
// Words of a text (split at spaces and newlines).
std::vector<std::string> split_words(const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
        if (c == ' ' || c == '\n') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}
// Whether b is a with at most one word replaced (the same number of words).
bool within_one_word(const std::string& a, const std::string& b) {
    const auto wa = split_words(a), wb = split_words(b);
    if (wa.size() != wb.size()) return false;
    int diff = 0;
    for (size_t i = 0; i < wa.size(); i++) diff += wa[i] != wb[i];
    return diff <= 1;
}
}  // namespace

TEST_CASE("agent repetition: a share of sessions repeats an earlier session of the same tenant, task and tool "
          "results, never another tenant's",
          "[workload][reuse]") {
    for (double share : {0.0, 0.5, 1.0}) {
        WorkloadGenParams p;
        p.n_requests = 800;
        p.seed = 21;
        p.mix = {{"agent", 1.0}};
        p.agent_turns = 3;
        p.agent_repeat = share;
        const Workload w = generate_workload(p);
        // Each session's task (turn 1's last segment) and its later turns' prompts, by hand.
        struct S {
            std::string tenant, task;
            std::vector<std::string> later;
        };
        std::map<std::string, S> by_session;
        std::vector<std::string> order;
        for (const WorkloadRequest& r : w.requests) {
            if (r.bucket != "agent") continue;
            if (r.turn == 1) {
                REQUIRE(r.segments.size() == 2);
                by_session[r.session] = {r.tenant, r.segments[1].text, {}};
                order.push_back(r.session);
            } else {
                by_session[r.session].later.push_back(r.prompt);
            }
        }
        int n_with_earlier = 0, n_repeating = 0, n_exact = 0, n_cross = 0;
        for (size_t i = 0; i < order.size(); i++) {
            const S& s = by_session[order[i]];
            bool has_earlier = false, repeats = false, exact = false, cross = false;
            for (size_t j = 0; j < i; j++) {
                const S& e = by_session[order[j]];
                const bool same_turns = !s.later.empty() && !e.later.empty() && s.later[0] == e.later[0];
                if (e.tenant == s.tenant) {
                    has_earlier = true;
                    if (within_one_word(e.task, s.task) && same_turns) {
                        repeats = true;
                        exact = exact || e.task == s.task;
                    }
                } else if (within_one_word(e.task, s.task)) {
                    cross = true;
                }
            }
            n_with_earlier += has_earlier;
            n_repeating += repeats;
            n_exact += exact;
            n_cross += cross;
        }
        INFO("share " << share << ": " << n_repeating << " of " << n_with_earlier << " repeat, " << n_exact << " exactly");
        REQUIRE(n_with_earlier > 100);
        CHECK(n_cross == 0);  // a tenant never gets another tenant's task
        if (share == 0.0) {
            CHECK(n_repeating == 0);
        } else {
            // Binomial: the share of sessions with an earlier one of their tenant, within 4 sigma.
            const double n = n_with_earlier, sd = std::sqrt(n * share * (1 - share));
            CHECK(n_repeating >= share * n - 4 * sd - 1);
            CHECK(n_repeating <= share * n + 4 * sd + 1);
            // About half of the repeats are exact, the rest edited by one word.
            CHECK(n_exact > n_repeating / 4);
            CHECK(n_exact < n_repeating * 3 / 4 + 1);
        }
        CHECK(generate_workload(p) == w);
    }
    WorkloadGenParams std_p;
    std_p.n_requests = 300;
    WorkloadGenParams bad = std_p;
    bad.agent_repeat = 1.5;
    CHECK(!check_workload_gen(bad));
}
