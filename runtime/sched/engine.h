// One pool's engine: the continuous-batching scheduler over a model, its paged KV (KvManager) and a
// backend (backend/: cpu, cuda or sim). Plain C++, one owner thread (the pool's executor actor, or
// a test). Each step() goes along three seams: the scheduler's plan (which sequences, how many
// tokens each, which drafts; engine.cpp's schedule), the runner that turns the plan into logits
// through the backend in ONE forward (run), and the update that turns logits into tokens, KV
// commits and events (update; the speculative commit in speculate.cpp).
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <steward/config.h>
#include <steward/finish_reason.h>

#include "backend/backend.h"
#include "backend/sim.h"
#include "cpu/forward.h"
#include "cpu/sampling.h"
#include "grammar/grammar.h"
#include "kv/kv_manager.h"
#include "kv/kv_storage.h"
#include "kv/kv_tier.h"
#include "metrics/run_figures.h"
#include "sched/spec_policy.h"
#include "sched/speculate.h"
#include "spec/goodput.h"

namespace steward {

struct EngineOptions {
    int n_blocks = 256;
    int block_size = 16;
    KvDtype kv_dtype_k = KvDtype::F32;  // the KV cache's K and V types (kv/kv_storage.h)
    KvDtype kv_dtype_v = KvDtype::F32;
    int max_batch = 32;          // sequences per step
    int max_batch_tokens = 512;  // token budget per step; prefill is chunked to fit
    int max_queue = 256;         // waiting requests; past it submit() refuses (overloaded)
    int n_threads = 0;
    bool prefix_cache = true;
    double session_ttl_s = 60.0;
    // Speculation's cap on a step that also holds sequences not drafting (other buckets, controls,
    // prefill chunks): the step's drafts may add at most this share of its predicted plain forward
    // time, each draft token priced at the measured cost per verified token plus its source's cost
    // per drafted token. 0: no cap (the default here; a pool's config sets spec_max_slowdown).
    double spec_max_slowdown = 0.0;
    // Prefill order within a priority: shortest remaining prompt first with aging (true), or by
    // arrival (false: FCFS, what the engine did before; bench_sched compares the two).
    bool prefill_srpt = true;
    bool kv_events = false;  // record block stored / removed events for take_kv_events (a cache actor)
    // KV tiers below the pool (kv/kv_tier.h; null: none). Cached blocks the pool evicts are demoted
    // into them with their bytes; a prompt's blocks missing from the pool but held by a tier are
    // promoted back at admission (counted as cached tokens); at destruction every cached block is
    // written to the disk tier. Its identity's payload_bytes must be the backend's block size (the
    // constructor throws std::invalid_argument otherwise); a backend without KV bytes (sim) refuses.
    std::shared_ptr<KvTiers> kv_tiers;
    // A draft model for requests with spec.source DRAFT (not owned; outlives the engine). It must
    // share the target's vocabulary (check_draft_model; the Engine constructor throws
    // std::invalid_argument naming the mismatch otherwise). Its KV comes out of the same budget: the
    // n_blocks target blocks' worth of bytes are split so that target and draft get the same block
    // count (shared_kv_blocks), so with a draft the target has fewer than n_blocks blocks.
    const Model* draft_model = nullptr;
    // Optional: keeps draft_model alive as long as the engine (a pool's loaded draft).
    std::shared_ptr<const Model> draft_model_keep;
    // Self-drafts the budget makes room for: the layer counts (each below the target's) of the
    // SELF speculation the pool's buckets name. Each holds a slot for every target slot in its
    // self_layers layers, so the n_blocks worth of bytes are split between the target, the draft
    // model and these (shared_kv_blocks). A SELF request with another layer count still drafts, its
    // KV then outside the budget.
    std::vector<int> self_draft_layers;
    // The simulated backend (backend = "sim", backend/sim.h): the model is a shape without weights;
    // a step's forward sleeps the cost model's time for its batch (the target's forward and, when
    // sequences speculate, the draft's) divided by the clock's dilation, counted from the step's
    // start (the host's own work overlaps it). Tokens come from a deterministic generator (a hash of
    // the request and the position; never end-of-generation, so a request produces max_tokens); a
    // draft token is accepted with the request's acceptance (drawn from its bucket's Beta
    // distribution at submit), so speculation's accepted lengths, rollbacks and KV effects are real
    // while its tokens are the generator's. KV blocks are bookkeeping only (no storage);
    // structured-output grammars are not applied. null: the backend factory's forward.
    std::shared_ptr<const SimPoolConfig> sim;
    // What the forwards run on: the target's, the draft model's and each self-draft's backend come
    // from it (null: the CPU backend, backend/cpu.h; a pool with backend = "cuda" passes the CUDA
    // one, backend/cuda.h). The constructor throws std::runtime_error with the factory's error (a
    // device out of memory) for the target, the draft model and the self-drafts of
    // self_draft_layers (made with the engine); a self-draft of another layer count, made at its
    // first request, that fails is logged and its requests decode without drafts. A backend with
    // a max_context() refuses at submit the requests that could outgrow it.
    BackendFactory backend;
};

// One run of a request on a pool: what to run. It crosses the actors and the wire as it is (its
// inspect, actors/messages.hpp, carries the fields down to grammar_text); the executor that runs
// it resolves the rest from its own config (the bucket's policies by bucket_index / bucket in
// generation, the grammar compiled from grammar_kind / grammar_text).
struct EngineRequest {
    uint64_t id = 0;
    int32_t tenant = 0;
    std::string tenant_name;   // what eviction policies are told (the engine keeps id -> name); "" unknown
    uint64_t salt = 0;         // prefix-cache salt of the tenant (config); 0: derived from tenant
    std::vector<int32_t> prompt;
    int max_tokens = 16;
    SamplingParams sampling;
    int priority = 0;          // higher first; the lowest running one is preempted first
    double arrival_s = 0.0;    // engine clock (seconds)
    double deadline_s = 0.0;   // 0: none
    std::string session;       // non-empty: keep this conversation's KV pinned after it finishes
    bool stop_at_eos = true;
    int32_t kv_quota_blocks = -1;  // the tenant's KV quota (eviction policies see it); -1: none
    std::string bucket;            // the workload bucket (the eviction counts; a worker finds its policies by it)
    int32_t bucket_index = -1;     // into the config generation's buckets
    uint64_t generation = 0;       // the config generation the request was routed in
    // Structured output as asked: a ConstraintKind (grammar/constraint.h) and its text (0: none).
    int32_t grammar_kind = 0;
    std::string grammar_text;
    // Referenced documents (docs/reuse.md; KvManager::set_reuse): full prompt blocks within the first
    // reuse_priority_tokens get reuse priority; those ending past reuse_keyed_from carry reuse_keys
    // (reuse::document_key of each document), which invalidate_reuse drops.
    int32_t reuse_priority_tokens = 0;
    int32_t reuse_keyed_from = 0;
    std::vector<uint64_t> reuse_keys;
    // The requester reads the tokens only at the end (no streaming callback, stop strings or cascade
    // check): the executor may hold its events back and send them merged (sched/token_batcher.h).
    bool batch_tokens = false;

