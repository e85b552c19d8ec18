// The engine's simulated backend (EngineOptions::sim): the generator's tokens, drafts whose
// acceptance follows the request's drawn rate, the draft forwards' time, and the commit of a step
// that ran no forward. Scheduling, KV bookkeeping, the prefix cache, preemption, the speculation
// policy and the verification's commit are the real engine's (engine.cpp, speculate.cpp).
#include <algorithm>
#include <cmath>
#include <map>

#include "sched/engine.h"
#include "kv/block_hash.h"  // splitmix64
#include "sim/cost_model.h"

namespace steward {

namespace {
// The synthetic vocabulary's first 259 ids are control and byte tokens: the generator stays above.
constexpr int32_t k_first_text_token = 259;
}  // namespace

int32_t Engine::sim_token(const Seq& s, size_t pos) const {
    const int32_t V = model_.params().n_vocab;
    const uint64_t h = splitmix64(opt_.sim->seed ^ splitmix64(s.req.id) ^ (0xC2B2AE3D27D4EB4Full * (pos + 1)));
    const int32_t lo = V > k_first_text_token + 1 ? k_first_text_token : 0;
    return lo + (int32_t)(h % (uint64_t)(V - lo));
}

void Engine::sim_init(Seq& s) {
    const SimPoolConfig& sim = *opt_.sim;
    const double mean = std::clamp(s.req.sim_acceptance >= 0 ? s.req.sim_acceptance : sim.acceptance, 0.0, 1.0);
    const double conc = s.req.sim_concentration > 0 ? s.req.sim_concentration : sim.concentration;
    s.sim_rng.seed(splitmix64(sim.seed ^ 0x5EEDull) ^ splitmix64(s.req.id));
    if (mean <= 0 || mean >= 1) {
        s.sim_alpha = mean;
        return;
    }
    // Beta(mean x conc, (1 - mean) x conc) as X / (X + Y) of two Gamma draws.
    std::gamma_distribution<double> ga(mean * conc, 1.0), gb((1 - mean) * conc, 1.0);
    const double x = ga(s.sim_rng), y = gb(s.sim_rng);
    s.sim_alpha = x + y > 0 ? x / (x + y) : mean;
}

SpecDraft Engine::sim_propose(Seq& s, int k) {
    // How many the target will accept: each position with the request's acceptance, until the first
    // rejection. The draft holds the generator's tokens up to there and a wrong one after.
    std::uniform_real_distribution<double> u(0.0, 1.0);
    int n_acc = 0;
    while (n_acc < k && u(s.sim_rng) < s.sim_alpha) n_acc++;
    SpecDraft d;
    const size_t pos = s.all_tokens.size();  // the first draft token's position (the root is pos - 1)
    const int32_t V = model_.params().n_vocab;
    for (int i = 0; i < k; i++) {
        int32_t t = sim_token(s, pos + (size_t)i);
        if (i >= n_acc) t = t + 1 < V ? t + 1 : t - 1;  // not the generator's: rejected there
        d.tokens.push_back(t);
    }
    return d;
}

double Engine::sim_draft_s(const std::vector<uint64_t>& ids, const std::vector<SpecDraft>& drafts) {
    const SimPoolConfig& sim = *opt_.sim;
    // Draft forwards run at each depth over every sequence drafting that deep: depth 0 takes the
    // tokens the draft has not computed (its whole prompt at a first draft, else the target's
    // tokens since its last one), each later depth the draft token before it. n-gram drafts cost
    // no device time.
    struct Level {
        std::vector<SimSeqWork> work;
        std::vector<size_t> who;
    };
    std::vector<Level> draft_levels;
    std::map<int, std::vector<Level>> self_by_layers;
    double n_tokens[4] = {0, 0, 0, 0};
    for (size_t k = 0; k < ids.size(); k++) {
        const int n = drafts[k].k();
        if (n == 0) continue;
        Seq& s = *seqs_.at(ids[k]);
        const SpecSource src = s.req.spec.source;
        n_tokens[(int)src] += n;
        if (src == SpecSource::NGRAM || src == SpecSource::NONE) continue;
        std::vector<Level>& levels = src == SpecSource::DRAFT ? draft_levels : self_by_layers[s.req.spec.self_layers];
        if ((int)levels.size() < n) levels.resize((size_t)n);
        const int root = (int)s.all_tokens.size() - 1;
        const int done = std::min(s.sim_draft_computed, root);
        levels[0].work.push_back({root + 1 - done, done, 1});
        levels[0].who.push_back(k);
        for (int i = 1; i < n; i++) {
            levels[(size_t)i].work.push_back({1, root + i, 1});
            levels[(size_t)i].who.push_back(k);
        }
    }
    // A draft forward runs inside the target's step (no scheduling or sampling of its own): its
    // overhead is its kernel launches only.
    SimDeviceConfig dev = sim.device;
    dev.step_overhead_us = 0;
    auto price = [&](const SimModelConfig& shape, const std::vector<Level>& levels) {
        double sum = 0;
        for (const Level& l : levels) {
            if (l.work.empty()) continue;
            const double t = sim_step_cost(dev, shape, sim.tp, l.work).total_s;
            sum += t;
            for (size_t k : l.who) {  // each drafting sequence's share of the level
                seqs_.at(ids[k])->draft_s += t / (double)l.who.size();
                stats_.draft_s += t / (double)l.who.size();
            }
        }
        return sum;
    };
    double t_by[4] = {0, 0, 0, 0};  // by SpecSource
    if (sim.draft) t_by[(int)SpecSource::DRAFT] = price(*sim.draft, draft_levels);
    for (const auto& [layers, levels] : self_by_layers) {
        SimModelConfig shape = sim.model;
        shape.layers = layers;
        t_by[(int)SpecSource::SELF] += price(shape, levels);
    }
    // The per-token figure the speculation policies read: a draft forward at one depth costs about
    // the same for one sequence as for the whole batch (it streams the draft's weights either way),
    // so a draft token's price is that forward's share when every decoding sequence of the batch
    // drafts at that depth. (What one lone drafter pays, the whole forward, would keep every
    // per-sequence policy at k = 0 for good: none starts drafting alone, so none ever shares.) The
    // device time charged above is what was really drafted.
    std::vector<SimSeqWork> all;
    for (size_t k = 0; k < ids.size(); k++) {
        const Seq& s = *seqs_.at(ids[k]);
        if (s.n_generated > 0) all.push_back({1, (int)s.all_tokens.size(), 1});
    }
    for (int src : {(int)SpecSource::NGRAM, (int)SpecSource::DRAFT, (int)SpecSource::SELF}) {
        if (n_tokens[src] <= 0 || all.empty()) continue;
        double per = 0;
        if (src == (int)SpecSource::DRAFT && sim.draft) per = sim_step_cost(dev, *sim.draft, sim.tp, all).total_s;
        if (src == (int)SpecSource::SELF && !self_by_layers.empty()) {
            SimModelConfig shape = sim.model;
            shape.layers = self_by_layers.begin()->first;
            per = sim_step_cost(dev, shape, sim.tp, all).total_s;
        }
        per = per * 1e3 / (double)all.size();
        double& m = draft_ms_per_token_[src];
        m = m < 0 ? per : m + 0.1 * (per - m);
    }
    const double total = t_by[(int)SpecSource::DRAFT] + t_by[(int)SpecSource::SELF];
    return total;
}

SpecResult Engine::sim_verify(const Seq& s, const SpecDraft& d) const {
    // The target's tokens are the generator's: the draft is accepted up to its first other token.
    SpecResult r;
    const size_t pos = s.all_tokens.size();
    while (r.n_accepted < d.k() && d.tokens[(size_t)r.n_accepted] == sim_token(s, pos + (size_t)r.n_accepted)) {
        r.tokens.push_back(d.tokens[(size_t)r.n_accepted]);
        r.nodes.push_back(r.n_accepted);  // tokens[j] came from node j's row: the root's, then each accepted one's
        r.n_accepted++;
    }
    r.tokens.push_back(sim_token(s, pos + (size_t)r.n_accepted));
    r.nodes.push_back(r.n_accepted);
    return r;
}

std::vector<std::pair<uint64_t, FinishReason>> Engine::sim_commit(const std::vector<std::pair<uint64_t, int>>& plan,
                                                                  const std::vector<SpecDraft>& drafts,
                                                                  const std::vector<SeqInput>& batch,
                                                                  std::vector<EngineEvent>& events) {
    std::vector<std::pair<uint64_t, FinishReason>> done;
    const int ctx = model_.params().n_ctx_train;
    for (size_t k = 0; k < plan.size(); k++) {
        Seq& s = *seqs_.at(plan[k].first);
        const int n = plan[k].second;
        if (drafts[k].k() > 0) {
            const int accepted_before = s.n_accepted_tokens;
            const int root = mgr_.seq(s.kv).n_computed;
            bool fin = false;
            commit_spec(s, drafts[k], sim_verify(s, drafts[k]), {}, events, fin);
            const int n_acc = s.n_accepted_tokens - accepted_before;
            observe_spec(s, drafts[k].k(), n_acc);
            // The draft computed the root and its own tokens but the last; the accepted ones stay.
            if (s.req.spec.source == SpecSource::DRAFT || s.req.spec.source == SpecSource::SELF)
                s.sim_draft_computed = root + 1 + std::min(n_acc, drafts[k].k() - 1);
            stats_.n_decode_tokens += n;
            if (fin) done.push_back({s.req.id, events.back().finish});
            continue;
        }
        const bool wants = batch[k].logits == LogitsMode::LAST;
        mgr_.commit_computed(s.kv, n);
        if (opt_.prefix_cache) mgr_.publish_full_blocks(s.kv);
        if (s.n_generated == 0 || !wants) stats_.n_prompt_tokens_computed += n;
        else stats_.n_decode_tokens += n;
        if (!wants) continue;
        const int32_t tok = sim_token(s, s.all_tokens.size());
        EngineEvent e = make_event(s);
        s.all_tokens.push_back(tok);
        mgr_.append_tokens(s.kv, std::span<const int32_t>(&tok, 1));
        s.n_generated++;
        e.tokens.push_back(tok);
        e.logprobs.push_back(0.0f);
        if (s.n_generated >= s.req.max_tokens || (int)s.all_tokens.size() >= ctx) {
            e.finished = true;
            e.finish = FinishReason::LENGTH;
            done.push_back({s.req.id, e.finish});
        }
        events.push_back(std::move(e));
    }
    return done;
}

}  // namespace steward
