// One request's state machine without actors: the primary run, a cascade's upgrade run and a shadow
// run; the hold-back of a cascade's first tokens until the routing policy's check; agreement with
// the shadow; the request's record and cost; exactly one finish. It receives events (route
// decided, tokens of run R, run R ended, cancel) and returns actions (submit run R on pool P,
// cancel run R, stream text, finish, record quality, ...) that the request actor executes, as
// vLLM's scheduler returns a plan that the runner executes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <steward/request.h>

#include "metrics/bucket_metrics.h"
#include "plugin/route.h"
#include "request/stop_matcher.h"
#include "sched/engine.h"

namespace steward {

// A request has up to three runs, each on its own pool: the answer, a cascade's upgrade, a shadow.
enum class RunRole : uint32_t { PRIMARY = 0, UPGRADE = 1, SHADOW = 2 };
inline constexpr int n_run_roles = 3;
// The engine id of a run, and back (request * 4 + role).
uint64_t run_engine_id(uint64_t request, RunRole role);
RunRole run_role_of(uint64_t engine_id);

// A pool of the request's generation, as the request sees it.
struct RequestPool {
    std::string name;
    int32_t n_blocks = 0;
    PoolPrice price;
    int32_t n_ctx = 0;  // its model's context: a prompt of this many tokens or more is refused (0: unchecked)
};

// What the core knows when the request arrives.
struct RequestSetup {
    uint64_t id = 0;
    std::string tenant;
    int32_t tenant_id = 0;    // the KV layer's tenant id
    uint64_t salt = 0;        // the tenant's prefix-cache salt
    std::string session_key;  // the engine's session key ("" without a session)
    int32_t max_tokens = 0;   // the request's, or the config's default
    SamplingParams sampling;
    bool ignore_eos = false;
    double arrival_s = 0;
    double deadline_s = 0;             // 0: none
    double kv_quota = -1;              // the tenant's share of a pool's blocks; < 0: none
    std::vector<RequestPool> pools;    // the generation's pools, in its order (RouteDecision indexes them)
    std::vector<std::string> stop;     // stop strings: the answer ends (STOP) before the first one
    std::vector<uint64_t> reuse_keys;  // its documents' keys (reuse::document_key); empty: none
    // The caller takes tokens as they come (a token or logprobs callback). Without one, and without
    // stop strings or a cascade check, a run's tokens may come merged (EngineRequest::batch_tokens).
    bool watched = true;
};

// Turns one run's ids into text, never half a UTF-8 character (StreamDecoder over the pool's
// tokenizer; a fake in tests).
class TextDecoder {
public:
    virtual ~TextDecoder() = default;
    virtual std::string push(int32_t id) = 0;
    virtual std::string flush() = 0;
};

// The prompt and text of each pool's vocabulary (the actor implements it over its snapshot).
class RequestVocab {
public:
    virtual ~RequestVocab() = default;
    // The prompt in pool `pool`'s ids; empty when it cannot be encoded (the run then fails with
    // prompt_error(pool)).
    virtual std::vector<int32_t> prompt_ids(int32_t pool) = 0;
    virtual std::string prompt_error(int32_t /*pool*/) { return "empty prompt and the vocabulary has no BOS token"; }
    virtual std::unique_ptr<TextDecoder> text_decoder(int32_t pool) = 0;
    // Where the prompt's documents are in pool `pool`'s ids (docs/reuse.md): {first token of the
    // documents, first token past them}, conservatively rounded inwards; {0, 0}: none.
    virtual std::pair<int32_t, int32_t> documents_span(int32_t /*pool*/) { return {0, 0}; }
};

// The bucket's routing policy, as the request sees it after the route decision.
class RequestRouting {
public:
    virtual ~RequestRouting() = default;
    // Cascade: whether to re-run on the upgrade pool after the primary run's first tokens
    // (finished: the run ended before or at the check). *fallback: the policy's answer was rejected.
    virtual bool check_upgrade(const std::vector<int32_t>& tokens, const std::vector<float>& logprobs, bool finished,
                               bool* fallback) = 0;
};

// ---- actions (executed in order)
struct SubmitRun {  // hand `run` to pool `pool`'s engine
    RunRole role = RunRole::PRIMARY;
    int32_t pool = 0;
    EngineRequest run;  // id = run_engine_id(request, role); its bucket and generation the route's
};
struct CancelRun {
    RunRole role = RunRole::PRIMARY;
    int32_t pool = 0;
    uint64_t engine_id = 0;
};
struct StreamText {  // to the caller's on_token (and on_logprobs)
    std::string piece;
    std::vector<int32_t> ids;
    std::vector<float> logprobs;                     // one per id
    std::vector<std::vector<TokenLogprob>> top;      // per id, when the request asked for alternatives
    int32_t pool = -1;  // the answer run's pool (the caller's on_pool hears of a change before the piece)
};
struct PoolSample {  // a run ended: fold into the pool's live figures (moving averages)
    int32_t pool = 0;
    bool failed = false;
    double prefill_ms_per_token = -1;  // < 0: no sample
    double tpot_ms = -1;               // < 0: no sample
};
struct FinishRequest {  // record the request's figures, then the caller's on_finish
    GenerationResult result;
    RequestRecord record;
};
struct RecordQuality {  // the answer's agreement with the shadow run (per bucket and answering pool)
    std::string bucket, pool;
    double agreement = 0;
    bool exact = false;
};
struct RequestDone {};  // the caller has its answer and no run is left: the actor may stop
using RequestAction = std::variant<SubmitRun, CancelRun, StreamText, PoolSample, FinishRequest, RecordQuality, RequestDone>;
using RequestActions = std::vector<RequestAction>;

class RequestFsm {
public:
    // `vocab` and `routing` must outlive the core.
    RequestFsm(RequestSetup setup, RequestVocab& vocab, RequestRouting& routing);

