// The adaptive speculation policy against every fixed draft length and against no speculation, in
// one run, on one real model and its copies as drafts:
//   agree  the target file itself, loaded as the draft: it always agrees (the ceiling's case);
//   q8_0   the target's Q8_0 copy, if given (--q8 PATH): agrees on most tokens;
//   never  a copy of the target whose output rows are rotated by one (written to --dir): its greedy
//          token is always the target's plus one, so no draft token is ever accepted, at a draft
//          cost equal to the target's.
// Per draft and policy: TPOT mean and P99 over requests (ms), the mean accepted length (tokens per
// verifying step), the mean draft length per step, and whether every output equals no speculation's.
// Then the two checks of the adaptive policy: with `agree`, its TPOT mean over the best fixed k's;
// with `never`, its P99 TPOT over no speculation's. Each configuration runs --reps times, rounds
// interleaved; a figure is the median of the reps.
//   bench_adaptive [--model ../shared/testdata/real/TinyStories-656K.f32.gguf]
//                  [--q8 ../shared/testdata/real/TinyStories-656K.q8_0.gguf] [--n 20] [--max-tokens 200]
//                  [--k-max 16] [--ks 1,2,4,8,16] [--reps 3] [--threads 1] [--plugin PATH] [--dir DIR]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "model/gguf.h"
#include "model/model.h"
#include "plugin/plugin_loader.h"
#include "plugin/policies.h"
#include "sched/engine.h"

using namespace steward;
using bench::median;
using bench::p99;
using bench::mean;

