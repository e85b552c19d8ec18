// SimBackend: the cost model's time for each forward, the generator's tokens, drafts whose
// acceptance follows the request's drawn rate, and the draft forwards' time.
#include "backend/sim.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>

#include "kv/block_hash.h"  // splitmix64
#include "sim/cost_model.h"
#include "sim/sim_clock.h"
#include "util/thread_cpu.h"

namespace steward {

namespace {
// The synthetic vocabulary's first 259 ids are control and byte tokens: the generator stays above.
constexpr int32_t k_first_text_token = 259;
constexpr int k_source_draft = 2, k_source_self = 3;  // SpecSource::DRAFT, SELF
}  // namespace

SimBackend::SimBackend(const Model& model, std::shared_ptr<const SimPoolConfig> sim, int n_blocks, int block_size,
                       int max_tokens)
    : sim_(std::move(sim)),
      n_vocab_(model.params().n_vocab),
      n_blocks_(n_blocks),
      block_size_(block_size),
      max_tokens_(max_tokens) {
    kv_.n_layer = sim_->model.layers;
    kv_.n_blocks = n_blocks;
    kv_.block_size = block_size;
}

int64_t SimBackend::kv_storage_bytes() const {
    return (int64_t)(sim_kv_bytes_per_token(sim_->model) * block_size_ * n_blocks_);
}

int32_t SimBackend::token(uint64_t id, size_t pos) const {
    const int32_t V = n_vocab_;
    const uint64_t h = splitmix64(sim_->seed ^ splitmix64(id) ^ (0xC2B2AE3D27D4EB4Full * (pos + 1)));
    const int32_t lo = V > k_first_text_token + 1 ? k_first_text_token : 0;
    return lo + (int32_t)(h % (uint64_t)(V - lo));
}

double SimBackend::draw_acceptance(uint64_t id, double mean_in, double conc_in, std::mt19937_64& rng) const {
    const double mean = std::clamp(mean_in >= 0 ? mean_in : sim_->acceptance, 0.0, 1.0);
    const double conc = conc_in > 0 ? conc_in : sim_->concentration;
    rng.seed(splitmix64(sim_->seed ^ 0x5EEDull) ^ splitmix64(id));
    if (mean <= 0 || mean >= 1) return mean;
    // Beta(mean x conc, (1 - mean) x conc) as X / (X + Y) of two Gamma draws.
    std::gamma_distribution<double> ga(mean * conc, 1.0), gb((1 - mean) * conc, 1.0);
    const double x = ga(rng), y = gb(rng);
    return x + y > 0 ? x / (x + y) : mean;
}

std::vector<int32_t> SimBackend::propose(uint64_t id, size_t pos, int k, double alpha, std::mt19937_64& rng) const {
    // How many the target will accept: each position with the request's acceptance, until the first
    // rejection. The draft holds the generator's tokens up to there and a wrong one after.
    std::uniform_real_distribution<double> u(0.0, 1.0);
    int n_acc = 0;
    while (n_acc < k && u(rng) < alpha) n_acc++;
    std::vector<int32_t> d;
    for (int i = 0; i < k; i++) {
        int32_t t = token(id, pos + (size_t)i);
        if (i >= n_acc) t = t + 1 < n_vocab_ ? t + 1 : t - 1;  // not the generator's: rejected there
        d.push_back(t);
    }
    return d;
}

std::vector<double> SimBackend::price_drafts(std::span<const SimDraftWork> work, std::span<const SimSeqWork> decoding,
                                             std::array<double, 4>& per_token_ms) {
    const SimPoolConfig& sim = *sim_;
    // Draft forwards run at each depth over every sequence drafting that deep: depth 0 takes the
    // tokens the draft has not computed (its whole prompt at a first draft, else the target's
    // tokens since its last one), each later depth the draft token before it.
    struct Level {
        std::vector<SimSeqWork> work;
        std::vector<size_t> who;  // indices into work
    };
    std::vector<Level> draft_levels;
    std::map<int, std::vector<Level>> self_by_layers;
    double n_tokens[4] = {0, 0, 0, 0};
    for (size_t w = 0; w < work.size(); w++) {
        const SimDraftWork& d = work[w];
        n_tokens[d.source] += d.k;
        std::vector<Level>& levels = d.source == k_source_draft ? draft_levels : self_by_layers[d.self_layers];
        if ((int)levels.size() < d.k) levels.resize((size_t)d.k);
        const int done = std::min(d.done, d.root);
        levels[0].work.push_back({d.root + 1 - done, done, 1});
        levels[0].who.push_back(w);
        for (int i = 1; i < d.k; i++) {
            levels[(size_t)i].work.push_back({1, d.root + i, 1});
            levels[(size_t)i].who.push_back(w);
        }
    }
    // A draft forward runs inside the target's step (no scheduling or sampling of its own): its
    // overhead is its kernel launches only.
    SimDeviceConfig dev = sim.device;
    dev.step_overhead_us = 0;
    std::vector<double> share(work.size(), 0.0);
    auto price = [&](const SimModelConfig& shape, const std::vector<Level>& levels) {
        double sum = 0;
        for (const Level& l : levels) {
            if (l.work.empty()) continue;
            const double t = sim_step_cost(dev, shape, sim.tp, l.work).total_s;
            sum += t;
            for (size_t w : l.who) share[w] += t / (double)l.who.size();  // each drafter's share of the level
        }
        return sum;
    };
    double total = 0;
    if (sim.draft) total += price(*sim.draft, draft_levels);
    for (const auto& [layers, levels] : self_by_layers) {
        SimModelConfig shape = sim.model;
        shape.layers = layers;
        total += price(shape, levels);
    }
    // The per-token figure the speculation policies read: a draft forward at one depth costs about
    // the same for one sequence as for the whole batch (it streams the draft's weights either way),
    // so a draft token's price is that forward's share when every decoding sequence of the batch
    // drafts at that depth. (What one lone drafter pays, the whole forward, would keep every
    // per-sequence policy at k = 0 for good: none starts drafting alone, so none ever shares.) The
    // device time charged above is what was really drafted.
    for (int src : {k_source_draft, k_source_self}) {
        if (n_tokens[src] <= 0 || decoding.empty()) continue;
        double per = 0;
        if (src == k_source_draft && sim.draft) per = sim_step_cost(dev, *sim.draft, sim.tp, decoding).total_s;
        if (src == k_source_self && !self_by_layers.empty()) {
            SimModelConfig shape = sim.model;
            shape.layers = self_by_layers.begin()->first;
            per = sim_step_cost(dev, shape, sim.tp, decoding).total_s;
        }
        per_token_ms[(size_t)src] = per * 1e3 / (double)decoding.size();
    }
    pending_draft_s_ += total;
    return share;
}

double SimBackend::stream_step_p50_s() const {
    std::vector<double> v;
    for (const auto& [id, a] : streams_)
        if (a.n > 0) v.push_back(a.sum_s / (double)a.n);
    if (v.empty()) return -1;
    std::nth_element(v.begin(), v.begin() + (std::ptrdiff_t)(v.size() / 2), v.end());
    return v[v.size() / 2];
}

double SimBackend::median_step_s() const {
    if (figures_.step_s.empty()) return -1;
    std::vector<float> v = figures_.step_s;
    std::nth_element(v.begin(), v.begin() + (std::ptrdiff_t)(v.size() / 2), v.end());
    return v[v.size() / 2];
}

void SimBackend::begin_step() {
    step_start_ = std::chrono::steady_clock::now();
    step_start_cpu_s_ = thread_cpu_seconds();
}

Expected<bool> SimBackend::forward(std::span<const SeqInput> batch, std::vector<float>& logits) {
    logits.clear();
    decided_.clear();
    work_.clear();
    for (const SeqInput& in : batch) {
        const int n = (int)in.tokens.size();
        const int n_logits = in.logits == LogitsMode::ALL ? n : in.logits == LogitsMode::LAST ? 1 : 0;
        work_.push_back({n, in.n_past, n_logits});
        // Row i's token is the generator's at the position after the row's token.
        if (in.logits == LogitsMode::ALL)
            for (int i = 0; i < n; i++) decided_.push_back(token(in.id, (size_t)(in.n_past + i + 1)));
        else if (in.logits == LogitsMode::LAST)
            decided_.push_back(token(in.id, (size_t)(in.n_past + n)));
    }
    // The device's time for this step: the drafts' forwards, then the target's over the batch.
    const SimStepCost cost = sim_step_cost(sim_->device, sim_->model, sim_->tp, work_);
    const double draft_s = pending_draft_s_;
    pending_draft_s_ = 0;
    figures_.device_s += draft_s + cost.total_s;
    figures_.gemm_s += cost.gemm_s;
    figures_.attn_s += cost.attn_s;
    figures_.comm_s += cost.comm_s;
    figures_.overhead_s += cost.overhead_s;
    figures_.draft_s += draft_s;
    if (figures_.step_s.size() < (size_t)1 << 20) figures_.step_s.push_back((float)(draft_s + cost.total_s));
    int64_t n_out = 0;  // sequences that get a token from this step
    for (const SeqInput& in : batch) {
        if (in.logits == LogitsMode::NONE) continue;
        n_out++;
        auto it = streams_.find(in.id);
        if (it == streams_.end()) {
            if (streams_.size() >= (size_t)1 << 20) continue;
            it = streams_.emplace(in.id, StreamSteps{}).first;
        }
        StreamSteps& a = it->second;
        if (a.started) a.sum_s += draft_s + cost.total_s, a.n++;
        a.started = true;
    }
    figures_.seq_step_s += (draft_s + cost.total_s) * (double)n_out;
    figures_.n_seq_steps += n_out;
    last_device_s_ = cost.total_s;
    // Sleep until the step's start + its device time in real seconds; the host's work so far
    // (scheduling, KV calls, the previous step's events) overlaps it. A host slower than that is
    // an overrun: the simulated time then stretches.
    const double budget_s = (draft_s + cost.total_s) / time_dilation();
    const auto until = step_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                         std::chrono::duration<double>(budget_s));
    if (const auto now = std::chrono::steady_clock::now(); now > until) {
        figures_.overruns++;
        figures_.overrun_s += std::chrono::duration<double>(now - until).count();
        if (thread_cpu_seconds() - step_start_cpu_s_ < budget_s) figures_.overruns_waiting++;
    } else {
        std::this_thread::sleep_until(until);
    }
    return true;
}

}  // namespace steward
