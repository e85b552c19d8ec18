// The speculation sources side by side on real text, in one run, on each model pair: suffix decoding,
// n-gram, a draft model and no speculation, on a tenant's requests that repeat themselves as agent
// traffic does (the same prompt again, or with one word edited), one at a time, greedy. Pairs: the
// real TinyStories-656K with its Q8_0 copy as the draft, and the synthetic speculation pair of the
// default config (models/steward-large-spec.gguf drafting with models/steward-small-spec.gguf)
// when its files are there. Per pair and source: TPOT mean and P99 (ms), P99 against no
// speculation's (suffix both as chains and as token trees, tree = dynamic), the mean accepted length (tokens per verifying step, the target's own included),
// the measured TPOT gain against no speculation with its 95% interval, the estimate from the
// measured parts (the report's formula), and whether every output equals no speculation's.
//   bench_suffix [--model ../shared/testdata/real/TinyStories-656K.f32.gguf]
//                [--draft ../shared/testdata/real/TinyStories-656K.q8_0.gguf]
//                [--synthetic models/steward-large-spec.gguf,models/steward-small-spec.gguf | '']
//                [--n 24] [--prompts 6] [--repeat 0.5] [--max-tokens 200] [--k 8] [--draft-k 4]
//                [--threads 1] [--seed 1]
// --repeat: the share of requests after the first round that repeat an earlier prompt exactly; the
// rest repeat one with a word changed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "metrics/bucket_metrics.h"
#include "model/model.h"
#include "sched/engine.h"

using namespace steward;
using bench::mean;
using bench::p99;

