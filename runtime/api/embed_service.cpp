// EmbedService: choose and check on the caller's thread, then tokenize, check the context, embed and
// answer on the pool's own embedding thread.
#include "api/embed_service.h"

#include <condition_variable>
#include <deque>
#include <thread>

#include "cpu/embed.h"
#include "pool/pool.h"

namespace steward {

namespace {

EmbeddingResult failure(EmbedStatus status, std::string pool, std::string message) {
    EmbeddingResult r;
    r.status = status;
    r.pool = std::move(pool);
    r.error = std::move(message);
    return r;
}

// Why a pool cannot embed, "" when it can: embeddings run on the CPU forward over the pool's weights.
std::string cannot_embed(const PoolHandle& p) {
    const std::string who = "pool '" + p.cfg.name + "'";
    if (p.remote())
        return who + " is a worker's (remote = \"" + p.cfg.remote + "\"): embeddings run where the weights are; " +
               "send them to a local cpu pool";
    if (p.cfg.sim || p.backend.empty())
        return who +
               " is simulated (backend = \"sim\"): it has a cost model, not weights to embed with; use a cpu pool";
    if (p.backend != "cpu")
        return who + " runs on " + p.backend + ": embeddings run on the CPU backend only so far; " +
               "add a backend = \"cpu\" pool of the same model for them";
    if (!p.model->has_weights()) return who + " has no weights in this process";
    return "";
}

}  // namespace

// One pool's embedding thread: jobs in order, each given the pool's embedder (null once the
// service is stopping: the job answers FAILED).
class EmbedService::PoolWorker {
public:
    using Job = std::function<void(CpuEmbedder*)>;
    PoolWorker(std::shared_ptr<Model> model, int n_threads, int max_tokens, KvTypes types)
        : model_(std::move(model)), n_threads_(n_threads), max_tokens_(max_tokens), types_(types), thread_([this] {
              loop();
          }) {}
    ~PoolWorker() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void post(Job job) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            jobs_.push_back(std::move(job));
        }
        cv_.notify_all();
    }
    bool idle() {
        std::lock_guard<std::mutex> lk(mu_);
        return jobs_.empty() && !busy_;
    }

private:
    void loop() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // stopping, nothing left
            Job job = std::move(jobs_.front());
            jobs_.pop_front();
            const bool stopping = stop_;
            busy_ = true;
            lk.unlock();
            // The forward (its threads and scratch) is made at the first job, on this thread.
            if (!stopping && !embedder_)
                embedder_ = std::make_unique<CpuEmbedder>(*model_, n_threads_, max_tokens_, types_.k, types_.v);
            job(stopping ? nullptr : embedder_.get());
            lk.lock();
            busy_ = false;
        }
    }

    std::shared_ptr<Model> model_;
    int n_threads_, max_tokens_;
    KvTypes types_;
    std::unique_ptr<CpuEmbedder> embedder_;  // the thread's own
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    bool busy_ = false, stop_ = false;
    std::thread thread_;  // last: starts once the rest is constructed
};

EmbedService::EmbedService() = default;

EmbedService::~EmbedService() {
    // Stopped outside the lock: a callback finishing meanwhile may submit again (its new worker
    // stops with the member map).
    std::map<const Model*, std::unique_ptr<PoolWorker>> stopping;
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping.swap(workers_);
    }
    stopping.clear();
}

