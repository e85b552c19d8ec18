// Tests for runtime/workload: parsing every field, the write/parse round trip, an error naming the
// line for each kind of malformed line, and the generator's determinism, shapes and arrivals.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "workload/workload.h"

using namespace steward;

namespace {

const char* k_example =
    R"({"segment": "sys", "text": "you are a helpful model\n"})"
    "\n"
    R"({"segment": "doc-2", "text": "once upon a time there was a little dog\n"})"
    "\n"
    "\n"
    R"({"arrival_ms": 0, "tenant": "a", "bucket": "short_qa", "prompt": "what is a cat?", "max_tokens": 16})"
    "\n"
    R"({"arrival_ms": 12.5, "tenant": "b", "prompt_ids": [1, 2, 3], "max_tokens": 8, "temperature": 1.2, "top_p": 0.95, "seed": 18446744073709551615})"
    "\n"
    R"({"arrival_ms": 30, "tenant": "a", "segments": {"shared": "doc-2", "text": "question: who?"}, "max_tokens": 32, "future_field": [1]})"
    "\n"
    R"({"arrival_ms": 40, "tenant": "c", "bucket": "agent", "session": "s1", "turn": 1, "segments": [{"shared": "sys"}, {"text": "task: go"}], "max_tokens": 20, "tools": true, "tool_pause_ms": 120, "public_prefix": "sys"})"
    "\n"
    R"({"arrival_ms": 41, "tenant": "c", "bucket": "agent", "session": "s1", "turn": 2, "prompt": "tool result: ok", "max_tokens": 20, "tools": true})"
    "\n"
    R"({"arrival_ms": 50, "prompt": "give json", "max_tokens": 64, "response_format": "json"})"
    "\n";

// The error of parsing `body` after the example's two segment lines, or "" when it parses.
std::string error_of(const std::string& line) {
    std::string text = R"({"segment": "sys", "text": "s"})"
                       "\n" +
                       line + "\n";
    auto w = parse_workload(text);
    return w ? std::string() : w.error().message;
}

}  // namespace

TEST_CASE("a workload file with every field parses into the requests it describes", "[workload]") {
    auto w = parse_workload(k_example);
    REQUIRE(w.ok());
    REQUIRE(w->segments.size() == 2);
    CHECK(w->segments[1].name == "doc-2");
    REQUIRE(w->requests.size() == 6);

    const WorkloadRequest& r0 = w->requests[0];
    CHECK(r0.arrival_ms == 0.0);
    CHECK(r0.tenant == "a");
    CHECK(r0.bucket == "short_qa");
    CHECK(r0.prompt_kind == PromptKind::TEXT);
    CHECK(r0.prompt == "what is a cat?");
    CHECK(r0.max_tokens == 16);
    CHECK(r0.temperature == 0.0);
    CHECK(r0.top_p == 1.0);
    CHECK(!r0.seed);

    const WorkloadRequest& r1 = w->requests[1];
    CHECK(r1.arrival_ms == 12.5);
    CHECK(r1.prompt_kind == PromptKind::IDS);
    CHECK(r1.prompt_ids == std::vector<int32_t>{1, 2, 3});
    CHECK(r1.temperature == 1.2);
    CHECK(r1.top_p == 0.95);
    CHECK(*r1.seed == 18446744073709551615ull);
    CHECK(w->prompt_text(r1).empty());

    const WorkloadRequest& r2 = w->requests[2];  // a single segment object, an unknown field
    CHECK(r2.prompt_kind == PromptKind::SEGMENTS);
    REQUIRE(r2.segments.size() == 1);
    CHECK(r2.segments[0] == PromptPart{"doc-2", "question: who?"});
    CHECK(w->prompt_text(r2) == "once upon a time there was a little dog\nquestion: who?");

    const WorkloadRequest& r3 = w->requests[3];
    CHECK(r3.session == "s1");
    CHECK(r3.turn == 1);
    CHECK(r3.tools);
    CHECK(r3.tool_pause_ms == 120.0);
    CHECK(r3.public_prefix == "sys");
    CHECK(w->prompt_text(r3) == "you are a helpful model\ntask: go");
    CHECK(w->requests[4].turn == 2);

    const WorkloadRequest& r5 = w->requests[5];
    CHECK(r5.tenant == "default");
    CHECK(r5.response_json);
}

