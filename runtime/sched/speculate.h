// Chain speculation for the engine: per-request settings, drafting a sequence's next k tokens
// (n-gram lookup, or a draft model with its own KV kept in step with the target), and turning the
// target's verification rows into the tokens to append (verify_greedy / verify_sampled).
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "cpu/forward.h"
#include "cpu/sampling.h"
#include "kv/kv_manager.h"
#include "kv/kv_storage.h"
#include "spec/acceptance.h"
#include "util/error.h"

namespace steward {

enum class SpecSource { NONE, NGRAM, DRAFT };

// A request's speculation: which draft source, and the chain length k (draft tokens verified per
// step at most; the step's leftover token budget, max_tokens and the context can shorten it).
struct SpecSettings {
    SpecSource source = SpecSource::NONE;
    int k = 0;            // [0, k_max_spec_tokens]; 0 means off
    int ngram_min_n = 1;  // NGRAM: tail lengths tried, longest first (ngram.h)
    int ngram_max_n = 3;
    bool enabled() const { return source != SpecSource::NONE && k > 0; }
};
constexpr int k_max_spec_tokens = 16;

// The rule for the settings at submit: k in [0, 16], 1 <= ngram_min_n <= ngram_max_n <= 16, DRAFT
// only when the engine has a draft model. An error names the field and its value. Pure.
Expected<bool> check_spec_settings(const SpecSettings& s, bool has_draft_model);

// A draft model must share the target's vocabulary: the same size, the same token texts and the
// same EOS; otherwise its tokens would mean something else to the target. Pure.
Expected<bool> check_draft_model(const Model& target, const Model& draft);

// One sequence's draft for one step.
struct SpecDraft {
    DraftKind kind = DraftKind::CHOSEN;
    std::vector<int32_t> tokens;  // [k] the chain after the root (the sequence's last token)
    // SAMPLED only: [k + 1][n_vocab], row i the draft's distribution q the token after node i was
    // drawn from (the last row, after the chain's leaf, is never read and left zero).
    std::vector<float> probs;
    int k() const { return (int)tokens.size(); }
};

// The n-gram draft of up to k tokens over the prompt and output so far (CHOSEN). Pure.
SpecDraft draft_ngram(std::span<const int32_t> all_tokens, const SpecSettings& s, int k);

// What a verification gives: the accepted draft tokens, then the target's own token (the
// replacement of the first rejected one, or the bonus after a fully accepted chain).
struct SpecResult {
    int n_accepted = 0;
    std::vector<int32_t> tokens;  // [n_accepted + 1]
};
// rows: [draft.k() + 1][n_vocab] the target's logits after the root and each draft token, with the
// request's logit adjustments already applied. Greedy sampling (temperature <= 0) uses
// verify_greedy; otherwise verify_sampled with the draft's kind, drawing from rng (the request's
// sampler's). Lossless: the tokens are distributed as sampling from the target one at a time.
SpecResult verify_chain(const SpecDraft& draft, std::span<const float> rows, int32_t n_vocab,
                        const SamplingParams& sp, std::mt19937_64& rng);

// The draft model's side: its forward, its KV storage and block tables (a KvManager of its own,
// never a prefix cache). Each target sequence that drafts with it owns one draft sequence whose
// tokens are a prefix of the target's; before drafting it catches up on the tokens it has not
// computed, and after verification it is rolled back to the target's accepted tokens. Not
// thread-safe: one owner (the Engine).
class DraftModel {
public:
    // n_blocks blocks of block_size slots in the draft's own geometry; max_tokens bounds one
    // forward (catch-up is chunked to it).
    DraftModel(const Model& draft, int n_blocks, int block_size, KvDtype dtype, int n_threads, int max_tokens);

    // Drafts up to k tokens after all_tokens (the target's prompt + output; its last token is the
    // root). Greedy params take the draft's argmax (CHOSEN); sampled ones draw from the draft's
    // sampling_distribution (SAMPLED, probs filled) with rng. *seq is the draft sequence (0: none
    // yet, created here). Fewer tokens (maybe none) come back when the draft's pool lacks room:
    // speculation is an optimisation and never preempts. Errors are the forward's.
    Expected<SpecDraft> propose(SeqId* seq, std::span<const int32_t> all_tokens, int k, const SamplingParams& sp,
                                std::mt19937_64& rng);
    // Keeps only the draft KV of the first n_valid tokens (the target's accepted ones).
    void rollback(SeqId seq, int n_valid);
    // Frees a draft sequence (no-op for 0) and sets it to 0.
    void release(SeqId* seq);

    const KvManager& manager() const { return mgr_; }
    const Model& model() const { return model_; }
    int64_t bytes() const { return kv_.bytes(); }

private:
    bool grow(SeqId seq, std::span<const int32_t> tokens);  // append + allocate; false without room

    const Model& model_;
    CpuForward fwd_;
    KvStorage kv_;
    KvManager mgr_;
    std::vector<float> logits_;
};

// The split of one pool's KV budget when a draft model joins it: n_blocks target blocks' worth of
// bytes are shared so that both get the same block count (every target slot has a draft slot), i.e.
// the draft's share is its bytes per block over both models' bytes per block. Pure.
int32_t shared_kv_blocks(const Model& target, const Model& draft, int32_t n_blocks, int block_size, KvDtype dtype);

}  // namespace steward
