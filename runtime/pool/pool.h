// A pool's lifecycle without actors: synthesize missing models, key a pool (what a reload compares),
// load its model and size its KV, map its config to engine options, and plan a config generation
// (which pools of the previous one are kept, which are loaded; quality priors).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <steward/expected.h>
#include <steward/request.h>

#include "config/config.h"
#include "metrics/bucket_metrics.h"
#include "model/model.h"
#include "plugin/pool_estimates.h"
#include "sched/engine.h"

namespace steward {

// Live figures of a pool, written by its executor (queue) and by requests (latency, errors).
struct PoolLive {
    std::mutex mu;
    PoolLiveStats stats;
    // The engine's running and waiting sequences per bucket (stats' n_running / n_waiting split), as
    // of its last submit, cancel or step; the /metrics gauges read it. Empty for a remote pool.
    std::vector<Engine::BucketLoad> load_by_bucket;
    std::atomic<bool> lost{false};  // a remote pool whose worker is lost (its monitor sets it; never reset)
};

// One loaded pool: its config, model, KV size and what routing sees of it. Whoever runs the pool
// (actors/shared_state.hpp's PoolHandle) adds the executor.
struct Pool {
    PoolConfig cfg;
    std::string key;  // pool_key() when the pool was loaded: what a reload compares to keep it
    std::shared_ptr<Model> model;
    std::shared_ptr<Model> draft_model;  // cfg.draft's model (null: none); the engine drafts with it
    int n_blocks = 0;
    std::string backend;  // what its engine runs on: "cpu" or "cuda" ("" remote or simulated)
    PoolProfile profile;
    std::shared_ptr<PoolLive> live = std::make_shared<PoolLive>();
    uint64_t vocab_id = 0;  // vocabulary_fingerprint of the model: runs move only between equal ones
};

// What a worker tells the front about one of its pools (the wire form is actors/messages.hpp's
// RemotePoolInfo): enough to tokenize, hash prefixes, admit and route like a local pool.
struct RemoteDescription {
    std::string pool;                  // its name in the worker's config
    int32_t block_size = 16, n_blocks = 0, max_queue = 0;
    bool prefix_cache = true;
    std::vector<uint8_t> model_header; // the GGUF's first header_size() bytes: metadata and tensor infos
    std::string model_path;            // on the worker, for the operator
    std::vector<std::vector<int32_t>> public_prefixes;  // the worker's, in its vocabulary
};

// A hash of the tokenizer's vocabulary (size and every token's text): two pools with the same one
// read each other's token ids.
uint64_t vocabulary_fingerprint(const Tokenizer& tok);

// The pool's chat template as a prompt renderer sees it (steward/request.h PromptPool): the
// config's ([[pool]] chat_template_file) over the GGUF's tokenizer.chat_template, where it came
// from, and the BOS / EOS texts. Runtime::pools() and the request path read it here, so both name
// the same template.
PromptPool prompt_pool(const Pool& p);
// The ChatML template a pool without one renders with under [[pool]] chat_template_fallback = "chatml".
extern const char* const k_chatml_template;

// A remote pool on the front: `front`'s name, prices and quality, the worker's engine fields, and a
// model built from the header (params and tokenizer, no weights). key = pool_key(front, config).
Expected<Pool> remote_pool(const PoolConfig& front, const Config& config, RemoteDescription d);

// Writes every pool's synthetic model whose file is missing ([pool.synth]); drafts
// (synth.draft_from) after the targets they are cut from. Each file is written to a temp file and
// renamed into place, so a concurrent reader never sees half a model.
Expected<bool> ensure_models(const Config& config);

// Everything that makes a pool's engine (its config's engine fields, the session TTL, the public
// prefixes) and the model file's mtime: a change to any of it means a new pool (and engine, and an
// empty cache); prices and the quality prior are not in it.
std::string pool_key(const PoolConfig& pool, const Config& config);

// The KV element types a pool's config names: kv_type_k and kv_type_v, each kv_dtype when unset
// (names as kv/kv_storage.h parse_kv_dtype; the config loader has checked them, others read as F32).
struct KvTypes {
    KvDtype k = KvDtype::F32;
    KvDtype v = KvDtype::F32;
};
KvTypes kv_types_of(const PoolConfig& pool);

// KV blocks of a pool: kv_blocks when set, else as many as kv_gib holds, a block being
// 2 (K and V) * n_layer * block_size * n_head_kv * head_dim * bytes per element.
// Errors when kv_gib holds no block or more than 2^24, or when the KV plus one step's activations
// (max_batch_tokens) exceed the machine's physical memory (host_memory: the CPU backend's; a cuda
// pool's KV is on the device, sized again by the device's allocation).
Expected<int> kv_block_count(const PoolConfig& pool, const ModelParams& model, bool host_memory = true);

// Loads a pool's model, sizes its KV and fills its profile; key = pool_key(pool, config), taken
// before the model is read.
Expected<Pool> load_pool(const PoolConfig& pool, const Config& config);
// Whether a pool's KV is sized from its device: a cuda pool with neither kv_blocks nor kv_gib.
bool kv_sized_by_device(const Pool& pool);
// A cuda pool with neither kv_blocks nor kv_gib: its KV blocks from the device's free memory now
// (gpu_memory_fraction of it, less its forwards' weights and scratch and a reserve), logged when
// `log`. The runtime calls it again right before making the pool's engine, so that pools loaded
// together each see what the engines made before them left. No-op for other pools. Errors: no
// room for a block, naming the fix.
Expected<bool> size_device_kv(Pool& pool, const Config& config, bool log = true);

// The engine options of a loaded pool (the config's engine fields, KV size, session TTL, its draft
// model and the self-draft layer counts its buckets name: the engine splits the KV blocks between
// target and drafts, shared_kv_blocks).
EngineOptions engine_options(const Pool& pool, const Config& config);
// A cheap fingerprint of a model file (its size and 16 spread samples): part of every KV tier key.
uint64_t model_file_fingerprint(const std::string& path);
// The pool's [pool.kv_tiers], opened for its model, block size, KV types and tenant salts (make_engine
// does this). Errors: the disk directory's (not private, not creatable).
Expected<std::shared_ptr<KvTiers>> open_kv_tiers(const Pool& pool, const Config& config);

// A request's speculation on a pool (bucket = its bucket, has_draft = the pool's engine has a draft
// model): off without a [bucket.speculation]; else source as configured ("" -> draft when the pool
// has one, else ngram; "draft" on a pool without one falls back to ngram, since routing may send a
// bucket's request to another pool than its own; "self" likewise on a target with no more layers
// than self_layers: draft when the pool has one, else ngram), the tree shape for draft and self,
// and k = limits.max_draft_tokens capped at the engine's k_max_spec_tokens: the most the bucket's
// speculation policy may answer. Pure.
SpecSettings spec_settings_for(const BucketConfig& bucket, const Config& config, bool has_draft, int n_target_layers);

// The config's public prefixes as token sequences of the pool's own vocabulary.
std::vector<std::vector<int32_t>> public_prefix_ids(const Pool& pool, const Config& config);
// A new engine for a loaded pool, with the config's public prefixes in the pool's vocabulary, on
// the pool's backend. Errors: the backend's (a CUDA pool's device out of memory), naming the pool.
Expected<std::unique_ptr<Engine>> make_engine(const Pool& pool, const Config& config);

// The metrics' prices (from config.pools: a kept pool's prices follow the file), SLOs and the KV
// shape (of the first pool) for a generation. `pools` in config.pools order.
MetricsConfig metrics_config(const Config& config, const std::vector<const Pool*>& pools);

// Per config.pools entry: keep the previous generation's pool `keep` (same key) or load afresh (-1).
struct PoolPlan {
    std::string key;
    int keep = -1;  // index into the previous generation's pools
};
std::vector<PoolPlan> plan_generation(const Config& config, const std::vector<const Pool*>& previous);

// What routing sees of each pool in one generation: the model's figures (taken at load) with this
// config's prices, queue limit and quality prior (the config's quality when set, else the pool's
// parameter count relative to the largest pool's). Per generation, not on the shared Pool: a kept
// pool's new prices apply to the new generation while older generations' routers keep theirs.
// `pools` in config.pools order.
std::vector<PoolProfile> generation_profiles(const Config& config, const std::vector<const Pool*>& pools);

}  // namespace steward