namespace {

struct Options {
    std::string model = "../shared/testdata/real/TinyStories-656K.f32.gguf";
    std::string q8 = "../shared/testdata/real/TinyStories-656K.q8_0.gguf";
    std::string plugin, dir = "/tmp/steward_bench_adaptive";
    int n = 20, max_tokens = 200, k_max = 16, reps = 3, threads = 1;
    std::vector<int> ks{1, 2, 4, 8, 16};
};

[[noreturn]] void die(const std::string& what) {
    std::fprintf(stderr, "bench_adaptive: %s\n", what.c_str());
    std::exit(1);
}

// A copy of `target` whose output head's rows are rotated by one token (row t holds the target's row
// t - 1), so that the copy's logit of t + 1 is the target's logit of t: its argmax is always the
// target's plus one. A tied model (no output.weight) gets one made of its rotated token embeddings.
void write_rotated_copy(const std::string& target, const std::string& out) {
    auto f = GgufFile::open(target);
    if (!f) die(f.error().message);
    const GgufFile& t = **f;
    GgufWriter w;
    for (const auto& [key, v] : t.metadata()) {
        if (key == "general.alignment") continue;
        if (auto r = w.set_value(key, v); !r) die(r.error().message);
    }
    w.set_string("general.name", "steward-bench-never-agrees");
    const GgufTensorInfo* head = nullptr;
    const GgufTensorInfo* embd = nullptr;
    for (const auto& ti : t.tensors()) {
        if (ti.name == "output.weight") head = &ti;
        if (ti.name == "token_embd.weight") embd = &ti;
    }
    const GgufTensorInfo* src = head ? head : embd;
    if (!src || src->n_dims != 2) die("'" + target + "' has no 2-D output.weight or token_embd.weight to rotate");
    const size_t rows = (size_t)src->ne[1];
    if (src->n_bytes % rows != 0) die("the output head's rows are not of equal size");
    const size_t row = src->n_bytes / rows;
    std::vector<uint8_t> rotated(src->n_bytes);
    std::memcpy(rotated.data() + row, src->data, src->n_bytes - row);       // row t <- row t - 1
    std::memcpy(rotated.data(), src->data + src->n_bytes - row, row);       // row 0 <- the last
    for (const auto& ti : t.tensors()) {
        std::vector<int64_t> dims(ti.ne, ti.ne + ti.n_dims);
        if (&ti == head) {
            w.add_tensor(ti.name, ti.type, dims, rotated);
            continue;
        }
        w.add_tensor(ti.name, ti.type, dims, std::vector<uint8_t>(ti.data, ti.data + ti.n_bytes));
    }
    if (!head) w.add_tensor("output.weight", src->type, std::vector<int64_t>(src->ne, src->ne + 2), rotated);
    if (auto r = w.write(out, t.alignment()); !r) die(r.error().message);
}

struct Result : bench::SequentialRun {
    double step_ms = 0, forward_ms = 0, draft_ms_tok = -1, verify_ms_tok = -1;  // the engine's measurements
};

// One configuration: the requests one at a time (greedy, no EOS stop), a fresh engine.
Result run(const Model& target, const Model* draft, const std::vector<std::vector<int32_t>>& prompts, const Options& o,
           int k, std::shared_ptr<DraftBudgetPolicy> policy) {
    Engine eng(target, bench::sequential_options(o.threads, draft));
    Result r;
    static_cast<bench::SequentialRun&>(r) = bench::run_sequential(
        eng, prompts.size(),
        [&](size_t i) {
            EngineRequest q = bench::plain_request(i, prompts[i], o.max_tokens, "long_output");
            if (draft && k > 0) {
                q.spec = SpecSettings{SpecSource::DRAFT, k};
                q.speculation = policy;
            }
            return q;
        },
        [](const std::string& what) { die(what); });
    const EngineStats st = eng.stats();
    r.step_ms = st.n_steps > 0 ? st.step_s * 1e3 / (double)st.n_steps : 0;
    r.forward_ms = st.n_steps > 0 ? st.forward_s * 1e3 / (double)st.n_steps : 0;
    r.draft_ms_tok = st.draft_ms_per_token_model;
    r.verify_ms_tok = st.verify_ms_per_token;
    return r;
}

std::string exe_dir() {
    std::error_code ec;
    auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string(".") : p.parent_path().string();
}

struct Variant {
    std::string draft, policy;  // draft "" for none; policy "fixed" or "adaptive"
    int k = 0;
    std::vector<double> mean_ms, p99_ms;  // per rep
    Result last;
};

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        auto next = [&]() -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "bench_adaptive: %s needs a value\n", argv[i]);
                std::exit(2);
            }
            return argv[++i];
        };
        if (!std::strcmp(argv[i], "--model")) o.model = next();
        else if (!std::strcmp(argv[i], "--q8")) o.q8 = next();
        else if (!std::strcmp(argv[i], "--n")) o.n = std::atoi(next());
        else if (!std::strcmp(argv[i], "--max-tokens")) o.max_tokens = std::atoi(next());
        else if (!std::strcmp(argv[i], "--k-max")) o.k_max = std::atoi(next());
        else if (!std::strcmp(argv[i], "--reps")) o.reps = std::atoi(next());
        else if (!std::strcmp(argv[i], "--threads")) o.threads = std::atoi(next());
        else if (!std::strcmp(argv[i], "--plugin")) o.plugin = next();
        else if (!std::strcmp(argv[i], "--dir")) o.dir = next();
        else if (!std::strcmp(argv[i], "--ks")) {
            o.ks.clear();
            std::string s = next();
            for (size_t at = 0; at <= s.size();) {
                size_t comma = s.find(',', at);
                if (comma == std::string::npos) comma = s.size();
                o.ks.push_back(std::atoi(s.substr(at, comma - at).c_str()));
                at = comma + 1;
            }
        } else {
            std::fprintf(stderr,
                         "usage: bench_adaptive [--model PATH] [--q8 PATH|''] [--n N] [--max-tokens N] [--k-max K] "
                         "[--ks K,K,..] [--reps R] [--threads N] [--plugin PATH] [--dir DIR]\n");
            return 2;
        }
    }
    bool ks_ok = !o.ks.empty();
    for (int k : o.ks) ks_ok = ks_ok && k >= 1 && k <= k_max_spec_tokens;
    if (o.n < 1 || o.max_tokens < 2 || o.reps < 1 || !ks_ok || o.k_max < 1 || o.k_max > k_max_spec_tokens) {
        std::fprintf(stderr, "bench_adaptive: --n, --reps >= 1, --max-tokens >= 2, --ks and --k-max in [1, %d]\n",
                     k_max_spec_tokens);
        return 2;
    }
    if (o.plugin.empty()) o.plugin = exe_dir() + "/plugins/steward_speculation_adaptive.so";

    auto target = Model::load(o.model);
    if (!target) die(target.error().message);
    std::filesystem::create_directories(o.dir);
    const std::string never_path = o.dir + "/never-agrees.gguf";
    write_rotated_copy(o.model, never_path);
    std::map<std::string, std::shared_ptr<const Model>> drafts;
    {
        auto agree = Model::load(o.model);
        if (!agree) die(agree.error().message);
        drafts["agree"] = std::move(*agree);
        auto never = Model::load(never_path);
        if (!never) die(never.error().message);
        drafts["never"] = std::move(*never);
        if (!o.q8.empty() && std::filesystem::exists(o.q8)) {
            auto q8 = Model::load(o.q8);
            if (!q8) die(q8.error().message);
            drafts["q8_0"] = std::move(*q8);
        }
    }
    auto lib = PluginLibrary::open(o.plugin, PolicyKind::SPECULATION);
    if (!lib) die(lib.error().message + " (build the plugins, or give --plugin PATH)");
    PolicySpec spec;
    spec.plugin = o.plugin;
    spec.params["k_max"] = int64_t(o.k_max);

    // The requests: story openings of the model's kind, 200 tokens each.
    static const char* openings[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play in the park",
        "One day, a boy named Tom found a big red ball in his garden",
        "There was a small cat who lived in a house by the sea",
        "Sara and her mom went to the store to buy some food",
        "A little bird wanted to fly high in the sky",
        "Ben had a toy car. He liked to play with it every day",
        "The sun was shining and the children went outside to play",
        "Mia saw a big dog in the street and she was scared",
        "Once upon a time, there was a big bear who lived in the woods",
        "Tim wanted to help his dad in the kitchen",
    };
    const Tokenizer& tok = (*target)->tokenizer();
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < o.n; i++) {
        std::string t = openings[i % 10];
        if (i >= 10) t += ". Then";
        prompts.push_back(tok.encode(t, tok.add_bos_default()));
    }

    std::vector<Variant> configs;
    configs.push_back({"", "none", 0, {}, {}, {}});
    for (const auto& [name, _] : drafts) {
        for (int k : o.ks) configs.push_back({name, "fixed", k, {}, {}, {}});
        configs.push_back({name, "adaptive", o.k_max, {}, {}, {}});
    }
    std::printf("bench_adaptive: %s, %d requests of %d tokens, greedy, one at a time, %d thread(s), %d reps (median)\n",
                o.model.c_str(), o.n, o.max_tokens, o.threads, o.reps);
    std::printf("CPU: %s\n\n", bench::cpu_model().c_str());
    for (int rep = 0; rep < o.reps; rep++)
        for (Variant& c : configs) {
            std::shared_ptr<DraftBudgetPolicy> policy;
            if (c.policy == "adaptive") {
                auto counters = std::make_shared<PolicyCounters>();
                auto p = SpeculationPolicy::create(*lib, spec, "long_output", counters, {});
                if (!p) die(p.error().message);
                policy = std::shared_ptr<SpeculationPolicy>(std::move(*p));
            }
            const Model* d = c.draft.empty() ? nullptr : drafts.at(c.draft).get();
            c.last = run(**target, d, prompts, o, c.k, policy);
            c.mean_ms.push_back(mean(c.last.tpot_ms));
            c.p99_ms.push_back(p99(c.last.tpot_ms));
        }

    const Variant& none = configs[0];
    std::printf("%-6s %-9s %4s %12s %12s %13s %12s %9s %9s %9s %9s\n", "draft", "policy", "k", "tpot_mean_ms",
                "tpot_p99_ms", "accepted_len", "mean_draft", "lossless", "step_ms", "draft_ms", "verify_ms");
    for (const Variant& c : configs) {
        const Result& r = c.last;
        const double acc = r.n_drafts > 0 ? 1.0 + (double)r.n_accepted / (double)r.n_drafts : 1.0;
        const double k_mean = r.n_drafts > 0 ? (double)r.n_draft_tokens / (double)r.n_drafts : 0.0;
        std::printf("%-6s %-9s %4s %12.4f %12.4f %13.2f %12.2f %9s %9.4f %9.4f %9.4f\n", c.draft.empty() ? "-" : c.draft.c_str(),
                    c.policy.c_str(), c.policy == "fixed" ? std::to_string(c.k).c_str() : c.policy == "adaptive" ? "<=" : "-",
                    median(c.mean_ms), median(c.p99_ms), acc, k_mean, r.outputs == none.last.outputs ? "yes" : "NO",
                    r.step_ms, r.draft_ms_tok, r.verify_ms_tok);
    }
    std::printf("\naccepted_len: tokens per verifying step (accepted drafts + the target's own); mean_draft: draft "
                "tokens per verifying step; adaptive's k is its own choice per step, up to --k-max %d; step_ms: the engine's mean step;\n"
                "draft_ms, verify_ms: what the policy is told a draft token and a verified token cost (the last rep's engine)\n\n",
                o.k_max);
    for (const auto& [name, _] : drafts) {
        const Variant* best = nullptr;
        const Variant* adaptive = nullptr;
        for (const Variant& c : configs) {
            if (c.draft != name) continue;
            if (c.policy == "fixed" && (!best || median(c.mean_ms) < median(best->mean_ms))) best = &c;
            if (c.policy == "adaptive") adaptive = &c;
        }
        if (!best || !adaptive) continue;
        std::printf("%-6s adaptive TPOT mean / best fixed (k %d): %.3f   adaptive TPOT p99 / none's: %.3f   "
                    "best fixed / none (mean): %.3f\n",
                    name.c_str(), best->k, median(adaptive->mean_ms) / median(best->mean_ms),
                    median(adaptive->p99_ms) / median(none.p99_ms), median(best->mean_ms) / median(none.mean_ms));
    }
    std::printf("\nthe issue's checks: agree's first ratio <= 1.10; never's second ratio <= 1.05\n");
    return 0;
}