    // ---- resolved on the pool, not carried:
    // The bucket's eviction policy: reclaims cached blocks when this request needs room (null: LRU).
    std::shared_ptr<EvictionPolicy> eviction;
    std::string eviction_name = "lru";  // the policy's name in the eviction counts
    SpecSettings spec;             // speculative decoding for this request (off by default)
    // The bucket's speculation policy (null: spec.k every step). With one, every decode step asks it
    // for this sequence's k in [0, spec.k] (spec.k is then the limit, max_budget in policy.h); an
    // invalid answer is counted by the policy and decodes plainly (k = 0) that step.
    std::shared_ptr<DraftBudgetPolicy> speculation;
    // Structured output (null: unconstrained). Every sampled token is one the grammar allows at that
    // point (the mask is applied to the logits after bias and penalties, before temperature, top-k
    // and top-p, greedy included); end-of-generation only where the grammar may end. The request
    // finishes STOP once the grammar allows nothing but the end, and ERROR (naming the output so
    // far) if it allows nothing at all. Speculation stays on: each verified row is masked by the
    // grammar state on its draft path, so the output equals the unspeculated one (greedy) or is
    // distributed as it (sampled). The forced-token hook does not apply to constrained requests.
    std::shared_ptr<const CompiledGrammar> grammar;
    // Simulated pools: the bucket's draft acceptance per position and its Beta concentration
    // ([bucket.sim]; < 0: the pool's [pool.sim] figures).
    double sim_acceptance = -1, sim_concentration = -1;
};

// Cached blocks reclaimed while allocating for requests of one bucket under one policy.
struct EvictionCount {
    std::string bucket, policy;
    int64_t n = 0;
};


// What a step produced for one request, and the request's own figures so far (RunFigures: every
// event carries them; read them on finish).
struct EngineEvent : RunFigures {
    uint64_t id = 0;
    std::vector<int32_t> tokens;  // new tokens this step (0 or 1; speculating, up to its accepted drafts + 1)
    std::vector<std::vector<TokenLogprob>> top_logprobs;  // per token, with sampling.n_top_logprobs > 0
    std::vector<float> logprobs;
    // When each token's step ended (the executor's clock), for a run whose events a TokenBatcher
    // merged (EngineRequest::batch_tokens); empty otherwise (each token's time is the event's arrival).
    std::vector<double> token_t_s;
    bool finished = false;
    FinishReason finish = FinishReason::STOP;  // meaningful when finished
    std::string error;             // set with ERROR / TIMEOUT / CANCELLED
    double first_scheduled_s = -1; // when the request first entered a batch
    double t_s = 0;                // when its step ended (the executor's clock, now_s())
};

// Fault injection for tests: while set, every Engine calls it before each forward with the ids of
// the step's batch; whatever it throws is handled as a failing step (see Engine::step). Process-wide
// so that a test through steward::Runtime reaches the engines the runtime builds. Thread-safe.
using ForwardFaultHook = std::function<void(std::span<const uint64_t> batch_ids)>;
void set_forward_fault_hook(ForwardFaultHook hook);  // an empty function removes it

// Forced output for tests (a model whose output is known: tool calls, stop strings through HTTP):
// while set, every Engine asks it for each sampled token with the request's output length so far;
// an id >= 0 replaces the sample (its logprob is the distribution's), -1 keeps it. Thread-safe.
using ForcedTokenHook = std::function<int32_t(int n_generated)>;
void set_forced_token_hook(ForcedTokenHook hook);  // an empty function removes it

struct EngineStats {
    int64_t n_steps = 0;
    int64_t n_preemptions = 0;
    int64_t n_recomputed_tokens = 0;
    int64_t n_session_evictions = 0;
    int64_t n_prompt_tokens_computed = 0;
    int64_t n_decode_tokens = 0;
    // Wall time inside step() and, of it, inside the forward: what the scheduler's own bookkeeping
    // (scheduling, KV calls, sampling, events) costs is step_s - forward_s, free of the machine's
    // load as a share (bench_runtime prints it).
    double step_s = 0, forward_s = 0;
    int64_t n_drafts = 0, n_draft_tokens = 0, n_accepted_tokens = 0, n_rollbacks = 0, n_spec_branches = 0;  // as EngineEvent's
    int64_t n_spec_asks = 0, n_spec_fallbacks = 0;  // speculation policy questions, and invalid answers
    int64_t n_spec_capped = 0;  // drafts left out because the step's spec_max_slowdown allowance was spent
    // A draft model's catch-ups of more than the root and its one accepted token (a first draft:
    // the prompt; after steps at k = 0: the output since): how many, their tokens and time (of draft_s).
    int64_t n_draft_catch_ups = 0, n_draft_catch_up_tokens = 0;
    double draft_catch_up_s = 0;
    double draft_s = 0, verify_s = 0;               // as EngineEvent's, summed over requests
    int64_t n_masked = 0, n_forced = 0;             // as EngineEvent's, summed over requests
    double mask_s = 0;
    int64_t n_mask_cache_hits = 0;                  // masked rows whose mask came from the cache
    // The measured cost model the policies are given (SpecSeqStats): -1 until measured.
    double draft_ms_per_token_ngram = -1, draft_ms_per_token_model = -1;
    double verify_ms = -1, verify_ms_per_token = -1;
    int n_waiting = 0, n_running = 0, n_sessions = 0;
    KvManagerStats kv;
    // KV tiers (none without EngineOptions::kv_tiers): the tiers' own figures, and the promotions
    // (sequences that took at least one block from a tier), their blocks per tier and their time.
    std::optional<KvTierStats> tiers;
    int64_t n_promotions = 0, n_promoted_host_blocks = 0, n_promoted_disk_blocks = 0;
    double promote_s = 0;
    // Simulated pools: the device time of every step (target and draft forwards, in simulated
    // seconds), and the steps whose host work took longer than their cost / dilation (the
    // simulation ran slow there: lower [sim] dilation when they are many).
    double sim_device_s = 0;
    int64_t sim_overruns = 0;
    double sim_overrun_s = 0;  // by how much they overran, summed (real seconds)
    int64_t sim_overruns_waiting = 0;  // of those, the ones whose host thread's own CPU time fitted (it waited)
    double sim_stream_step_s = 0;  // a stream's mean step (SimFigures::seq_step_s / n_seq_steps); 0 without one
    // Of sim_device_s: the target forwards' weight GEMMs, attention, all-reduces and fixed
    // overheads, and the draft forwards (the cost model's terms, summed over steps).
    double sim_gemm_s = 0, sim_attn_s = 0, sim_comm_s = 0, sim_overhead_s = 0, sim_draft_s = 0;
};

// Structured output, shared by the plain and the speculative path: whether a constrained request
// ends at a row whose mask is r (STOP: the grammar is complete and allows nothing but the end;
// ERROR: it allows nothing) or samples (nullopt); and the ERROR's message. Pure.
std::optional<FinishReason> constrained_end(const MaskResult& r, const GrammarMatcher& m, size_t n_eog);
std::string dead_grammar_error(const std::string& output);
// Sets row's logits to -inf where the mask's bit (id / 64, id % 64) is clear.
void apply_mask(std::span<const uint64_t> words, std::span<float> row);

class Engine {
public:
    Engine(const Model& model, const EngineOptions& opt);
    // With a disk tier: writes every cached block of the pool (and of the host tier) to it, so that a
    // restart finds them.
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Validates and queues. Errors (returned, nothing queued): an empty prompt, prompt + max_tokens
    // past the model's context, a request that needs more KV blocks than the whole pool holds, a
    // reused id (code INVALID); a full queue (code OVERLOADED: retry later). Thread: the owner.
    Expected<bool> submit(EngineRequest req);
    // Marks a request cancelled; its event comes at the next step. False when unknown.
    bool cancel(uint64_t id);
    // Runs one step at engine time now_s: expire deadlines and sessions, schedule, forward, sample.
    // Never throws: if anything in the step throws (the forward, sampling, a fault hook), every
    // running request finishes with ERROR naming the failure, their KV is freed, and the engine
    // stays usable for the waiting ones and later submits.
    std::vector<EngineEvent> step(double now_s);
    bool has_work() const { return !waiting_.empty() || !running_.empty() || !cancelled_.empty(); }
    EngineStats stats() const;
    // Sequences running and waiting (queued or preempted) per bucket of their request, in bucket
    // order; the totals are stats()'s n_running and n_waiting. Thread: the owner.
    struct BucketLoad {
        std::string bucket;
        int32_t n_running = 0, n_waiting = 0;
    };
    std::vector<BucketLoad> load_by_bucket() const;
    // KV held per bucket: the distinct blocks referenced by its live sequences and its idle sessions'
    // pinned KV (a block shared by two buckets counts in both), and the bytes one block holds. A walk
    // over the blocks: for the periodic KV samples, not for every step.
    struct BucketKv {
        std::string bucket;
        int64_t n_blocks = 0;
    };
    std::vector<BucketKv> kv_by_bucket() const;
    double kv_block_bytes() const { return (double)be_->kv_storage_bytes() / std::max(1, opt_.n_blocks); }
    const Model& model() const { return model_; }
    const EngineOptions& options() const { return opt_; }
    // What the forwards run on ("cpu", "cuda (device)"; "sim" for a simulated pool).
    std::string backend_name() const { return be_->describe(); }
    // Whether requests may draft with source DRAFT: a draft model, or a simulated pool's draft shape.
    bool has_draft_model() const { return draft_ != nullptr || (sim_ && sim_->has_draft()); }
    // A simulated pool's median step device time in seconds (-1: not simulated, or no step yet).
    // Computed when asked (a copy and a selection over the steps), not in every stats().
    double sim_median_step_s() const { return sim_ ? sim_->median_step_s() : -1; }
    double sim_stream_step_p50_s() const { return sim_ ? sim_->stream_step_p50_s() : -1; }
    int n_sessions() const { return (int)sessions_.size(); }
    const KvManager& kv_manager() const { return mgr_; }
    // The draft model's KV (null without a draft model): tests check its pool drains too.
    const KvManager* draft_kv_manager() const { return draft_ ? &draft_->manager() : nullptr; }
    // The self-draft's KV for requests with spec.source SELF and that self_layers (null until one
    // drafted, or when its backend could not be made): made with the engine for the layer counts
    // of options().self_draft_layers, else on first use, n_blocks slots' worth of self_layers layers (speculate.cpp).
    const KvManager* self_draft_kv_manager(int n_layers) const;
    // Token sequences (of this pool's vocabulary) whose blocks every tenant may share.
    void set_public_prefixes(std::vector<std::vector<int32_t>> p) { mgr_.set_public_prefixes(std::move(p)); }
    // Drops a kept session's KV now.
    void end_session(const std::string& session);
    // A document changed (a new version, a TTL past, a DELETE): the pool's and the tiers' blocks
    // keyed by one of `keys` are dropped (KvManager / KvTiers::invalidate_reuse). Returns how many.
    int invalidate_reuse(std::span<const uint64_t> keys);
    // Evictions since the last call, per (bucket, policy) of the request that needed the blocks.
    std::vector<EvictionCount> take_evictions();
    // Block stored / removed events since the last call, in order (empty unless options().kv_events).
    // With KV tiers, the tiers' events follow the pool's (each tier's in its own order).
    std::vector<KvEvent> take_kv_events();
    // Writes the pool's cached blocks and the host tier's to the disk tier now (what the destructor
    // does); returns the blocks written. 0 without a disk tier.
    int64_t persist_kv();
    // The block hashes findable in the prefix cache now: a new subscriber's starting state.
    std::vector<BlockHash> cached_block_hashes() const { return mgr_.cached_hashes(); }
    // The same with the tiers' blocks: each hash with the tier holding it (a subscriber's start).
    std::vector<KvEvent> cached_block_events() const;

private:
    struct Seq {
        EngineRequest req;
        SeqId kv = 0;            // 0 while not holding KV
        Sampler sampler;
        int n_generated = 0;
        // Its figures (the events carry them). The cache's, like n_cached_prompt_tokens, are those
        // of the first admission only: hits at a re-attach after preemption give back recomputed
        // work (they lower n_recomputed_tokens), not prompt tokens the caller got from the cache.
        RunFigures fig;
        double first_scheduled_s = -1;
        bool reported_first = false;
        std::vector<int32_t> all_tokens;  // prompt + generated (survives preemption)
        SeqId draft_kv = 0;               // the draft model's sequence (0: none)
        DraftModel* draft_owner = nullptr;  // whose sequence draft_kv is (draft_ or a self-draft)
        // What the speculation policy is told (SpecSeqStats): its last answer, the acceptance per
        // position (started from the bucket's), accepted / proposed of recent verifications.
        int last_budget = 0;
        AcceptanceEwma acceptance{k_max_spec_tokens};
        double recent_acceptance = -1;
        AcceptanceEwma* bucket_acceptance = nullptr;  // into Engine::bucket_acceptance_ (stable)
        // Structured output: the grammar's masker on this model's vocabulary and the automaton of
        // the output so far (both unset when unconstrained).
        std::shared_ptr<const TokenMasker> masker;
        std::optional<GrammarMatcher> matcher;
        // Simulated pools: this request's acceptance per draft position, its generator for the
        // acceptance draws, and the tokens a draft model has computed of it (its catch-up).
        double sim_alpha = 0;
        std::mt19937_64 sim_rng;
        int sim_draft_computed = 0;
        explicit Seq(EngineRequest r) : req(std::move(r)), sampler(req.sampling) {}
    };
    struct Session {
        SeqId kv = 0;
        double expires_s = 0;
        std::string bucket;  // the bucket of the turn that pinned it
    };

