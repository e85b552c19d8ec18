// steward/runtime.h (public): steward::Runtime, the C++ embedding API (libsteward). Start from a
// TOML path or a Config, submit requests with callbacks, cancel, keep an agent's KV across turns
// with a session id. Includes only the standard library and <steward/...>: build against an
// installed Steward with find_package(steward) and target_link_libraries(app steward::runtime).
//
// Errors: functions that can fail return Expected<T> (steward/expected.h); a request's failure
// arrives as its GenerationResult::finish (steward/finish_reason.h), never as an exception.
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

#include <steward/config.h>
#include <steward/expected.h>
#include <steward/finish_reason.h>
#include <steward/request.h>

namespace steward {

// Names a submitted request (never 0) for cancel().
using RequestHandle = uint64_t;

// Validates a config file completely without serving: TOML, pools (models present or
// synthesizable), every bucket's plugins load and accept their parameters. Returns a short summary.
Expected<std::string> check_config_file(const std::string& path);

// How a runtime is started beyond its config file; applied again at every reload of the file.
struct RuntimeOptions {
    // Public prefixes added to the file's own (a name the file declares itself keeps the file's
    // text). `steward run` declares its workload's public segments here, so that a reload of the
    // unchanged file keeps every pool and its cache.
    std::vector<PublicPrefixConfig> extra_public_prefixes;
    // Decision traces kept (the last N finished or running requests) for request_trace_json().
    size_t trace_capacity = 1024;
};

// What a pool serves, for listing models and rendering prompts.
struct PoolInfo {
    std::string name;
    std::string model_path;
    std::string arch;           // GGUF general.architecture
    int n_ctx = 0;              // the model's context length
    int n_vocab = 0;
    std::string chat_template;  // the pool's override ([[pool]] chat_template_file), else the GGUF's; "" none
    std::string chat_template_source;  // where it came from (PromptPool::template_source)
    std::string bos_token, eos_token;  // their text ("" when the vocabulary has none)
    int64_t model_bytes = 0;  // the model file's bytes in memory (one copy: huge pages, or the mapping with STEWARD_MMAP=1)
    int64_t kv_bytes = 0;     // the pool's paged KV storage (every block, allocated at start); 0 for simulated and remote pools
};

// What Runtime::embed computes: one unit-length vector per input, the pool's model's final-norm
// hidden states pooled as the pool declares (docs/http-api.md#embeddings).
struct EmbeddingRequest {
    // The inputs, in order: texts (each tokenized with the pool's tokenizer, BOS as its vocabulary
    // wants) or token ids (used as given). One of the two, neither input empty.
    std::vector<std::string> texts;
    std::vector<std::vector<int32_t>> token_ids;
    // The pool that embeds; "": the first pool that can (a cpu pool).
    std::string pool;
};

// How an embedding ended. Every failure also has a message naming the input, the numbers and the fix.
enum class EmbedStatus {
    OK,
    INVALID_INPUT,            // no input, an empty one, texts and ids both, or an id outside the vocabulary
    CONTEXT_LENGTH_EXCEEDED,  // an input has more tokens than the pool's context
    UNKNOWN_POOL,             // no pool of that name
    UNSUPPORTED_POOL,         // the pool cannot embed: simulated, remote or cuda, or its model's pooling_type
    FAILED,                   // the runtime stopped, or the model file changed under the forward
};

struct EmbeddingResult {
    EmbedStatus status = EmbedStatus::OK;
    std::string error;                        // "" when OK
    std::string pool;                         // the pool that embedded (or was asked)
    std::string pooling;                      // "mean", "cls" or "last"
    int n_embd = 0;                           // each vector's length: the model's embedding width
    std::vector<std::vector<float>> vectors;  // [inputs][n_embd], unit length; empty on failure
    int64_t prompt_tokens = 0;                // the inputs' tokens together
    bool ok() const { return status == EmbedStatus::OK; }
};

// A running Steward: its pools, actors and config. Owned by the unique_ptr start() returns.
class Runtime {
public:
    // Loads the config (and the pools' models: a missing model with a [pool.synth] table is
    // generated first). Errors name the file and the problem. A reload re-reads the file and
    // applies `options` again.
    static Expected<std::unique_ptr<Runtime>> start(const std::string& config_path, RuntimeOptions options = {});
    // From a Config value. One read from a file (config.path) reloads from that file as it is on
    // disk: changes made to the value after reading it do not survive a reload (use the options).
    static Expected<std::unique_ptr<Runtime>> start(const Config& config, RuntimeOptions options = {});
    // Cancels what is still running (each gets on_finish "cancelled") and stops every actor.
    ~Runtime();

    // Submits; returns at once. The result always arrives through on_finish.
    RequestHandle submit(GenerationRequest req, RequestCallbacks cb);
    // OpenAI's n: n choices of one request, choice i sampled with seed req.seed + i. Choice 0 runs
    // first; choices 1..n-1 are submitted once it has its first token (its prompt's KV is then in
    // the prefix cache, so they reuse it instead of prefilling the same prompt n times) or once it
    // finished well without one. A choice 0 that fails before that (overloaded, cancelled, an
    // error) is every choice's answer. callbacks(i) makes choice i's callbacks; it is called n
    // times before this returns. Returns the n handles, choice i's at i: cancel() takes any of
    // them, also one whose choice has not started (it then finishes CANCELLED). n in [1, 128].
    std::vector<RequestHandle> submit_choices(GenerationRequest req, int n,
                                              const std::function<RequestCallbacks(int choice)>& callbacks);
    // Cancels a running request; false when it already finished or is unknown.
    bool cancel(RequestHandle h);
    // Blocking convenience: submit and wait for the result.
    GenerationResult generate(GenerationRequest req);
    // Drops a session's pinned KV now (otherwise it expires after limits.session_ttl_ms).
    void end_session(const std::string& session);

