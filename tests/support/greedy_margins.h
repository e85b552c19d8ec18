// Greedy decoding through CpuForward that keeps, at each step, our top-1 margin and the gap to a
// reference's pick (llama.cpp's ids): the near-tie judgement the tests against llama.cpp use.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <sstream>
#include <span>
#include <string>
#include <vector>

#include "cpu/forward.h"
#include "kv/kv_storage.h"
#include "model/model.h"

namespace steward_test {

struct Greedy {
    std::vector<int32_t> ids;    // our top-1 at each step
    std::vector<float> margins;  // our top-1 minus top-2 logit at each step
    std::vector<float> gaps;     // our top-1 logit minus our logit of the reference's id (0: same id)
};

// Greedy decoding through CpuForward, keeping each step's margin. With forced empty, our own pick
// is fed back; otherwise forced[k] is (teacher forcing on llama.cpp's ids), so every step compares.
inline Greedy greedy_with_margins(const steward::Model& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want,
                           bool forced) {
    const steward::ModelParams& p = model.params();
    const int n_predict = (int)want.size();
    steward::CpuForward fwd(model, 2, 512);
    const int block_size = 16;
    const int n_blocks = ((int)prompt.size() + n_predict + block_size - 1) / block_size;
    steward::KvStorage kv(steward::KvStorage::config_for(p, n_blocks, block_size, steward::KvDtype::F32));
    std::vector<int32_t> table(n_blocks);
    for (int i = 0; i < n_blocks; i++) table[i] = i;
    Greedy g;
    std::vector<int32_t> tokens = prompt;
    std::vector<float> logits;
    int n_past = 0;
    for (int k = 0; k < n_predict; k++) {
        steward::SeqInput in;
        in.n_past = n_past;
        in.tokens = tokens;
        in.block_table = table;
        in.logits = steward::LogitsMode::LAST;
        auto r = fwd.forward(kv, std::span<const steward::SeqInput>(&in, 1), logits);
        INFO("forward: " << (r.ok() ? std::string("ok") : r.error().message));
        REQUIRE(r.ok());
        REQUIRE((int)logits.size() == p.n_vocab);
        n_past += (int)tokens.size();
        // llama.cpp's references are taken with ignore_eos: its end-of-generation tokens never win.
        const steward::Tokenizer& tok = model.tokenizer();
        for (int v = 0; v < p.n_vocab; v++)
            if (tok.is_eog(v)) logits[v] = -INFINITY;
        int best = tok.is_eog(0) ? 1 : 0, second = -1;
        for (int v = best + 1; v < p.n_vocab; v++) {
            if (logits[v] > logits[best]) {
                second = best;
                best = v;
            } else if (second < 0 || logits[v] > logits[second]) {
                second = v;
            }
        }
        REQUIRE(want[k] >= 0);
        REQUIRE(want[k] < p.n_vocab);
        g.ids.push_back(best);
        g.margins.push_back(logits[best] - logits[second]);
        g.gaps.push_back(logits[best] - logits[want[k]]);
        tokens = {forced ? want[k] : best};
    }
    return g;
}

// One row of a tests/data/*/llama_greedy.tsv reference: a variant name, llama.cpp's prompt ids and
// its greedy ids (tab-separated columns, ids space-separated).
struct LlamaGreedyRow {
    std::string name;
    std::vector<int32_t> prompt, ids;
};

inline std::vector<LlamaGreedyRow> read_llama_greedy_tsv(const std::string& path) {
    std::ifstream in(path);
    REQUIRE(in);
    auto parse_ids = [](const std::string& s) {
        std::istringstream is(s);
        std::vector<int32_t> v;
        int32_t x;
        while (is >> x) v.push_back(x);
        return v;
    };
    std::vector<LlamaGreedyRow> rows;
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream cols(line);
        std::string name, prompt, ids;
        REQUIRE(std::getline(cols, name, '\t'));
        REQUIRE(std::getline(cols, prompt, '\t'));
        REQUIRE(std::getline(cols, ids, '\t'));
        rows.push_back({name, parse_ids(prompt), parse_ids(ids)});
    }
    return rows;
}

// Our free-running greedy ids equal the reference's up to its first near-tie (the reference's pick
// within tie_margin logits of our top-1 where they split) and for at least min_steps steps.
inline void check_greedy_up_to_near_tie(const steward::Model& model, const LlamaGreedyRow& row, float tie_margin,
                                        int min_steps) {
    const Greedy g = greedy_with_margins(model, row.prompt, row.ids, false);
    int n_match = 0;
    while (n_match < (int)row.ids.size() && g.ids[n_match] == row.ids[n_match]) n_match++;
    INFO("first difference at step " << n_match);
    if (n_match < (int)row.ids.size()) CHECK(g.gaps[n_match] < tie_margin);
    CHECK(n_match >= min_steps);
}

// Fed the reference's ids (teacher forcing, so a near-tie does not end the comparison): every
// step's pick is the reference's or within tie_margin logits of it, and at least min_equal steps
// are equal. Reports the count.
inline void check_teacher_forced(const steward::Model& model, const LlamaGreedyRow& row, float tie_margin,
                                 int min_equal) {
    const Greedy g = greedy_with_margins(model, row.prompt, row.ids, true);
    int n_equal = 0;
    for (size_t k = 0; k < row.ids.size(); k++) {
        INFO("step " << k << ": ours " << g.ids[k] << ", the reference's " << row.ids[k] << ", gap " << g.gaps[k]);
        CHECK((g.ids[k] == row.ids[k] || g.gaps[k] < tie_margin));
        n_equal += g.ids[k] == row.ids[k];
    }
    WARN(row.name << ": " << n_equal << " of " << row.ids.size() << " teacher-forced steps equal to llama.cpp's");
    CHECK(n_equal >= min_equal);
}

// Every row of a llama.cpp reference file (tests/data/<x>/llama_greedy.tsv, n_rows rows of 32 ids):
// the model make(row.name) gives tokenizes `text` as llama.cpp did, decodes greedily as it did up to
// the first near-tie (a pick within 0.15 logits) and for min_free steps, and, fed llama.cpp's ids,
// picks its id at min_forced steps or more (within 0.15 at the others).
template <class Make>
void check_llama_greedy_rows(const std::string& tsv, const std::string& text, size_t n_rows, Make make, int min_free,
                             int min_forced) {
    const auto rows = read_llama_greedy_tsv(tsv);
    CHECK(rows.size() == n_rows);
    for (const LlamaGreedyRow& row : rows) {
        REQUIRE(row.ids.size() == 32);
        INFO(row.name);
        const auto model = make(row.name);
        CHECK(model->tokenizer().encode(text, true) == row.prompt);
        check_greedy_up_to_near_tie(*model, row, 0.15f, min_free);
        check_teacher_forced(*model, row, 0.15f, min_forced);
    }
}

}  // namespace steward_test