    // Each event returns what to do now; after RequestDone every event returns nothing. `now` is
    // the caller's clock (the same as arrival_s): token times are when tokens reach the caller.
    RequestActions on_route(const RouteDecision& route, double now);
    // The request is refused before routing (an invalid field): it finishes with ERROR and `error`.
    RequestActions on_refused(const std::string& error, double now);
    RequestActions on_route_failed(const std::string& why, double now);
    // top_logprobs: per token, its alternatives (when the request asked for them). token_t_s: when
    // each token was made (a merged event of a batch_tokens run); empty: each token's time is `now`.
    RequestActions on_tokens(RunRole role, const std::vector<int32_t>& tokens, const std::vector<float>& logprobs,
                             double now, const std::vector<std::vector<TokenLogprob>>& top_logprobs = {},
                             const std::vector<double>& token_t_s = {});
    RequestActions on_run_end(RunRole role, const EngineEvent& end, double now);
    // Run `role`'s pool was lost with its worker (`end` says how: ERROR and why). With retry_pool >= 0
    // (a pool of the same vocabulary) the answer run continues there from the prompt and the tokens
    // it already produced, which the caller keeps (no token is sent twice); max_tokens counts them.
    // Otherwise (or for a shadow, or once answered) the run ends with `end`.
    RequestActions on_run_lost(RunRole role, const EngineEvent& end, int32_t retry_pool, double now);
    RequestActions on_cancel();
    // The request's deadline timer fired (the actor's timer, not a step): unless it is answered, it
    // finishes TIMEOUT to the caller now and cancels its runs, whatever the router, a plugin or an
    // engine is doing; the runs' later ends only complete it (RequestDone).
    RequestActions on_deadline(double now);

    bool finished() const { return answered_; }  // FinishRequest was returned
    bool done() const { return done_; }          // RequestDone was returned

private:
    struct Run {
        int32_t pool = -1;
        bool active = false;  // submitted and not ended
        bool ended = false;
        double t_submit = 0;
        bool batched = false;        // submitted with batch_tokens: token times are `times`
        std::vector<int32_t> tokens;
        std::vector<double> times;   // per token: when it was made (token_t_s) or reached the caller
        std::vector<float> logprobs;
        std::vector<std::vector<TokenLogprob>> top_logprobs;
        EngineEvent end;
        int32_t n_carried = 0;  // tokens produced before a retry, carried into its prompt
    };

    Run& run(RunRole r) { return runs_[(int)r]; }
    // continue_from: a lost run whose tokens the new run goes on from (on_run_lost).
    void submit(RunRole role, int32_t pool, double now, RequestActions& out, const Run* continue_from = nullptr);
    void stream(double now, RequestActions& out);
    // The routing policy's cascade check (the one place the core calls it); true: upgraded.
    bool check_cascade(bool primary_ended, double now, RequestActions& out);
    // The route asks for a cascade check after its first tokens (they are held back until then).
    bool checks_cascade() const { return route_.upgrade_pool >= 0 && route_.check_after_tokens > 0; }
    void finish(const EngineEvent& end, double now, RequestActions& out);
    // The request's record from the answer run's end and what the request did before it.
    RequestRecord make_record(const EngineEvent& end, double t_finish) const;
    PoolSample pool_sample(const Run& r, bool failed) const;
    void record_quality(RequestActions& out);
    void maybe_done(RequestActions& out);
    void end_run(RunRole role, const EngineEvent& end, double now, RequestActions& out);
    void drain_deferred(double now, RequestActions& out);

    RequestSetup setup_;
    RequestVocab& vocab_;
    RequestRouting& routing_;
    MetricsConfig prices_;  // the generation's prices, for the cost
    RouteDecision route_;
    bool routed_ = false;
    Run runs_[n_run_roles];
    RunRole answer_ = RunRole::PRIMARY;  // the run whose tokens reach the caller
    bool holding_ = false;               // cascade: the answer's tokens held back until the check
    size_t n_streamed_ = 0;              // tokens of the answer run handed to the caller
    std::unique_ptr<TextDecoder> decoder_;
    StopMatcher stop_;                   // the answer's text, held back while it may begin a stop string
    GenerationResult result_;
    std::vector<double> token_times_;  // when each streamed token reached the caller
    std::vector<PoolUse> prior_pools_;
    bool cancel_requested_ = false;
    bool answered_ = false;
    FinishReason answer_reason_ = FinishReason::STOP;  // when answered
    bool quality_recorded_ = false;
    bool done_ = false;
    std::vector<std::pair<RunRole, EngineEvent>> deferred_;  // runs that failed at submission
};

}  // namespace steward