TEST_CASE("writing a workload and parsing it back gives the same workload", "[workload]") {
    auto w = parse_workload(k_example);
    REQUIRE(w.ok());
    std::string text = write_workload(*w);
    auto back = parse_workload(text);
    REQUIRE(back.ok());
    CHECK(*back == *w);
    CHECK(write_workload(*back) == text);

    // Through a file too.
    auto path = (std::filesystem::temp_directory_path() / "steward_test_workload.jsonl").string();
    REQUIRE(!write_workload_file(*w, path));
    auto from_file = read_workload_file(path);
    REQUIRE(from_file.ok());
    CHECK(*from_file == *w);
    std::filesystem::remove(path);
    auto missing = read_workload_file(path);
    REQUIRE(!missing.ok());
    CHECK(missing.error().message.find(path) != std::string::npos);
}

TEST_CASE("each malformed line gives an error naming the line, the field and the fix", "[workload]") {
    struct Case {
        const char* line;
        std::vector<const char*> expect;  // substrings of the message
    };
    const std::vector<Case> cases = {
        {R"({"arrival_ms": 0, "prompt": "hi", "max_tokens": 16)", {"not valid JSON", "one JSON object"}},
        {R"([1, 2])", {"not a JSON object"}},
        {R"({"arrival_ms": 0, "max_tokens": 16})", {"prompt is missing", "prompt_ids", "segments"}},
        {R"({"arrival_ms": 0, "prompt": "a", "prompt_ids": [1], "max_tokens": 16})", {"keep exactly one"}},
        {R"({"prompt": "a", "max_tokens": 16})", {"arrival_ms is missing"}},
        {R"({"arrival_ms": -5, "prompt": "a", "max_tokens": 16})", {"arrival_ms is -5", "in [0, 1e9]"}},
        {R"({"arrival_ms": "soon", "prompt": "a", "max_tokens": 16})", {"arrival_ms is \"soon\"", "a number"}},
        {R"({"arrival_ms": 0, "prompt": "a"})", {"max_tokens is missing"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": -3})", {"max_tokens is -3", "integer >= 1"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": "32"})", {"max_tokens is \"32\"", "integer >= 1"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 3.5})", {"max_tokens is 3.5"}},
        {R"({"arrival_ms": 0, "prompt": 7, "max_tokens": 4})", {"prompt is 7", "string"}},
        {R"({"arrival_ms": 0, "prompt_ids": [1, "x"], "max_tokens": 4})", {"prompt_ids[1]", "token id"}},
        {R"({"arrival_ms": 0, "prompt_ids": [-1], "max_tokens": 4})", {"prompt_ids[0] is -1"}},
        {R"({"arrival_ms": 0, "prompt_ids": "1 2", "max_tokens": 4})", {"prompt_ids is", "array"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "temperature": "hot"})", {"temperature is \"hot\""}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "top_p": 0})", {"top_p is 0", "(0, 1]"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "seed": -1})", {"seed is -1"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "tools": "yes"})", {"tools is \"yes\"", "true or false"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "response_format": "xml"})",
         {"response_format is \"xml\""}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "tool_pause_ms": -1})", {"tool_pause_ms is -1"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "tenant": ""})", {"tenant is \"\""}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "turn": 2})", {"turn is given without a session"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "session": "s"})", {"has no turn"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "session": "s", "turn": 0})", {"turn is 0"}},
        {R"({"arrival_ms": 0, "segments": {"shared": "doc-9", "text": "q"}, "max_tokens": 4})",
         {"segments[0].shared", "\"doc-9\"", "not defined", "header line"}},
        {R"({"arrival_ms": 0, "segments": [], "max_tokens": 4})", {"segments is []", "non-empty array"}},
        {R"({"arrival_ms": 0, "segments": [{"shared": "sys"}, {}], "max_tokens": 4})", {"segments[1] has neither"}},
        {R"({"arrival_ms": 0, "segments": [{"text": 3}], "max_tokens": 4})", {"segments[0].text is 3"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "public_prefix": "nope"})",
         {"public_prefix", "\"nope\"", "not defined"}},
        {R"({"arrival_ms": 0, "prompt": "a", "max_tokens": 4, "public_prefix": "sys"})", {"does not open with it"}},
        {R"({"segment": "sys", "text": "again"})", {"segment \"sys\" is defined twice"}},
        {R"({"segment": "x"})", {"text is missing"}},
    };
    for (const Case& c : cases) {
        std::string e = error_of(c.line);
        INFO("line: " << c.line << "\nerror: " << e);
        REQUIRE(!e.empty());
        CHECK(e.rfind("workload line 2: ", 0) == 0);
        for (const char* s : c.expect) CHECK(e.find(s) != std::string::npos);
    }

    // The line number counts blank lines, and a segment after a request is refused.
    auto late = parse_workload(
        "\n{\"arrival_ms\": 0, \"prompt\": \"a\", \"max_tokens\": 1}\n\n{\"segment\": \"s\", \"text\": \"t\"}\n");
    REQUIRE(!late.ok());
    CHECK(late.error().message.rfind("workload line 4: ", 0) == 0);
    CHECK(late.error().message.find("move segment lines to the top") != std::string::npos);
    CHECK(parse_workload("").ok());
    CHECK(parse_workload("{\"arrival_ms\": 0, \"prompt\": \"a\", \"max_tokens\": 1}\r\n").ok());
}

