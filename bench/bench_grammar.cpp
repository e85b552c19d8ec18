// Grammar mask bench: time per token of TokenMasker::fill_mask (mean / P99, cache hits and misses
// apart) on a JSON-schema grammar, over seeded random walks, for a 32k (llama-spm) and a 151k
// (qwen2) vocabulary from ../shared/testdata/tokenizers, plus the vocabulary trie build and the
// grammar compile time. One masker per vocabulary is shared by all walks, as requests share it.
// Then end to end: TPOT of greedy requests constrained by the schema against the same requests
// unconstrained, through the Engine on synthetic Q8_0 models (dim 512, 8 layers) with a 32k and a
// 152k vocabulary, one request at a time (batch 1: the mask is on every step's critical path).
//   (from the repository root) build/bench_grammar [--walks 20] [--seed 1] [--dir ../shared/testdata/tokenizers]
//     [--vocabs llama-spm,qwen2] [--e2e-vocabs 32000,151936] [--requests 6] [--tokens 48] [--threads 2]
//     [--model-dir /tmp/steward_bench_grammar]
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <filesystem>
#include <map>

#include "grammar/grammar.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "sched/engine.h"

using namespace steward;
using clk = std::chrono::steady_clock;

namespace {

constexpr const char* k_schema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 40},
    "arguments": {"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
        "hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4}},
      "required": ["city", "unit"], "additionalProperties": false},
    "confidence": {"type": "number"}
  },
  "required": ["name", "arguments"],
  "additionalProperties": false
})";

double us_since(clk::time_point t0) { return std::chrono::duration<double, std::micro>(clk::now() - t0).count(); }

double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(p * (double)v.size()))];
}
double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / (double)v.size();
}

struct E2eOptions {
    std::string vocabs = "32000,151936";
    int n_requests = 6, n_tokens = 48, n_threads = 2;
    std::string dir = (std::filesystem::temp_directory_path() / "steward_bench_grammar").string();
};

// Mean TPOT (ms) of n_requests greedy requests run one at a time, and the mean mask time per
// masked row (us, 0 unconstrained). Plain and constrained requests alternate on one engine, so that
// both see the same machine (caches, clock, page cache); each mode gets its own warm-up request.
struct E2eResult {
    double tpot_ms = 0, mask_us = 0;
    int n_tokens = 0;
};
std::pair<E2eResult, E2eResult> run_e2e(const Model& model, const E2eOptions& o, std::shared_ptr<const CompiledGrammar> g) {
    EngineOptions eo;
    eo.n_threads = o.n_threads;
    eo.n_blocks = 64;
    eo.prefix_cache = false;
    Engine e(model, eo);
    std::vector<double> tpot[2];
    double mask_s = 0;
    int64_t n_masked = 0;
    E2eResult out[2];
    for (int i = 0; i < 2 * (o.n_requests + 1); i++) {  // the first of each mode warms up
        const int mode = i % 2;                          // 0 plain, 1 constrained
        EngineRequest r;
        r.id = (uint64_t)i + 1;
        for (int t = 0; t < 24; t++) r.prompt.push_back(300 + (i / 2 * 131 + t * 17) % 3000);
        r.max_tokens = o.n_tokens;
        r.stop_at_eos = false;
        if (mode == 1) r.grammar = g;
        if (!e.submit(r).ok()) {
            std::fprintf(stderr, "bench_grammar: submit refused\n");
            std::exit(1);
        }
        clk::time_point first{};
        int n_out = 0;
        double now = 0;
        bool done = false;
        while (!done) {
            for (EngineEvent& ev : e.step(now += 0.001)) {
                if (!ev.tokens.empty() && n_out == 0) first = clk::now();
                n_out += (int)ev.tokens.size();
                if (!ev.finished) continue;
                done = true;
                if (ev.finish == FinishReason::ERROR) {
                    std::fprintf(stderr, "bench_grammar: request failed: %s\n", ev.error.c_str());
                    std::exit(1);
                }
                if (i < 2 || n_out < 2) continue;
                tpot[mode].push_back(std::chrono::duration<double, std::milli>(clk::now() - first).count() / (n_out - 1));
                out[mode].n_tokens += n_out;
                if (mode == 1) {
                    mask_s += ev.mask_s;
                    n_masked += ev.n_masked;
                }
            }
        }
    }
    for (int m = 0; m < 2; m++) out[m].tpot_ms = mean(tpot[m]);
    out[1].mask_us = n_masked ? mask_s / (double)n_masked * 1e6 : 0;
    return {out[0], out[1]};
}