    void preempt(Seq& s);
    void release(Seq& s, bool keep_session, double now_s);
    bool free_one_session();
    void attach(Seq& s);
    EngineEvent make_event(Seq& s) const;
    // One step along its seams: the scheduler's plan (which sequences, how many tokens each, which
    // drafts), the runner that turns the plan into logits (or decided tokens) through the backend,
    // and the update that turns those into tokens, KV commits and events.
    struct Planned {
        uint64_t id = 0;
        int n = 0;        // tokens it computes: a prefill chunk, one decode token, or the root + its draft
        SpecDraft draft;  // empty: it does not speculate this step
    };
    using StepPlan = std::vector<Planned>;
    void run_step(double now_s, std::vector<EngineEvent>& events);
    StepPlan schedule(double now_s, std::vector<EngineEvent>& events);
    Expected<bool> run(const StepPlan& plan);
    void update(const StepPlan& plan, double now_s, std::vector<EngineEvent>& events);
    // The simulator's draft forwards of the plan, priced into its next forward.
    void price_sim_drafts(const StepPlan& plan);
    // Slots for n more tokens of s (blocks reclaimed by its bucket's eviction policy; must_evict: by
    // LRU regardless, for a request nothing else can make room for); false without room.
    bool alloc_slots(Seq& s, int n, bool must_evict = false);
    // KV tiers: the blocks the pool just evicted, exported and demoted (before anything writes them);
    // and a newly attached sequence's prompt blocks promoted from the tiers past its cached chain.
    void demote_evicted(EvictionPolicy* policy, int32_t tenant);
    void promote(Seq& s);
    void set_reuse(Seq& s);  // the request's documents, on its sequence (KvManager::set_reuse)
    void finish(uint64_t id, FinishReason why, const std::string& err, double now_s, std::vector<EngineEvent>& events);
    void fail_running(const std::string& what, double now_s, std::vector<EngineEvent>& events);
    // Speculation (sched/speculate.cpp): the draft of a decoding sequence for this step (at most
    // max_k tokens, appended to its KV tokens with their slots allocated; empty when it does not
    // speculate), and the commit of its verification rows ([draft.k() + 1][n_vocab]).
    SpecDraft draft_for(Seq& s, int max_k);
    void apply_spec(Seq& s, const SpecDraft& d, std::span<const float> rows, std::vector<EngineEvent>& events,
                    bool& finished);
    // The commit of a verification's result r (apply_spec's second half, shared with the sim):
    // counts, tokens appended under the stop rules, KV kept or rolled back, the event. rows: the
    // verification's rows for logprobs (empty: the sim, logprob 0).
    void commit_spec(Seq& s, const SpecDraft& d, const SpecResult& r, std::span<const float> rows,
                     std::vector<EngineEvent>& events, bool& finished);
    // Releases finished sequences (their KV kept as a session where they name one).
    void retire(const std::vector<std::pair<uint64_t, FinishReason>>& done, double now_s);
    // Structured output: masks one row of logits in place for state m (disallowed ids -inf; with
    // stop_at_eos off, the end too unless it is all that is left) and counts it for s.
    MaskResult mask_row(Seq& s, const GrammarMatcher& m, std::span<float> row);
    std::shared_ptr<const TokenMasker> masker_for(const std::shared_ptr<const CompiledGrammar>& g);
    DraftModel* drafter_for(const SpecSettings& spec);  // draft_, a self-draft, or null (n-gram)
    void release_draft(Seq& s);                         // frees s's draft sequence, if any