TEST_CASE("the generator is deterministic for a seed and differs across seeds", "[workload]") {
    WorkloadGenParams p;
    p.n_requests = 150;
    p.seed = 11;
    Workload a = generate_workload(p), b = generate_workload(p);
    CHECK(a == b);
    CHECK(write_workload(a) == write_workload(b));
    p.seed = 12;
    CHECK(!(generate_workload(p) == a));
}

TEST_CASE("a generated workload round-trips and every prompt resolves", "[workload]") {
    WorkloadGenParams p;
    p.n_requests = 300;
    p.seed = 3;
    Workload w = generate_workload(p);
    REQUIRE(w.requests.size() == 300);
    auto back = parse_workload(write_workload(w));
    REQUIRE(back.ok());
    CHECK(*back == w);
    for (const WorkloadRequest& r : w.requests) CHECK(!w.prompt_text(r).empty());
}

TEST_CASE("the generator covers every bucket, its tenants, and the declared-public prefix", "[workload]") {
    const std::set<std::string> buckets = {"short_qa", "long_doc", "long_output", "agent", "high_temp", "structured"};
    for (int n : {12, 200}) {
        for (uint64_t seed : {1, 2, 3}) {
            WorkloadGenParams p;
            p.n_requests = n;
            p.seed = seed;
            Workload w = generate_workload(p);
            std::set<std::string> seen;
            for (const WorkloadRequest& r : w.requests) seen.insert(r.bucket);
            INFO("n=" << n << " seed=" << seed);
            CHECK(seen == buckets);
        }
    }
    WorkloadGenParams p;
    p.n_requests = 400;
    p.n_tenants = 3;
    Workload w = generate_workload(p);
    std::map<std::string, int> tenants;
    int n_public = 0, n_volatile = 0;
    for (const WorkloadRequest& r : w.requests) {
        ++tenants[r.tenant];
        if (r.turn <= 1) {
            CHECK(r.public_prefix == "sys-public");
            REQUIRE(!r.segments.empty());
            CHECK(r.segments[0].shared == "sys-public");
            ++n_public;
            if (r.segments[0].text.rfind("request ", 0) == 0) ++n_volatile;
        }
    }
    CHECK(tenants.size() == 3);
    CHECK(tenants.count("tenant-d") == 0);
    CHECK(n_volatile > 0);
    CHECK(n_volatile < n_public / 4);
}