    // Embeds req's inputs on the pool's embedding thread (one per pool, started by its first
    // embedding, with a forward of its own: the pool's `threads` threads, scratch and KV), never on
    // the caller's thread nor an actor's; it runs beside the pool's engine and never touches its KV
    // blocks. Inputs are tokenized there too. `done` runs exactly once, on that thread (or on the
    // caller's, at once, for a request refused before any work: unknown pool, no input); it must
    // not block for long. Inputs of one call share forwards of up to the pool's max_batch_tokens.
    void embed_async(EmbeddingRequest req, std::function<void(EmbeddingResult)> done);
    // Blocking form of embed_async. Never from an embed_async callback (it would wait on its own thread).
    EmbeddingResult embed(EmbeddingRequest req);

    // The per-bucket figures so far: JSON, a text table, Prometheus exposition.
    // Documents (docs/reuse.md): registers tenant's document `id` (a new version of it when it
    // exists), the version stored; an error names the problem (a version not above the current one,
    // bounds, an invalid id, label or text). GenerationRequest::documents references it.
    struct DocumentSpec {
        std::string text;
        uint64_t version = 0;  // 0: the current + 1
        double ttl_s = 0;      // 0: never expires
        std::vector<std::string> acl;  // permission labels, any one of which covers it; empty: the whole tenant
    };
    Expected<uint64_t> put_document(const std::string& tenant, const std::string& id, DocumentSpec doc);
    // Removes it; false when there was none.
    bool remove_document(const std::string& tenant, const std::string& id);
    // Adds a request's reuse figures (documents, tool results) to `bucket`'s row ("" counts as
    // "unclassified") and the "all" row: report, JSON `reuse`, HTML and Prometheus steward_reuse_*.
    void record_reuse(const std::string& bucket, const ReuseCounts& counts);
    std::string metrics_json() const;
    std::string metrics_table() const;
    // wide: every column (the default keeps each line within 120 characters; docs/metrics.md).
    std::string metrics_table(bool wide) const;
    std::string metrics_prometheus() const;
    // The exposition one tenant may read: the aggregate series and that tenant's own, no other's.
    std::string metrics_prometheus_for_tenant(const std::string& tenant) const;
    // The live generation's pools, in config order.
    std::vector<PoolInfo> pools() const;
    // Text <-> ids with a pool's tokenizer. add_special: BOS when the vocabulary wants it. Errors
    // name an unknown pool, or ids outside the vocabulary.
    Expected<std::vector<int32_t>> tokenize(const std::string& pool, const std::string& text, bool add_special) const;
    Expected<std::string> detokenize(const std::string& pool, const std::vector<int32_t>& ids) const;
    // Each id's own bytes as an output spells them (SPM's U+2581 a space, byte tokens their byte;
    // control tokens ""): logprobs' token texts, which concatenate to the output's text.
    Expected<std::vector<std::string>> token_pieces(const std::string& pool, const std::vector<int32_t>& ids) const;
    // The decision trace of one of the last trace_capacity requests, as JSON: bucket and why, the
    // route (every pool's cached tokens and estimates, the choice, fallback), admission, runs (pool,
    // upgrade, shadow), finish. "" when unknown, or when `tenant` is not the request's tenant.
    std::string request_trace_json(RequestHandle h, const std::string& tenant) const;
    // The live config (the newest generation); requests in flight may still use older ones.
    std::shared_ptr<const Config> config() const;
    uint64_t config_generation() const;
    // Re-reads the config file: parse, validate completely (pools, plugins load, parameters check),
    // then swap atomically. Requests in flight finish with the generation they started with; new
    // ones get the new one; a removed pool drains, then stops. On error nothing changes and the
    // error (file:line:column) is returned, logged and counted (steward_config_reloads_total).
    // Plugin files changed on disk are loaded afresh. Also triggered by a change of the file
    // ([reload] watch) and by SIGHUP (after route_sighup_to_reload). Thread-safe.
    Expected<uint64_t> reload();
    // Installs a SIGHUP handler that makes every Runtime of the process reload (call from main).
    static void route_sighup_to_reload();
    // Waits until no request is in flight.
    void drain();
    // Makes this runtime a worker: fronts (configs with [[pool]] remote = "host:port") may connect on
    // host:port (0: an ephemeral port) and run requests on its pools, over CAF's network layer.
    // Returns the bound port. A runtime with remote pools of its own cannot be a worker.
    // The port is a gate (mutual TLS with the config's [cluster] tls_* files, or plaintext with
    // insecure_loopback on a loopback host only; the [cluster] bounds) in front of CAF's middleman,
    // which listens on 127.0.0.1 (docs/cluster.md#trust-and-bounds). Errors: no TLS files and no
    // insecure_loopback, insecure_loopback with a non-loopback host, a TLS file that does not load,
    // a host that is not an IP address (or localhost), a port that cannot be bound.
    // wire_version: 0 (this build's); tests give another to check that fronts refuse it.
    Expected<int> listen_for_fronts(const std::string& host, int port, uint32_t wire_version = 0);

    struct Impl;  // the runtime's internals (opaque to embedders)
    Impl& internals() { return *impl_; }  // for the runtime's own layers (e.g. api/reuse_stores.h)

private:
    explicit Runtime(std::unique_ptr<Impl> impl);
    static Expected<std::unique_ptr<Runtime>> start_with(const Config& config, RuntimeOptions options);
    std::unique_ptr<Impl> impl_;
};

}  // namespace steward
