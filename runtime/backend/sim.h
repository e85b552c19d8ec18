// The simulated backend (backend = "sim", docs/sim.md): a peer of cpu.h and cuda.h for planning at
// scale. The model is a shape without weights; a forward computes nothing but prices the batch on
// the cost model (sim/cost_model.h), sleeps until the step's start plus that time divided by the
// clock's dilation (the host's own work overlaps it, as a GPU runs ahead of its host), and decides
// the target's tokens itself: a deterministic generator, a hash of the sequence and the position,
// never end-of-generation. Its drafts are the generator's tokens up to a point drawn with the
// request's acceptance, then a wrong one, so speculation's accepted lengths, rollbacks and KV
// effects are the engine's real ones. KV is bookkeeping only: the copies do nothing.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "sim/cost_model.h"
#include <steward/config.h>

namespace steward {

// What one step's drafts would have run on the device: a sequence drafting k tokens after its
// root (position root), of which the draft has computed the first `done` tokens already. source:
// 2 a draft model, 3 a self-draft of self_layers layers (the values of SpecSource; n-gram drafts
// cost no device time and are not listed).
struct SimDraftWork {
    size_t entry = 0;  // the sequence's index in the step's batch
    int source = 0;
    int self_layers = 0;
    int root = 0;
    int done = 0;
    int k = 0;
};

// The device time a simulated pool spent, summed over its steps (simulated seconds), and the steps
// whose host work took longer than their cost / dilation (the simulation ran slow there).
struct SimFigures {
    double device_s = 0;
    double gemm_s = 0, attn_s = 0, comm_s = 0, overhead_s = 0, draft_s = 0;
    int64_t overruns = 0;
    double overrun_s = 0;  // by how much they overran, summed (real seconds)
    // Overruns whose host thread used less CPU time over the step's host work than the step's
    // device time / dilation: its own work fitted, and it waited (on another thread, or for a core).
    int64_t overruns_waiting = 0;
    // Each step's device time (drafts and target), the first 1M steps: a client's time between
    // tokens compares with their median, not with the mean, which the ramp's small batches pull down.
    std::vector<float> step_s;
    // Each step's device time once per sequence that got a token in it, summed, and that count: their
    // ratio is the step a stream waits on average between its tokens (a chunk per step), weighted as
    // the streams live it (a long step with 256 of them counts 256 times, a ramp's step with 3 of
    // them 3 times). A client's time between chunks compares with it.
    double seq_step_s = 0;
    int64_t n_seq_steps = 0;
};

class SimBackend final : public ForwardBackend {
public:
    SimBackend(const Model& model, std::shared_ptr<const SimPoolConfig> sim, int n_blocks, int block_size,
               int max_tokens);

    std::string describe() const override { return "sim"; }
    // Prices the batch (and the drafts given to price_drafts since the last forward), sleeps until
    // the step's start + that time / dilation, and leaves the generator's token for every logits
    // row in decided_tokens(); logits comes back empty.
    Expected<bool> forward(std::span<const SeqInput> batch, std::vector<float>& logits) override;
    std::span<const int32_t> decided_tokens() const override { return decided_; }
    void begin_step() override;
    double forward_time_s() const override { return last_device_s_; }  // the target forward's device time
    Expected<bool> copy_block_slots(int, int, int) override { return true; }
    Expected<bool> copy_slots(std::span<const int32_t>, std::span<const int32_t>, std::span<const int32_t>,
                              std::span<const int32_t>) override {
        return true;
    }
    const KvConfig& kv_config() const override { return kv_; }
    int64_t kv_storage_bytes() const override;  // the simulated model's KV for n_blocks blocks
    int max_tokens() const override { return max_tokens_; }
    int n_layers() const override { return sim_->model.layers; }
    ThreadPool& host_threads() override { return threads_; }

    const SimPoolConfig& config() const { return *sim_; }
    bool has_draft() const { return sim_->draft.has_value(); }
    // The generator's token at position pos of sequence id.
    int32_t token(uint64_t id, size_t pos) const;
    // A request's acceptance per draft position, drawn from Beta(mean x conc, (1 - mean) x conc)
    // (mean < 0 / conc <= 0: the pool's figures), and rng seeded for its later draws.
    double draw_acceptance(uint64_t id, double mean, double conc, std::mt19937_64& rng) const;
    // A draft of k tokens for sequence id whose next position is pos: the generator's tokens up to
    // the first rejection (each position accepted with alpha, drawn from rng), a wrong one from
    // there on.
    std::vector<int32_t> propose(uint64_t id, size_t pos, int k, double alpha, std::mt19937_64& rng) const;
    // Prices this step's draft forwards (each depth one forward over every sequence drafting that
    // deep) into the next forward's time. Returns each listed draft's share of that time (seconds,
    // in work's order) and sets per_token_ms[source] for sources drafted this step: a draft
    // token's price when each of the step's n_decoding decoding sequences drafts at that depth.
    std::vector<double> price_drafts(std::span<const SimDraftWork> work, std::span<const SimSeqWork> decoding,
                                     std::array<double, 4>& per_token_ms);
    const SimFigures& figures() const { return figures_; }
    double median_step_s() const;  // of figures().step_s; -1 before the first step
    // Per stream (request), the mean device time of the steps that gave it a token after its first
    // one (what its client's time between chunks averages: a chunk per step); the median over the
    // streams with two tokens or more, -1 before there is one. A client's TPOT p50 compares with it.
    double stream_step_p50_s() const;

private:
    std::shared_ptr<const SimPoolConfig> sim_;
    int32_t n_vocab_;
    int n_blocks_, block_size_, max_tokens_;
    KvConfig kv_;
    ThreadPool threads_{1};
    std::vector<int32_t> decided_;
    std::vector<SimSeqWork> work_;
    double pending_draft_s_ = 0;
    double last_device_s_ = 0;
    SimFigures figures_;
    struct StreamSteps {
        double sum_s = 0;  // the steps after its first token's
        int64_t n = 0;
        bool started = false;
    };
    std::unordered_map<uint64_t, StreamSteps> streams_;  // by request id (at most 1M kept)
    std::chrono::steady_clock::time_point step_start_ = std::chrono::steady_clock::now();
    double step_start_cpu_s_ = 0;  // the calling thread's CPU time at begin_step
};

}  // namespace steward