TEST_CASE("generated lengths follow the bucket shapes and scale with the scale factor", "[workload]") {
    for (double scale : {1.0, 2.0}) {
        WorkloadGenParams p;
        p.n_requests = 300;
        p.scale = scale;
        p.seed = 5;
        Workload w = generate_workload(p);
        INFO("scale " << scale);
        CHECK(count_words(w.find_segment("sys-public")->text) == (int)(64 * scale));
        CHECK(count_words(w.find_segment("sys-tenant-a")->text) == (int)(64 * scale));
        CHECK(count_words(w.find_segment("tools-tenant-a")->text) == (int)(192 * scale));
        CHECK(count_words(w.find_segment("schema-0")->text) == (int)(128 * scale));
        for (int d = 0; d < 3; ++d) {
            int n = count_words(w.find_segment("doc-" + std::to_string(d))->text);
            CHECK(n >= 512 * scale);
            CHECK(n <= 768 * scale);
        }
        for (const WorkloadRequest& r : w.requests) {
            INFO(r.bucket << " " << w.prompt_text(r));
            if (r.bucket == "short_qa") {
                int q = count_words(r.segments.back().text);
                CHECK(q >= 16 * scale);
                CHECK(q <= 48 * scale);
                CHECK(r.max_tokens >= 16 * scale);
                CHECK(r.max_tokens <= 32 * scale);
                CHECK(r.temperature <= 0.3);
            } else if (r.bucket == "long_output") {
                CHECK(count_words(r.segments.back().text) == (int)(64 * scale));
                CHECK(r.max_tokens >= 128 * scale);
                CHECK(r.max_tokens <= 256 * scale);
            } else if (r.bucket == "high_temp") {
                CHECK(r.temperature >= 1.0);
                CHECK(r.temperature <= 1.3);
                CHECK(r.top_p == 0.95);
                CHECK(r.max_tokens >= 48 * scale);
                CHECK(r.max_tokens <= 96 * scale);
            } else if (r.bucket == "structured") {
                CHECK(r.response_json);
                CHECK(r.segments.back().shared.rfind("schema-", 0) == 0);
                CHECK(r.max_tokens >= 48 * scale);
            } else if (r.bucket == "long_doc") {
                CHECK(r.segments.back().shared.rfind("doc-", 0) == 0);
                CHECK(count_words(r.segments.back().text) == (int)(32 * scale));
            } else if (r.bucket == "agent" && r.turn > 1) {
                int n = count_words(r.prompt);
                CHECK(n >= 32 * scale);
                CHECK(n <= 96 * scale);
            }
        }
    }
}

TEST_CASE("Poisson arrival gaps average 1/rate and bursts keep the rate but not the spacing", "[workload]") {
    auto gap_stats = [](const Workload& w) {
        std::vector<double> gaps;
        for (size_t i = 1; i < w.requests.size(); ++i)
            gaps.push_back(w.requests[i].arrival_ms - w.requests[i - 1].arrival_ms);
        double mean = 0.0, var = 0.0;
        for (double g : gaps) mean += g;
        mean /= (double)gaps.size();
        for (double g : gaps) var += (g - mean) * (g - mean);
        return std::pair<double, double>{mean, std::sqrt(var / (double)gaps.size()) / mean};
    };
    for (uint64_t seed : {1, 2, 3, 4}) {
        for (double rate : {0.5, 4.0, 20.0}) {
            WorkloadGenParams p;
            p.n_requests = 2000;
            p.rate = rate;
            p.seed = seed;
            p.scale = 0.1;  // lengths do not matter here
            Workload w = generate_workload(p);
            auto [mean, cv] = gap_stats(w);
            INFO("seed " << seed << " rate " << rate << " mean gap " << mean << " cv " << cv);
            CHECK(std::abs(mean - 1000.0 / rate) <= 0.10 * 1000.0 / rate);
            CHECK(cv == Approx(1.0).margin(0.15));  // exponential gaps
            for (size_t i = 1; i < w.requests.size(); ++i)
                REQUIRE(w.requests[i].arrival_ms >= w.requests[i - 1].arrival_ms);
        }
    }
    WorkloadGenParams p;
    p.n_requests = 20000;
    p.rate = 4.0;
    p.burst = true;
    p.scale = 0.05;
    auto [mean, cv] = gap_stats(generate_workload(p));
    INFO("burst mean gap " << mean << " cv " << cv);
    CHECK(std::abs(mean - 250.0) <= 0.10 * 250.0);
    CHECK(cv > 2.0);  // bursty: far more spread than exponential gaps
}

TEST_CASE("agent sessions have consecutive turns in arrival order with pauses between them", "[workload]") {
    for (uint64_t seed : {1, 7, 9}) {
        WorkloadGenParams p;
        p.n_requests = 500;
        p.seed = seed;
        Workload w = generate_workload(p);
        struct Session {
            std::vector<const WorkloadRequest*> turns;
        };
        std::map<std::string, Session> sessions;
        for (const WorkloadRequest& r : w.requests) {
            if (r.session.empty()) {
                CHECK(r.bucket != "agent");
                continue;
            }
            CHECK(r.bucket == "agent");
            sessions[r.session].turns.push_back(&r);
        }
        REQUIRE(sessions.size() > 5);
        for (const auto& [id, s] : sessions) {
            INFO("seed " << seed << " session " << id);
            REQUIRE(s.turns.size() >= 3);
            REQUIRE(s.turns.size() <= 4);
            for (size_t k = 0; k < s.turns.size(); ++k) {
                const WorkloadRequest& r = *s.turns[k];
                CHECK(r.turn == (int)k + 1);
                CHECK(r.tenant == s.turns[0]->tenant);
                CHECK(r.tools);
                CHECK(r.temperature == 0.0);
                if (k + 1 < s.turns.size()) {
                    CHECK(r.tool_pause_ms >= 50);
                    CHECK(r.tool_pause_ms <= 300);
                    CHECK(s.turns[k + 1]->arrival_ms > r.arrival_ms);
                } else {
                    CHECK(r.tool_pause_ms == 0.0);
                }
            }
        }
    }
}