namespace {

struct Options {
    std::string model = "../shared/testdata/real/TinyStories-656K.f32.gguf";
    std::string draft = "../shared/testdata/real/TinyStories-656K.q8_0.gguf";
    std::string synthetic = "models/steward-large-spec.gguf,models/steward-small-spec.gguf";
    int n = 24, prompts = 6, max_tokens = 200, k = 8, draft_k = 4, threads = 1;
    double repeat = 0.5;
    uint64_t seed = 1;
};

// One source on one engine: the requests one at a time, greedy, no EOS stop.
bench::SequentialRun run(const Model& m, const Model* draft, const Options& o, const std::vector<std::vector<int32_t>>& prompts,
                         SpecSource src, bool tree = false) {
    Engine eng(m, bench::sequential_options(o.threads, src == SpecSource::DRAFT ? draft : nullptr));
    return bench::run_sequential(
        eng, prompts.size(),
        [&](size_t i) {
            EngineRequest q = bench::plain_request(i, prompts[i], o.max_tokens, "agent");
            if (src != SpecSource::NONE) q.spec = SpecSettings{src, src == SpecSource::DRAFT ? o.draft_k : o.k};
            if (tree) q.spec.tree = SpecTree::DYNAMIC;
            return q;
        },
        [](const std::string& what) {
            std::fprintf(stderr, "bench_suffix: %s\n", what.c_str());
            std::exit(1);
        });
}

// A 95% interval of the ratio of means a / b by the delta method over the requests' TPOTs.
std::pair<double, double> ratio_ci(const std::vector<double>& a, const std::vector<double>& b) {
    auto var_of_mean = [](const std::vector<double>& v, double m) {
        double s = 0;
        for (double x : v) s += (x - m) * (x - m);
        return v.size() > 1 ? s / (double)(v.size() - 1) / (double)v.size() : 0.0;
    };
    const double ma = bench::mean(a), mb = bench::mean(b);
    return ratio_ci95(ma, var_of_mean(a, ma), mb, var_of_mean(b, mb));
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        auto next = [&]() -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "bench_suffix: %s needs a value\n", argv[i]);
                std::exit(2);
            }
            return argv[++i];
        };
        if (!std::strcmp(argv[i], "--model")) o.model = next();
        else if (!std::strcmp(argv[i], "--draft")) o.draft = next();
        else if (!std::strcmp(argv[i], "--synthetic")) o.synthetic = next();
        else if (!std::strcmp(argv[i], "--draft-k")) o.draft_k = std::atoi(next());
        else if (!std::strcmp(argv[i], "--n")) o.n = std::atoi(next());
        else if (!std::strcmp(argv[i], "--prompts")) o.prompts = std::atoi(next());
        else if (!std::strcmp(argv[i], "--repeat")) o.repeat = std::atof(next());
        else if (!std::strcmp(argv[i], "--max-tokens")) o.max_tokens = std::atoi(next());
        else if (!std::strcmp(argv[i], "--k")) o.k = std::atoi(next());
        else if (!std::strcmp(argv[i], "--threads")) o.threads = std::atoi(next());
        else if (!std::strcmp(argv[i], "--seed")) o.seed = std::strtoull(next(), nullptr, 10);
        else {
            std::fprintf(stderr,
                         "usage: bench_suffix [--model PATH] [--draft PATH|''] [--synthetic TARGET,DRAFT|''] [--draft-k K] [--n N] [--prompts P] [--repeat S] [--max-tokens N] [--k K] "
                         "[--threads N] [--seed N]\n");
            return 2;
        }
    }
    if (o.n < 1 || o.prompts < 1 || o.k < 1 || o.k > k_max_spec_tokens || o.draft_k < 1 || o.draft_k > k_max_spec_tokens ||
        o.repeat < 0 || o.repeat > 1) {
        std::fprintf(stderr, "bench_suffix: --n and --prompts >= 1, --k and --draft-k in [1, %d], --repeat in [0, 1]\n",
                     k_max_spec_tokens);
        return 2;
    }
    // The tenant's prompts: story openings, then each later request one of them again, exactly
    // (--repeat) or with one name changed.
    static const char* openings[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play in the park",
        "One day, a boy named Tom found a big red ball in his garden",
        "There was a small cat who lived in a house by the sea",
        "Sara and her mom went to the store to buy some food",
        "A little bird wanted to fly high in the sky",
        "Ben had a toy car. He liked to play with it every day",
        "The sun was shining and the children went outside to play",
        "Mia saw a big dog in the street and she was scared",
    };
    static const char* names[] = {"Lily", "Tom", "Sara", "Ben", "Mia", "Max", "Anna", "Sam"};
    std::mt19937_64 rng(o.seed);
    std::vector<std::string> texts;
    for (int i = 0; i < o.n; i++) {
        if (i < o.prompts) {
            texts.push_back(openings[i % 8]);
            continue;
        }
        std::string t = texts[rng() % (uint64_t)o.prompts];
        if (std::uniform_real_distribution<double>(0, 1)(rng) >= o.repeat) {
            for (const char* nm : names)
                if (size_t at = t.find(nm); at != std::string::npos) {
                    t.replace(at, std::strlen(nm), names[rng() % 8]);
                    break;
                }
            if (t == texts.back()) t += " again";
        }
        texts.push_back(t);
    }
    struct Pair {
        std::string name, target, draft;
    };
    std::vector<Pair> pairs{{"tinystories", o.model, o.draft}};
    if (!o.synthetic.empty()) {
        const size_t comma = o.synthetic.find(',');
        const std::string t = o.synthetic.substr(0, comma), d = comma == std::string::npos ? "" : o.synthetic.substr(comma + 1);
        if (std::ifstream(t).good()) pairs.push_back({"synthetic", t, d});
        else std::printf("(no %s: the synthetic pair is skipped; `bash scripts/build.sh build` writes it)\n", t.c_str());
    }
    std::printf("bench_suffix: %d requests (%d prompts, repeat %.2f), %d tokens each, greedy, one at a time, k %d "
                "(draft model: %d), %d thread(s)\n",
                o.n, o.prompts, o.repeat, o.max_tokens, o.k, o.draft_k, o.threads);
    std::printf("CPU: %s\n", bench::cpu_model().c_str());
    bool lossless = true;
    for (const Pair& pr : pairs) {
        auto model = Model::load(pr.target);
        if (!model) {
            std::fprintf(stderr, "bench_suffix: %s\n", model.error().message.c_str());
            return 1;
        }
        const Model& m = **model;
        std::unique_ptr<Model> draft;
        if (!pr.draft.empty() && std::ifstream(pr.draft).good()) {
            auto d = Model::load(pr.draft);
            if (!d) {
                std::fprintf(stderr, "bench_suffix: %s\n", d.error().message.c_str());
                return 1;
            }
            draft = std::move(*d);
        }
        std::vector<std::vector<int32_t>> prompts;
        for (const std::string& t : texts) prompts.push_back(m.tokenizer().encode(t, m.tokenizer().add_bos_default()));
        std::printf("\n%s: target %s, draft %s\n", pr.name.c_str(), pr.target.c_str(), draft ? pr.draft.c_str() : "(none)");
        const bench::SequentialRun none = run(m, nullptr, o, prompts, SpecSource::NONE);
        std::vector<std::pair<std::string, bench::SequentialRun>> rows;
        if (draft) rows.push_back({"draft", run(m, draft.get(), o, prompts, SpecSource::DRAFT)});
        rows.push_back({"ngram", run(m, nullptr, o, prompts, SpecSource::NGRAM)});
        rows.push_back({"suffix", run(m, nullptr, o, prompts, SpecSource::SUFFIX)});
        rows.push_back({"suffix_tree", run(m, nullptr, o, prompts, SpecSource::SUFFIX, true)});
        std::printf("%-11s %12s %12s %11s %13s %14s %20s %9s %9s\n", "source", "tpot_mean_ms", "tpot_p99_ms", "p99_vs_none",
                    "accepted_len", "gain_measured", "gain_95%_interval", "estimate", "lossless");
        auto row = [&](const std::string& name, const bench::SequentialRun& r) {
            const double acc = r.n_drafts > 0 ? 1.0 + (double)r.n_accepted / (double)r.n_drafts : 1.0;
            const auto [lo, hi] = ratio_ci(none.tpot_ms, r.tpot_ms);
            // The report's estimate (metrics/bucket_metrics.h speculation_gain): each accepted token
            // would have cost one more verify-sized step, the drafting nothing.
            double est = NAN;
            if (r.n_drafts > 0 && r.n_gaps > 0) {
                const double with = mean(r.tpot_ms) / 1e3;
                est = spec_estimated_tpot_without(with, r.n_accepted, r.verify_s, r.n_drafts, r.draft_s, r.n_gaps) / with;
            }
            const bool same = r.outputs == none.outputs;
            lossless = lossless && same;
            char e[32] = "-";
            if (std::isfinite(est)) std::snprintf(e, sizeof e, "%.2fx", est);
            std::printf("%-11s %12.3f %12.3f %10.2fx %13.2f %13.2fx %9.2f - %-8.2f %9s %9s\n", name.c_str(), mean(r.tpot_ms),
                        p99(r.tpot_ms), p99(r.tpot_ms) / p99(none.tpot_ms), acc, mean(none.tpot_ms) / mean(r.tpot_ms), lo, hi,
                        e, same ? "yes" : "NO");
        };
        row("none", none);
        for (const auto& [name, r] : rows) row(name, r);
    }
    std::printf("\naccepted_len: tokens per verifying step (accepted drafts + the target's own); gain: none's TPOT mean / "
                "the source's, interval by the delta method over requests; estimate: the report's estimate from the parts; "
                "p99_vs_none: the source's P99 TPOT / none's.\n");
    return lossless ? 0 : 1;
}