void EmbedService::submit(const std::shared_ptr<Snapshot>& snap, EmbeddingRequest req,
                          std::function<void(EmbeddingResult)> done) {
    if (!snap || snap->pools.empty()) return done(failure(EmbedStatus::UNKNOWN_POOL, req.pool, "no pool is serving"));
    // The pool: the named one, else the first that can embed (else the first, which says why not).
    std::shared_ptr<PoolHandle> ph;
    if (req.pool.empty()) {
        for (const auto& p : snap->pools)
            if (cannot_embed(*p).empty()) {
                ph = p;
                break;
            }
        if (!ph) ph = snap->pools.front();
    } else {
        for (const auto& p : snap->pools)
            if (p->cfg.name == req.pool) ph = p;
        if (!ph) {
            std::string names;
            for (const auto& p : snap->pools) names += (names.empty() ? "" : ", ") + p->cfg.name;
            return done(failure(EmbedStatus::UNKNOWN_POOL, req.pool,
                                "no pool named '" + req.pool + "' (pools: " + names + ")"));
        }
    }
    const std::string name = ph->cfg.name;
    if (std::string why = cannot_embed(*ph); !why.empty())
        return done(failure(EmbedStatus::UNSUPPORTED_POOL, name, why));
    // The pooling of this generation's config (a reload may change it without reloading the model).
    const PoolConfig* pc = snap->config->find_pool(name);
    auto pooling = embedding_pooling(ph->model->params(), pc ? pc->pooling : ph->cfg.pooling);
    if (!pooling)
        return done(failure(EmbedStatus::UNSUPPORTED_POOL, name, "pool '" + name + "': " + pooling.error().message));
    // The inputs' shape, before any work.
    const bool has_texts = !req.texts.empty(), has_ids = !req.token_ids.empty();
    if (has_texts == has_ids)
        return done(failure(
            EmbedStatus::INVALID_INPUT, name,
            has_texts ? "give texts or token ids, not both" : "no input: give at least one text or token sequence"));
    const size_t n_inputs = has_texts ? req.texts.size() : req.token_ids.size();
    for (size_t i = 0; i < n_inputs; i++)
        if (has_texts ? req.texts[i].empty() : req.token_ids[i].empty())
            return done(failure(EmbedStatus::INVALID_INPUT, name,
                                "input " + std::to_string(i) + " is empty; every input needs at least one token"));

    PoolWorker* w;
    {
        std::lock_guard<std::mutex> lk(mu_);
        // Workers of pools no generation serves any more go once idle (joining an idle thread is quick).
        for (auto it = workers_.begin(); it != workers_.end();) {
            bool live = false;
            for (const auto& p : snap->pools) live |= p->model.get() == it->first;
            it = !live && it->second->idle() ? workers_.erase(it) : std::next(it);
        }
        auto& slot = workers_[ph->model.get()];
        if (!slot)
            slot = std::make_unique<PoolWorker>(ph->model, ph->cfg.threads, ph->cfg.max_batch_tokens,
                                                kv_types_of(ph->cfg));
        w = slot.get();
    }
    // The job holds the model, not the pool's handle (whose last release stops the pool's actors).
    w->post([model = ph->model, name, pooling = *pooling, req = std::move(req),
             done = std::move(done)](CpuEmbedder* e) mutable {
        if (!e) return done(failure(EmbedStatus::FAILED, name, "the runtime stopped before this embedding ran"));
        const Model& m = *model;
        const ModelParams& p = m.params();
        std::vector<std::vector<int32_t>> ids;
        if (!req.texts.empty()) {
            const Tokenizer& tok = m.tokenizer();
            for (const std::string& t : req.texts) ids.push_back(tok.encode(t, tok.add_bos_default(), true));
        } else {
            ids = std::move(req.token_ids);
        }
        EmbeddingResult r;
        r.pool = name;
        r.pooling = pooling_name(pooling);
        r.n_embd = p.n_embd;
        for (size_t i = 0; i < ids.size(); i++) {
            const std::string at = ids.size() > 1 ? "input " + std::to_string(i) + " has " : "the input has ";
            if ((int64_t)ids[i].size() > p.n_ctx_train)
                return done(failure(EmbedStatus::CONTEXT_LENGTH_EXCEEDED, name,
                                    at + std::to_string(ids[i].size()) + " tokens, over pool '" + name +
                                        "''s context of " + std::to_string(p.n_ctx_train) + " tokens; shorten it"));
            for (int32_t id : ids[i])
                if (id < 0 || id >= p.n_vocab)
                    return done(failure(EmbedStatus::INVALID_INPUT, name,
                                        "input " + std::to_string(i) + ": token id " + std::to_string(id) +
                                            " is outside pool '" + name + "''s vocabulary of " +
                                            std::to_string(p.n_vocab) + " ids"));
            r.prompt_tokens += (int64_t)ids[i].size();
        }
        auto vectors = e->embed(ids, pooling);
        if (!vectors)
            return done(failure(EmbedStatus::FAILED, name, "pool '" + name + "': " + vectors.error().message));
        if (auto ok = m.check_file(); !ok) return done(failure(EmbedStatus::FAILED, name, ok.error().message));
        r.vectors = std::move(*vectors);
        done(std::move(r));
    });
}

}  // namespace steward