// Found by fuzz_workload (tests/fuzz/corpus/fuzz_workload/regress-number-overflow): a number past
// double's range made nlohmann throw out_of_range out of parse_workload.
TEST_CASE("a number too large for a double is an error naming the line, not an exception", "[workload]") {
    for (const char* text : {"2e2804", "{\"arrival_ms\": 1e999, \"prompt\": \"hi\", \"max_tokens\": 1}",
                             "\n{\"arrival_ms\": 0, \"prompt\": \"hi\", \"max_tokens\": -1e400}"}) {
        INFO(text);
        Expected<Workload> w = make_error("unset");
        REQUIRE_NOTHROW(w = parse_workload(text));
        REQUIRE(!w.ok());
        CHECK(w.error().message.rfind("workload line ", 0) == 0);
        CHECK(w.error().message.find("number overflow") != std::string::npos);
    }
}

TEST_CASE("the bucket mix follows --mix weights, keeps the standard mix unnamed, and refuses bad entries", "[workload]") {
    WorkloadGenParams p;
    p.n_requests = 2000;
    p.seed = 9;
    const Workload standard = generate_workload(p);
    auto count = [](const Workload& w) {
        std::map<std::string, int> n;
        for (const auto& r : w.requests)
            if (r.turn <= 1) n[r.bucket]++;  // sessions count once
        return n;
    };
    p.mix = {{"agent", 0.0}, {"long_doc", 0.0}};
    REQUIRE(check_workload_gen(p));
    const auto n = count(generate_workload(p));
    CHECK(n.count("agent") == 0);
    CHECK(n.count("long_doc") == 0);
    // The other four keep their standard weights (33/12/13/20 of 78): within 4 sigma of the shares.
    int total = 0;
    for (const auto& [_, k] : n) total += k;
    const std::map<std::string, double> want{{"short_qa", 33}, {"long_output", 12}, {"high_temp", 13}, {"structured", 20}};
    for (const auto& [b, w] : want) {
        const double share = w / 78.0, expect = share * total, sigma = std::sqrt(total * share * (1 - share));
        INFO(b << ": " << n.at(b) << " of " << total);
        CHECK(std::abs(n.at(b) - expect) < 4 * sigma);
    }
    p.mix = {{"short_qa", 1.0}, {"long_doc", 0.0}, {"long_output", 0.0}, {"agent", 0.0}, {"high_temp", 0.0}, {"structured", 0.0}};
    const auto only = count(generate_workload(p));
    CHECK(only.size() == 1);
    CHECK(only.count("short_qa") == 1);
    p.mix.clear();
    CHECK(generate_workload(p) == standard);  // an empty mix is the standard one

    CHECK(parse_workload_mix("short_qa=2,agent=0").value() == std::map<std::string, double>{{"short_qa", 2.0}, {"agent", 0.0}});
    for (const char* bad : {"short_qa", "=2", "short_qa=x", "short_qa=2x"}) {
        auto m = parse_workload_mix(bad);
        REQUIRE_FALSE(m);
        CHECK(m.error().message.find("BUCKET=WEIGHT") != std::string::npos);
    }
    p.mix = {{"chat", 1.0}};
    CHECK(check_workload_gen(p).error().message.find("--mix names bucket 'chat'") != std::string::npos);
    p.mix = {{"short_qa", -1.0}};
    CHECK_FALSE(check_workload_gen(p));
    p.mix = {{"short_qa", 0.0}, {"long_doc", 0.0}, {"long_output", 0.0}, {"agent", 0.0}, {"high_temp", 0.0}, {"structured", 0.0}};
    CHECK(check_workload_gen(p).error().message.find("every bucket at weight 0") != std::string::npos);
}
