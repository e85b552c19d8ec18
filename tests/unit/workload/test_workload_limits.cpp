// Hostile workload files (issue 9): arrivals that would overflow, turns out of order or missing,
// two tenants sharing a session id (their conversations stay apart), and files that are not
// regular (a FIFO never blocks).
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>

#include "process_temp_dir.h"
#include "workload/workload.h"

using namespace steward;

TEST_CASE("an arrival_ms of 1e13 is refused naming the line instead of overflowing into 'now'", "[workload][hostile]") {
    auto ok = parse_workload("{\"arrival_ms\": 1e9, \"prompt\": \"a\", \"max_tokens\": 1}\n");
    CHECK(ok.ok());
    auto pause = parse_workload("{\"arrival_ms\": 0, \"prompt\": \"a\", \"max_tokens\": 1, \"tool_pause_ms\": 1e300}\n");
    REQUIRE_FALSE(pause.ok());
    CHECK_THAT(pause.error().message, Catch::Contains("workload line 1") && Catch::Contains("tool_pause_ms"));
    auto r = parse_workload("{\"arrival_ms\": 0, \"prompt\": \"a\", \"max_tokens\": 1}\n"
                            "{\"arrival_ms\": 1e13, \"prompt\": \"b\", \"max_tokens\": 1}\n");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("workload line 2") && Catch::Contains("arrival_ms") &&
                                      Catch::Contains("[0, 1e9]"));
}

TEST_CASE("turns of a session out of order or missing are refused naming the line and the missing turn",
          "[workload][hostile]") {
    const std::string t1 = "{\"arrival_ms\": 0, \"session\": \"s\", \"turn\": 1, \"prompt\": \"a\", \"max_tokens\": 1}\n";
    const std::string t2 = "{\"arrival_ms\": 1, \"session\": \"s\", \"turn\": 2, \"prompt\": \"b\", \"max_tokens\": 1}\n";
    const std::string t3 = "{\"arrival_ms\": 2, \"session\": \"s\", \"turn\": 3, \"prompt\": \"c\", \"max_tokens\": 1}\n";
    CHECK(parse_workload(t1 + t2 + t3).ok());
    auto swapped = parse_workload(t2 + t1);
    REQUIRE_FALSE(swapped.ok());
    CHECK_THAT(swapped.error().message, Catch::Contains("workload line 1: turn 2 of session \"s\"") &&
                                            Catch::Contains("turn 1 is missing or out of order"));
    auto gap = parse_workload(t1 + t3);
    REQUIRE_FALSE(gap.ok());
    CHECK_THAT(gap.error().message, Catch::Contains("workload line 2: turn 3") && Catch::Contains("comes after turn 1") &&
                                        Catch::Contains("turn 2 is missing"));
    auto twice = parse_workload(t1 + t1);
    REQUIRE_FALSE(twice.ok());
    CHECK_THAT(twice.error().message, Catch::Contains("workload line 2: turn 1"));
}

TEST_CASE("two tenants using one session id are two sessions: each numbers its own turns, neither sees the other's text",
          "[workload][hostile]") {
    auto line = [](const char* tenant, int turn, const char* prompt) {
        return std::string("{\"arrival_ms\": 0, \"tenant\": \"") + tenant + "\", \"session\": \"s1\", \"turn\": " +
               std::to_string(turn) + ", \"prompt\": \"" + prompt + "\", \"max_tokens\": 1}\n";
    };
    auto w = parse_workload(line("acme", 1, "A1") + line("globex", 1, "G1") + line("acme", 2, "A2") + line("globex", 2, "G2"));
    INFO((w ? "" : w.error().message));
    REQUIRE(w.ok());

    // The runner's conversations, replayed as cmd_run does: each turn's prompt, then its output.
    SessionConversations conv;
    std::vector<std::string> prompts;
    for (const auto& r : w->requests) {
        prompts.push_back(conv.open_turn(r.tenant, r.session, w->prompt_text(r)));
        conv.close_turn(r.tenant, r.session, " out-" + r.prompt);
    }
    CHECK(conv.n_sessions() == 2);
    REQUIRE(prompts.size() == 4);
    CHECK(prompts[0] == "A1");
    CHECK(prompts[1] == "G1");
    CHECK(prompts[2] == "A1 out-A1 A2");
    CHECK(prompts[3] == "G1 out-G1 G2");
}

TEST_CASE("a workload path that is a FIFO or a directory is refused at once", "[workload][hostile]") {
    static steward_test::ProcessTempDir d("steward-workload-limits-");
    const auto fifo = d.path() / "w.jsonl";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    auto r = read_workload_file(fifo.string());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("w.jsonl") && Catch::Contains("not a regular file"));
    auto dir = read_workload_file(d.path().string());
    REQUIRE_FALSE(dir.ok());
    CHECK_THAT(dir.error().message, Catch::Contains("not a regular file"));
}

TEST_CASE("the generated standard workload passes the stricter loader", "[workload][hostile]") {
    WorkloadGenParams gp;
    gp.n_requests = 300;
    gp.seed = 3;
    const Workload w = generate_workload(gp);
    auto back = parse_workload(write_workload(w));
    INFO((back ? "" : back.error().message));
    REQUIRE(back.ok());
    CHECK(*back == w);
}
