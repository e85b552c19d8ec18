// steward::Runtime: the embedding API. Start from a TOML path or a Config, submit requests with
// callbacks, cancel, keep an agent's KV across turns with a session id. No CAF type appears here.
//
// Thread-safety: every member function may be called from any thread. Callbacks run on runtime
// threads (one request's callbacks never run concurrently with each other); they must not block
// for long and must not call ~Runtime.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "util/error.h"
#include "util/finish_reason.h"

namespace steward {

struct GenerationRequest {
    std::string prompt;               // text; ignored when prompt_ids is non-empty
    std::vector<int32_t> prompt_ids;  // token ids of the routed pool's vocabulary
    std::string tenant = "default";
    std::string session;              // non-empty: the conversation's KV stays pinned between turns
    std::string bucket_hint;          // e.g. "short_qa"; the config's rules decide
    int max_tokens = 0;               // 0: the config's limits.max_tokens_default
    float temperature = 0.0f;         // 0: greedy
    float top_p = 1.0f;
    int top_k = 0;
    uint64_t seed = 0;
    bool tools = false;               // tools present (an agent turn)
    std::string response_format;      // "" or "json" (classification only: output is not constrained
                                      // yet); anything else finishes with ERROR
    bool add_bos = true;              // prepend BOS when the vocabulary wants it
    bool ignore_eos = false;          // generate max_tokens even past end-of-sequence (benchmarks)
};

// The request's own figures (METRICS.md), filled in the finish callback.
struct RequestMetrics {
    double ttft_ms = -1;       // arrival -> first token handed to the caller (-1: none)
    double e2e_ms = 0;
    double queue_ms = -1;      // arrival -> first scheduled
    double tpot_ms = -1;       // (last - first token) / (n - 1); -1 for fewer than 2 tokens
    int prompt_tokens = 0;
    int cached_tokens = 0;     // prompt tokens served from the prefix cache or the session
    int completion_tokens = 0;
    int recomputed_tokens = 0; // recomputed after preemption
    double cost = 0;           // from the pool's prices
    uint64_t config_generation = 0;
};

struct GenerationResult {
    uint64_t id = 0;
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    FinishReason finish = FinishReason::STOP;  // as text: finish_reason_name(finish)
    std::string error;          // empty unless finish is ERROR, TIMEOUT, OVERLOADED or CANCELLED
    std::string bucket, pool;   // pool: the one that answered
    bool upgraded = false;      // started on a cheaper pool, answered by a stronger one
    bool fallback = false;      // a routing plugin's decision was rejected; the bucket's pool served it
    RequestMetrics metrics;
    bool ok() const { return finish_reason_ok(finish); }
};

struct RequestCallbacks {
    // A piece of text (complete UTF-8 characters only) and the ids that produced it. May be null.
    std::function<void(const std::string& piece, const std::vector<int32_t>& ids)> on_token;
    // Exactly once per submitted request, also on error, cancel, timeout or overload.
    std::function<void(const GenerationResult&)> on_finish;
};

using RequestHandle = uint64_t;

// Validates a config file completely without serving: TOML, pools (models present or
// synthesizable), every bucket's plugins load and accept their parameters. Returns a short summary.
Expected<std::string> check_config_file(const std::string& path);

class Runtime {
public:
    // Loads the config (and the pools' models: a missing model with a [pool.synth] table is
    // generated first). Errors name the file and the problem.
    static Expected<std::unique_ptr<Runtime>> start(const std::string& config_path);
    static Expected<std::unique_ptr<Runtime>> start(const Config& config);
    // Cancels what is still running (each gets on_finish "cancelled") and stops every actor.
    ~Runtime();

    // Submits; returns at once. The result always arrives through on_finish.
    RequestHandle submit(GenerationRequest req, RequestCallbacks cb);
    // Cancels a running request; false when it already finished or is unknown.
    bool cancel(RequestHandle h);
    // Blocking convenience: submit and wait for the result.
    GenerationResult generate(GenerationRequest req);
    // Drops a session's pinned KV now (otherwise it expires after limits.session_ttl_ms).
    void end_session(const std::string& session);

    // The per-bucket figures so far: JSON, a text table, Prometheus exposition.
    std::string metrics_json() const;
    std::string metrics_table() const;
    std::string metrics_prometheus() const;
    // The live config (the newest generation); requests in flight may still use older ones.
    std::shared_ptr<const Config> config() const;
    uint64_t config_generation() const;
    // Re-reads the config file: parse, validate completely (pools, plugins load, parameters check),
    // then swap atomically. Requests in flight finish with the generation they started with; new
    // ones get the new one; a removed pool drains, then stops. On error nothing changes and the
    // error (file:line:column) is returned, logged and counted (steward:config_reloads_total).
    // Plugin files changed on disk are loaded afresh. Also triggered by a change of the file
    // ([reload] watch) and by SIGHUP (after route_sighup_to_reload). Thread-safe.
    Expected<uint64_t> reload();
    // Installs a SIGHUP handler that makes every Runtime of the process reload (call from main).
    static void route_sighup_to_reload();
    // Waits until no request is in flight.
    void drain();

    struct Impl;

private:
    explicit Runtime(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace steward
