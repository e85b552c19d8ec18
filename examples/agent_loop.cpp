// agent_loop: an agent whose turns reuse a session's KV. Run: build/agent_loop configs/test_tiny.toml
// Each turn sends the whole conversation so far plus a tool's result under one session id, waits
// out a simulated tool call, and prints the turn's output and how many prompt tokens came from the
// session's KV. Exits non-zero when a turn fails or a later turn recomputed its whole prompt.
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>

#include <steward/runtime.h>

namespace {

// The model's text may hold control bytes; keep the terminal tidy.
std::string printable(const std::string& s) {
    std::string out = s;
    for (char& c : out)
        if ((unsigned char)c < 0x20) c = ' ';
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: agent_loop CONFIG.toml (e.g. configs/test_tiny.toml)\n");
        return 2;
    }
    auto rt = steward::Runtime::start(argv[1]);
    if (!rt) {
        std::fprintf(stderr, "agent_loop: %s\n", rt.error().message.c_str());
        return 1;
    }
    steward::Runtime& runtime = **rt;

    const std::string session = "agent-loop-1";
    const char* tool_results[] = {
        "[tool:search] 3 results: weather.example/paris, weather.example/lyon, news.example/storm",
        "[tool:fetch] weather.example/paris: 18C, light wind, sunny until evening",
        "[tool:fetch] weather.example/lyon: 21C, clear",
        "[tool:calendar] no conflicts on Saturday",
    };
    std::string conversation =
        "System: you are a travel agent with tools search, fetch and calendar.\n"
        "User: plan a Saturday trip to the warmer of Paris and Lyon.\n";
    bool ok = true;
    const int n_turns = 4;
    for (int turn = 1; turn <= n_turns; turn++) {
        conversation += std::string(tool_results[turn - 1]) + "\nAgent:";
        steward::GenerationRequest req;
        req.prompt = conversation;
        req.session = session;
        req.tools = true;
        req.max_tokens = 24;

        // Stream the turn's text as it arrives; wait for its end on a future.
        std::string streamed;
        std::promise<steward::GenerationResult> done;
        steward::RequestCallbacks cb;
        cb.on_token = [&streamed](const std::string& piece, const std::vector<int32_t>&) { streamed += piece; };
        cb.on_finish = [&done](const steward::GenerationResult& r) { done.set_value(r); };
        runtime.submit(req, std::move(cb));
        const steward::GenerationResult r = done.get_future().get();

        std::printf("turn %d [%s, bucket %s]: %d prompt tokens, %d cached, %d generated\n  output: %s\n", turn,
                    steward::finish_reason_name(r.finish), r.bucket.c_str(), r.metrics.prompt_tokens, r.metrics.cached_tokens,
                    r.metrics.completion_tokens, printable(streamed).c_str());
        if (!r.ok()) {
            std::fprintf(stderr, "agent_loop: turn %d failed: %s %s\n", turn, steward::finish_reason_name(r.finish), r.error.c_str());
            ok = false;
            break;
        }
        if (turn >= 2 && r.metrics.cached_tokens <= 0) {
            std::fprintf(stderr, "agent_loop: turn %d reused none of the session's KV\n", turn);
            ok = false;
        }
        conversation += r.text + "\n";
        if (turn < n_turns) std::this_thread::sleep_for(std::chrono::milliseconds(75));  // the tool runs
    }
    runtime.end_session(session);
    std::printf("%s\n", ok ? "agent_loop: every later turn reused the session's KV" : "agent_loop: FAILED");
    return ok ? 0 : 1;
}