void bench_e2e(const std::shared_ptr<const CompiledGrammar>& g, const E2eOptions& o) {
    std::printf("\nend to end (greedy, batch 1, %d requests of %d tokens after a warm-up, %d threads, synthetic Q8_0 "
                "dim 512 x 8 layers):\n%-8s %12s %12s %8s %9s %12s\n",
                o.n_requests, o.n_tokens, o.n_threads, "n_vocab", "tpot_plain", "tpot_schema", "ratio", "mask_us",
                "tokens_schema");
    std::filesystem::create_directories(o.dir);
    std::stringstream list(o.vocabs);
    for (std::string v; std::getline(list, v, ',');) {
        SynthSpec s;
        s.n_embd = 512;
        s.n_layer = 8;
        s.n_head = 8;
        s.n_head_kv = 4;
        s.n_ff = 1376;
        s.n_vocab = std::atoi(v.c_str());
        s.n_ctx = 1024;
        s.dtype = GgmlType::Q8_0;
        s.seed = 3;
        const std::string path = o.dir + "/synth_v" + v + ".gguf";
        if (!std::filesystem::exists(path))
            if (auto w = synth_write(s, path); !w) {
                std::fprintf(stderr, "bench_grammar: writing %s: %s\n", path.c_str(), w.error().message.c_str());
                std::exit(1);
            }
        auto m = Model::load(path);
        if (!m) {
            std::fprintf(stderr, "bench_grammar: %s\n", m.error().message.c_str());
            std::exit(1);
        }
        const auto [plain, schema] = run_e2e(**m, o, g);
        std::printf("%-8s %10.2fms %10.2fms %7.3fx %9.1f %12d\n", v.c_str(), plain.tpot_ms, schema.tpot_ms,
                    schema.tpot_ms / plain.tpot_ms, schema.mask_us, schema.n_tokens);
        std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    int n_walks = 20;
    unsigned seed = 1;
    std::string dir = "../shared/testdata/tokenizers";  // from the repository root
    std::string vocabs = "llama-spm,qwen2";
    E2eOptions e2e;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--walks")) n_walks = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--e2e-vocabs")) e2e.vocabs = argv[i + 1];
        else if (!std::strcmp(argv[i], "--requests")) e2e.n_requests = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--tokens")) e2e.n_tokens = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--threads")) e2e.n_threads = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--model-dir")) e2e.dir = argv[i + 1];
        else if (!std::strcmp(argv[i], "--seed")) seed = (unsigned)std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!std::strcmp(argv[i], "--vocabs")) vocabs = argv[i + 1];
        else {
            std::fprintf(stderr, "unknown option %s (see the usage line at the top of bench_grammar.cpp)\n", argv[i]);
            return 2;
        }
    }
    auto t0 = clk::now();
    auto g = CompiledGrammar::from_json_schema(std::string_view(k_schema));
    if (!g) {
        std::fprintf(stderr, "%s\n", g.error().message.c_str());
        return 1;
    }
    std::printf("grammar compile: %.1f us (%zu rules, %zu elements)\n", us_since(t0), (*g)->rule_names().size(),
                (*g)->elements().size());
    std::stringstream names(vocabs);
    for (std::string name; std::getline(names, name, ',');) {
        auto tok = Tokenizer::load(dir + "/ggml-vocab-" + name + ".gguf");
        if (!tok) {
            std::fprintf(stderr, "%s\n", tok.error().message.c_str());
            return 1;
        }
        t0 = clk::now();
        auto vocab = TokenVocabulary::from_tokenizer(**tok);
        const double build_ms = us_since(t0) / 1000;
        TokenMasker masker(*g, vocab);
        std::vector<double> all, hit, miss;
        std::mt19937 rng(seed);
        std::vector<uint64_t> mask(masker.n_words());
        size_t n_forced = 0;
        for (int w = 0; w < n_walks; ++w) {
            GrammarMatcher m(*g);
            for (int step = 0; step < 400; ++step) {
                t0 = clk::now();
                const MaskResult r = masker.fill_mask(m, mask);
                const double us = us_since(t0);
                all.push_back(us);
                (r.cache_hit ? hit : miss).push_back(us);
                n_forced += r.n_allowed == 1;
                if (r.dead()) break;
                std::vector<int32_t> ids;
                for (int32_t id = 0; id < vocab->n_vocab(); ++id)
                    if (mask[(size_t)id / 64] >> (id % 64) & 1) ids.push_back(id);
                // Past 20 tokens, close things: the one-byte token (or EOG) leaving the shortest stack.
                int32_t pick = ids[rng() % ids.size()];
                if (step > 20) {
                    long best = LONG_MAX;
                    for (int32_t id : ids) {
                        long score = -1;
                        if (!vocab->is_eog(id)) {
                            if (vocab->bytes(id).size() != 1) continue;
                            GrammarMatcher copy = m;
                            if (!copy.accept_bytes(vocab->bytes(id))) continue;
                            score = LONG_MAX - 1;
                            const StackSet& st = copy.state();
                            for (size_t i = 0; i < st.size(); ++i) score = std::min(score, (long)(st.offs[i + 1] - st.offs[i]));
                        }
                        if (score < best) {
                            best = score;
                            pick = id;
                        }
                    }
                }
                if (vocab->is_eog(pick) || !masker.accept_token(m, pick)) break;
            }
        }
        std::printf("%-10s n_vocab %6d  trie %zu nodes built in %.1f ms | mask per token: mean %.1f us  p99 %.1f us "
                    "over %zu | hits %zu (mean %.1f us) misses %zu (mean %.1f us, p99 %.1f us) | forced %zu\n",
                    name.c_str(), vocab->n_vocab(), vocab->trie().size(), build_ms, mean(all), pct(all, 0.99),
                    all.size(), hit.size(), mean(hit), miss.size(), mean(miss), pct(miss, 0.99), n_forced);
    }
    if (!e2e.vocabs.empty()) bench_e2e(*g, e2e);
    return 0;
}