    const Model& model_;
    EngineOptions opt_;
    std::unique_ptr<DraftModel> draft_;  // null without options().draft_model
    std::map<int, std::unique_ptr<DraftModel>> self_drafts_;  // by self_layers (null: its backend failed)
    std::unique_ptr<ForwardBackend> be_;
    SimBackend* sim_ = nullptr;  // be_ when the pool is simulated
    // A backend error while copying KV (a device fault) fails the step (step() catches it).
    static void kv_copy(const Expected<bool>& r);
    // A backend from opt_.backend for n_layers of m's layers (0: all) over n_blocks blocks of KV
    // shaped for them; throws std::runtime_error with `what` and the factory's error. A drafter
    // over `draft` on such a backend.
    std::unique_ptr<ForwardBackend> make_backend(const Model& m, int n_layers, const std::string& what);
    std::unique_ptr<DraftModel> make_drafter(const Model& draft, int n_layers);
    KvManager mgr_;
    std::unordered_map<uint64_t, std::unique_ptr<Seq>> seqs_;
    std::deque<uint64_t> waiting_;
    std::vector<uint64_t> running_;
    std::vector<uint64_t> cancelled_;
    std::map<std::string, Session> sessions_;
    EngineStats stats_;
    std::vector<SeqInput> batch_;  // the runner's forward inputs, read by the update
    std::vector<float> logits_;
    std::vector<float> adjusted_;  // scratch: one row of logits after bias and penalties
    std::vector<float> spec_rows_; // scratch: a speculating sequence's rows after bias and penalties
    // Structured output: the vocabulary as bytes (made at the first constrained request), the
    // maskers by grammar (dropped once their grammar is no longer used elsewhere), a mask's words.
    std::shared_ptr<const TokenVocabulary> vocab_;
    std::map<const CompiledGrammar*, std::shared_ptr<const TokenMasker>> maskers_;
    std::vector<uint64_t> mask_words_;
    std::map<std::pair<std::string, std::string>, int64_t> evictions_;  // (bucket, policy) -> n
    std::shared_ptr<KvTiers> tiers_;   // opt_.kv_tiers
    std::vector<uint8_t> tier_buf_;    // one block's bytes, on their way to or from a tier
    std::vector<uint8_t> evict_buf_;   // an evicted block's bytes on their way down (demote_evicted)
    std::vector<std::string> tenant_names_;  // by tenant id, for eviction policies (mgr_ points at it)
    // Speculation's measurements: acceptance per position per bucket (std::map: stable addresses),
    // the forward time fitted against its token count (running means of n, t, n*n, n*t), the mean
    // forward time of verifying steps and the drafting time per draft token per source.
    std::map<std::string, AcceptanceEwma> bucket_acceptance_;
    struct TimeFit {
        double n = 0, t = 0, nn = 0, nt = 0;
        int64_t n_obs = 0;
        void observe(double tokens, double ms);
        double slope() const;            // ms per token; -1 while unknown
        double at(double tokens) const;  // predicted ms; -1 while unknown
    };
    TimeFit forward_fit_;
    // The same over decode steps only (every sequence one token plus its drafts, no prefill chunk):
    // what a draft adds to the step it is verified in. A line through prefill chunks of hundreds of
    // tokens (compute-bound, GEMM) underestimates a few more tokens on a small step 3-5x on the CPU.
    TimeFit decode_fit_;
    double verify_ms_per_token() const;               // decode_fit_'s slope, else forward_fit_'s
    double plain_step_ms(int n_plain_tokens, bool decode_only) const;
    double verify_ms_ = -1;
    double draft_ms_per_token_[5] = {-1, -1, -1, -1, -1};  // by SpecSource (NONE, NGRAM, DRAFT, SELF, SUFFIX)
    // A draft model's catch-up time against its token count (catch-ups of more than 2 tokens), by
    // SpecSource: what a sequence's next draft costs before its first token.
    TimeFit catch_up_fit_[5];
    // Tokens s's draft model must compute before drafting now (0 for a model-free source).
    int draft_catch_up_tokens(const Seq& s) const;
    // Their predicted time: 0 for at most 2 (inside draft_ms_per_token), -1 while unmeasured.
    double draft_catch_up_ms(const Seq& s, int n_tokens) const;
    // Suffix decoding's corpus: the recent outputs of the requests that draft with it, per tenant and
    // bucket (never shared across tenants), memory-bounded (spec/suffix.h).
    SuffixCorpus suffix_corpus_;
    // What s's speculation policy is told this step; rows holds the acceptance arrays q points at.
    struct SpecAcceptRows {
        std::array<double, k_max_spec_tokens> own{}, bucket{};
    };
    void spec_question(Seq& s, int batch_size, int n_plain_tokens, SpecSeqStats& q, SpecAcceptRows& rows) const;
    // Each planned sequence's draft length asked of its policy (0 where it may not or would not draft).
    std::vector<int> ask_draft_budgets(const StepPlan& plan, int budget, int n_plain_tokens);
    // After a verification of n_proposed draft tokens: the acceptance the policy reads next step.
    void observe_spec(Seq& s, int n_proposed, int n_accepted);
};

}  // namespace steward
