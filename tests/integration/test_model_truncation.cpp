// A model file truncated while it is served: the requests it touched finish with an error naming
// the file, nothing crashes, the other pool keeps serving, drain returns, and after the file is
// rewritten a reload maps the new file and requests succeed again. No sleeps: the truncation
// happens inside the forward fault hook, on the engine's thread, right before a forward.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <mutex>
#include <vector>

#include <steward/runtime.h>

#include "model/mapping_guard.h"
#include "model/synth.h"
#include "process_temp_dir.h"
#include "sched/engine.h"

using namespace steward;
using namespace steward_test;

namespace {

const std::filesystem::path& trunc_dir() {
    static const ProcessTempDir dir("steward_test_truncation_");
    return dir.path();
}

SynthSpec trunc_spec(uint64_t seed) {
    SynthSpec s;
    s.n_embd = 64;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 128;
    s.n_vocab = 512;
    s.n_ctx = 512;
    s.seed = seed;
    return s;
}

std::string trunc_toml(const std::string& served, const std::string& other) {
    std::string t = R"(
[limits]
request_timeout_ms = 120000
max_tokens_default = 8
[reload]
watch = false
)";
    for (auto [name, model] : {std::pair{"served", served}, std::pair{"other", other}})
        t += std::string("\n[[pool]]\nname = \"") + name + "\"\nmodel = \"" + model +
             "\"\nthreads = 2\nkv_blocks = 64\nblock_size = 16\nmax_batch = 8\nmax_batch_tokens = 64\nmax_queue = 256\n";
    t += "\n[[bucket]]\nname = \"to_served\"\npool = \"served\"\n[bucket.match]\nhint = \"served\"\n";
    t += "\n[[bucket]]\nname = \"to_other\"\npool = \"other\"\n";
    return t;
}

struct HookReset {
    ~HookReset() { set_forward_fault_hook(nullptr); }
};

std::vector<int32_t> prompt_ids(int n, int salt) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; i++) v.push_back(3 + (i * 11 + salt * 17) % 500);
    return v;
}

}  // namespace

TEST_CASE("a model file truncated while served fails its requests with an error naming it, a reload of the rewritten file serves again",
          "[fault][truncation]") {
    if (!mapping_guard_active()) {
        WARN("skipped: the SIGBUS handler that guards model mappings is not installed (a sanitizer runtime "
             "keeps SIGBUS for itself: run with ASAN_OPTIONS=allow_user_segv_handler=1)");
        return;
    }
    const std::string served = (trunc_dir() / "served.gguf").string();
    const std::string other = (trunc_dir() / "other.gguf").string();
    REQUIRE(synth_write(trunc_spec(5), served));
    REQUIRE(synth_write(trunc_spec(6), other));
    const std::string cfg = (trunc_dir() / "trunc.toml").string();
    std::ofstream(cfg) << trunc_toml(served, other);
    auto rt = Runtime::start(cfg);
    if (!rt) FAIL(rt.error().message);
    Runtime& r = **rt;
    HookReset reset_hook;

    // Truncate the served file before the third forward that holds one of its requests (the other
    // pool gets none in this phase), so some requests are mid-decode when the weights vanish.
    std::atomic<int> n_forwards{0};
    std::atomic<bool> truncated{false};
    set_forward_fault_hook([&](std::span<const uint64_t>) {
        if (++n_forwards == 3 && !truncated.exchange(true)) REQUIRE(::truncate(served.c_str(), 100) == 0);
    });

    const int n = 24;
    std::mutex mu;
    std::vector<GenerationResult> results(n);
    std::vector<int> n_finish(n, 0);
    for (int i = 0; i < n; i++) {
        GenerationRequest q;
        q.prompt_ids = prompt_ids(10 + i % 7, i);
        q.max_tokens = 12;
        q.ignore_eos = true;
        q.bucket_hint = "served";
        RequestCallbacks cb;
        cb.on_finish = [&, i](const GenerationResult& res) {
            std::lock_guard<std::mutex> lk(mu);
            results[i] = res;
            n_finish[i]++;
        };
        r.submit(std::move(q), std::move(cb));
    }
    r.drain();
    set_forward_fault_hook(nullptr);
    REQUIRE(truncated);
    int n_failed = 0;
    for (int i = 0; i < n; i++) {
        INFO("request " << i << ": " << finish_reason_name(results[i].finish) << " " << results[i].error);
        CHECK(n_finish[i] == 1);
        if (!results[i].ok()) {
            n_failed++;
            CHECK(results[i].finish == FinishReason::ERROR);
            CHECK(results[i].error.find("the model file '" + served + "' changed while it was served (truncated") !=
                  std::string::npos);
            CHECK(results[i].error.find("reload the config") != std::string::npos);
        }
    }
    CHECK(n_failed > 0);  // at least the batch of the truncating forward and everything after it

    // The other pool serves; the broken one refuses with the same reason.
    GenerationRequest q;
    q.prompt_ids = prompt_ids(12, 99);
    q.max_tokens = 4;
    auto ok_other = r.generate(q);
    CHECK(ok_other.ok());
    CHECK(ok_other.pool == "other");
    q.bucket_hint = "served";
    auto refused = r.generate(q);
    CHECK(refused.finish == FinishReason::ERROR);
    CHECK(refused.error.find("changed while it was served") != std::string::npos);

    // Rewrite the model (a new mtime, so a new pool key) and reload: a new mapping serves.
    REQUIRE(synth_write(trunc_spec(5), served));
    auto g = r.reload();
    REQUIRE(g.ok());
    for (int i = 0; i < 4; i++) {
        GenerationRequest again;
        again.prompt_ids = prompt_ids(10 + i, 200 + i);
        again.max_tokens = 6;
        again.bucket_hint = "served";
        auto res = r.generate(again);
        INFO(res.error);
        CHECK(res.ok());
        CHECK(res.pool == "served");
    }
    r.drain();
}

TEST_CASE("a model file rewritten in place while served is refused, not served as a mix of old and new weights",
          "[fault][truncation]") {
    const std::string path = (trunc_dir() / "inplace.gguf").string();
    REQUIRE(synth_write(trunc_spec(7), path));
    auto m = Model::load(path);
    REQUIRE(m);
    CHECK(m.value()->check_file());
    // Same size, other bytes, a later mtime: no fault ever happens, the size/mtime watch catches it.
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    {
        const int fd = ::open(path.c_str(), O_WRONLY);
        REQUIRE(fd >= 0);
        const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        REQUIRE(::pwrite(fd, junk, sizeof junk, st.st_size / 2) == (ssize_t)sizeof junk);
        struct timespec times[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 5, 0}};
        REQUIRE(::futimens(fd, times) == 0);
        ::close(fd);
    }
    auto c = m.value()->check_file();
    REQUIRE_FALSE(c);
    CHECK(c.error().message.find("rewritten in place") != std::string::npos);
    CHECK_FALSE(m.value()->check_file());  // sticky
}
