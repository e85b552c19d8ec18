// One pool's engine: the continuous-batching scheduler over a model, its paged KV (KvManager +
// KvStorage) and the CPU forward. Plain C++, one owner thread (the pool's executor actor, or a
// test); each step() selects a batch under the token budget, runs ONE forward and samples.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/forward.h"
#include "cpu/sampling.h"
#include "kv/kv_manager.h"
#include "kv/kv_storage.h"
#include "metrics/bucket_metrics.h"  // FinishReason

namespace steward {

struct EngineOptions {
    int n_blocks = 256;
    int block_size = 16;
    KvDtype kv_dtype = KvDtype::F32;
    int max_batch = 32;          // sequences per step
    int max_batch_tokens = 256;  // token budget per step; prefill is chunked to fit
    int max_queue = 256;         // waiting requests; past it submit() refuses (overloaded)
    int n_threads = 0;
    bool prefix_cache = true;
    double session_ttl_s = 60.0;
    bool kv_events = false;  // record block stored / removed events for take_kv_events (a cache actor)
};

struct EngineRequest {
    uint64_t id = 0;
    int32_t tenant = 0;
    uint64_t salt = 0;         // prefix-cache salt of the tenant (config); 0: derived from tenant
    std::vector<int32_t> prompt;
    int max_tokens = 16;
    SamplingParams sampling;
    int priority = 0;          // higher first; the lowest running one is preempted first
    double arrival_s = 0.0;    // engine clock (seconds)
    double deadline_s = 0.0;   // 0: none
    std::string session;       // non-empty: keep this conversation's KV pinned after it finishes
    bool stop_at_eos = true;
    // The bucket's eviction policy: reclaims cached blocks when this request needs room (null: LRU).
    std::shared_ptr<EvictionPolicy> eviction;
    std::string eviction_name = "lru";  // the policy's name in the eviction counts
    std::string bucket;                 // the workload bucket, for the eviction counts
    int32_t kv_quota_blocks = -1;  // the tenant's KV quota (eviction policies see it); -1: none
};

// Cached blocks reclaimed while allocating for requests of one bucket under one policy.
struct EvictionCount {
    std::string bucket, policy;
    int64_t n = 0;
};


// What a step produced for one request.
struct EngineEvent {
    uint64_t id = 0;
    std::vector<int32_t> tokens;  // new tokens this step (0 or 1 today; more with speculation)
    std::vector<float> logprobs;
    bool finished = false;
    FinishReason finish = FinishReason::STOP;  // meaningful when finished
    std::string error;             // set with ERROR / TIMEOUT
    // Filled on the first event carrying tokens and on finish:
    double first_scheduled_s = -1; // when the request first entered a batch
    int n_prompt = 0;
    int n_cached_prompt = 0;       // prompt tokens served from the prefix cache (or the session)
    int n_recomputed = 0;          // tokens recomputed after preemption
};

struct EngineStats {
    int64_t n_steps = 0;
    int64_t n_preemptions = 0;
    int64_t n_recomputed_tokens = 0;
    int64_t n_session_evictions = 0;
    int64_t n_prompt_tokens_computed = 0;
    int64_t n_decode_tokens = 0;
    int n_waiting = 0, n_running = 0, n_sessions = 0;
    KvManagerStats kv;
};

class Engine {
public:
    Engine(const Model& model, const EngineOptions& opt);

    // Validates and queues. Errors (returned, nothing queued): an empty prompt, prompt + max_tokens
    // past the model's context, a request that needs more KV blocks than the whole pool holds, a
    // full queue ("overloaded"). Thread: the owner.
    Expected<bool> submit(EngineRequest req);
    // Marks a request cancelled; its event comes at the next step. False when unknown.
    bool cancel(uint64_t id);
    // Runs one step at engine time now_s: expire deadlines and sessions, schedule, forward, sample.
    std::vector<EngineEvent> step(double now_s);
    bool has_work() const { return !waiting_.empty() || !running_.empty() || !cancelled_.empty(); }
    EngineStats stats() const;
    const Model& model() const { return model_; }
    const EngineOptions& options() const { return opt_; }
    int n_sessions() const { return (int)sessions_.size(); }
    const KvManager& kv_manager() const { return mgr_; }
    // Token sequences (of this pool's vocabulary) whose blocks every tenant may share.
    void set_public_prefixes(std::vector<std::vector<int32_t>> p) { mgr_.set_public_prefixes(std::move(p)); }
    // Drops a kept session's KV now.
    void end_session(const std::string& session);
    // Evictions since the last call, per (bucket, policy) of the request that needed the blocks.
    std::vector<EvictionCount> take_evictions();
    // Block stored / removed events since the last call, in order (empty unless options().kv_events).
    std::vector<KvEvent> take_kv_events() { return mgr_.take_kv_events(); }

private:
    struct Seq {
        EngineRequest req;
        SeqId kv = 0;            // 0 while not holding KV
        Sampler sampler;
        int n_generated = 0;
        int n_cached_prompt = 0;
        int n_recomputed = 0;
        double first_scheduled_s = -1;
        bool reported_first = false;
        std::vector<int32_t> all_tokens;  // prompt + generated (survives preemption)
        explicit Seq(EngineRequest r) : req(std::move(r)), sampler(req.sampling) {}
    };
    struct Session {
        SeqId kv = 0;
        double expires_s = 0;
    };

    bool ensure_slots(Seq& s, int n, std::vector<int>& order, size_t self_index, std::vector<EngineEvent>& ev);
    void preempt(Seq& s);
    void release(Seq& s, bool keep_session, double now_s);
    bool free_one_session();
    void attach(Seq& s);
    EngineEvent make_event(Seq& s) const;

    const Model& model_;
    EngineOptions opt_;
    CpuForward fwd_;
    KvStorage kv_;
    KvManager mgr_;
    std::unordered_map<uint64_t, std::unique_ptr<Seq>> seqs_;
    std::deque<uint64_t> waiting_;
    std::vector<uint64_t> running_;
    std::vector<uint64_t> cancelled_;
    std::map<std::string, Session> sessions_;
    EngineStats stats_;
    std::vector<float> logits_;
    std::map<std::pair<std::string, std::string>, int64_t> evictions_;  // (bucket, policy) -> n
};

}  // namespace steward
