// Grammar mask bench: time per token of TokenMasker::fill_mask (mean / P99, cache hits and misses
// apart) on a JSON-schema grammar, over seeded random walks, for a 32k (llama-spm) and a 151k
// (qwen2) vocabulary from ../shared/testdata/tokenizers, plus the vocabulary trie build and the
// grammar compile time. One masker per vocabulary is shared by all walks, as requests share it.
//   (from the repository root) build/bench_grammar [--walks 20] [--seed 1] [--dir ../shared/testdata/tokenizers] [--vocabs llama-spm,qwen2]
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "model/tokenizer.h"

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

}  // namespace

int main(int argc, char** argv) {
    int n_walks = 20;
    unsigned seed = 1;
    std::string dir = "../shared/testdata/tokenizers";  // from the repository root
    std::string vocabs = "llama-spm,qwen2";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--walks")) n_walks = std::atoi(argv[i + 1]);
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
    return 0;
}
