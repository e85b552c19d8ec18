// Runtime::embed's machinery: the pool is chosen and the request checked on the caller's thread
// (cheap), then one thread per pool runs that pool's embeddings in order: tokenize, check the
// context, embed with the pool's CpuEmbedder (cpu/embed.h: a forward of its own, made at the first
// job, beside the engine's), answer. Nothing runs on an actor's or the HTTP server's threads.
#pragma once
#include <steward/runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "actors/shared_state.hpp"

namespace steward {

class EmbedService {
public:
    EmbedService();
    // Answers every queued embedding FAILED ("the runtime stopped"), lets a running one finish, and
    // joins the threads.
    ~EmbedService();
    EmbedService(const EmbedService&) = delete;
    EmbedService& operator=(const EmbedService&) = delete;

    // Runtime::embed_async over the generation `snap` (its pools and config).
    void submit(const std::shared_ptr<Snapshot>& snap, EmbeddingRequest req, std::function<void(EmbeddingResult)> done);

private:
    class PoolWorker;
    std::mutex mu_;
    // Keyed by the pool's model: a reload that changes a pool loads a new model, so it gets a new
    // worker (threads, max_batch_tokens and kv_dtype are in the pool's key).
    std::map<const Model*, std::unique_ptr<PoolWorker>> workers_;
};

}  // namespace steward
