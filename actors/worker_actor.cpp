// Pools across processes, on CAF's own network layer (the io middleman's BASP): a worker publishes
// one actor that describes its pools (worker_actor); a front connects to it (connect_worker), uses the
// worker's executor and kv_allocator actors as it uses local ones, and watches each remote pool with
// a monitor (pool_monitor_actor): heartbeats, loss, rejoin.
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <set>

#include "actors/actors.hpp"
#include "actors/shared_state.hpp"
#include "util/strings.h"

namespace steward {

namespace {

struct worker_state {
    static inline const char* name = "worker";
};

WorkerActor::behavior_type worker_actor(WorkerActor::stateful_pointer<worker_state> self, std::weak_ptr<SharedState> shared, std::string name,
                           uint32_t version) {
    (void)self;  // stateless: every answer reads the runtime's live snapshot
    return {
        [=](hello_atom, uint32_t front_version) {
            WorkerInfo w;
            w.version = version;
            w.worker = name;
            if (front_version != version) {
                w.refused = "this worker at " + name + " speaks Steward wire protocol " + std::to_string(version) +
                            " and the front " + std::to_string(front_version) + "; run the same Steward version on both";
                spdlog::warn("refused a front: {}", w.refused);
                return w;
            }
            auto sh = shared.lock();
            auto snap = sh ? sh->snapshot() : nullptr;
            if (!snap) {
                w.refused = "the worker at " + name + " is shutting down";
                return w;
            }
            for (const auto& ph : snap->pools) {
                RemotePoolInfo i;
                i.pool = ph->cfg.name;
                i.executor = ph->executor;
                i.kv_allocator = ph->kv_allocator;
                i.block_size = ph->cfg.block_size;
                i.n_blocks = ph->n_blocks;
                i.max_queue = ph->cfg.max_queue;
                i.prefix_cache = ph->cfg.prefix_cache;
                const GgufFile& f = ph->model->file();
                i.model_header.assign(f.bytes(), f.bytes() + f.header_size());
                i.model_path = ph->cfg.model;
                i.public_prefixes = ph->public_prefixes;
                w.pools.push_back(std::move(i));
            }
            spdlog::info("a front connected ({} pools described)", w.pools.size());
            return w;
        },
        [=](heartbeat_atom) {
            WorkerLoad load;
            auto sh = shared.lock();
            auto snap = sh ? sh->snapshot() : nullptr;
            if (snap)
                for (const auto& ph : snap->pools) {
                    PoolLoadInfo p;
                    p.pool = ph->cfg.name;
                    std::lock_guard<std::mutex> lk(ph->live->mu);
                    const PoolLiveStats& ls = ph->live->stats;
                    p.n_waiting = ls.n_waiting;
                    p.n_running = ls.n_running;
                    p.n_kv_blocks_used = ls.n_kv_blocks_used;
                    p.n_kv_blocks_total = ls.n_kv_blocks_total >= 0 ? ls.n_kv_blocks_total : ph->n_blocks;
                    p.fragmentation = ls.kv_fragmentation;
                    p.n_branches = ls.n_kv_branches;
                    load.pools.push_back(std::move(p));
                }
            return load;
        },
    };
}

struct monitor_state {
    PoolMonitorArgs a;
    std::set<RequestActor> watchers;
    bool lost = false, rejoined = false;
    std::string why;
    static inline const char* name = "pool_monitor";
};

using monitor_ptr = PoolMonitorActor::stateful_pointer<monitor_state>;

void lose(monitor_ptr self, const std::string& why) {
    auto& st = self->state;
    if (st.lost) return;
    st.lost = true;
    st.why = why;
    st.a.live->lost = true;
    {
        std::lock_guard<std::mutex> lk(st.a.live->mu);
        st.a.live->stats.available = false;
    }
    spdlog::warn("worker {} (pool '{}') is lost: {}; its {} running requests are retried elsewhere or fail as their bucket says; "
                 "trying it again every {} ms",
                 st.a.address, st.a.pool, why, st.watchers.size(), (long long)st.a.cluster.reconnect_ms);
    for (const RequestActor& w : st.watchers) self->send(w, lost_atom::value, st.a.pool_id, why);
    st.watchers.clear();
}

// A heartbeat's figures: the pool's live load (routing) and a KV sample in the front's metrics (the
// report's KV figures and series of a remote pool).
void apply_load(monitor_state& st, const WorkerLoad& load) {
    for (const PoolLoadInfo& p : load.pools) {
        if (p.pool != st.a.remote_pool) continue;
        {
            std::lock_guard<std::mutex> lk(st.a.live->mu);
            PoolLiveStats& ls = st.a.live->stats;
            ls.n_waiting = p.n_waiting;
            ls.n_running = p.n_running;
            ls.n_kv_blocks_used = p.n_kv_blocks_used;
            ls.n_kv_blocks_total = p.n_kv_blocks_total;
        }
        auto sh = st.a.shared.lock();
        if (!sh || p.n_kv_blocks_used < 0 || p.n_kv_blocks_total <= 0) return;
        KvSample s;
        s.t_s = now_s();
        s.n_blocks_used = p.n_kv_blocks_used;
        s.n_blocks_total = p.n_kv_blocks_total;
        s.fragmentation = p.fragmentation;
        s.n_branches = (int64_t)p.n_branches;
        s.pool = st.a.pool;
        std::lock_guard<std::mutex> lk(sh->metrics_mu);
        if (sh->metrics) sh->metrics->record_kv(s);
        return;
    }
}

PoolMonitorActor::behavior_type pool_monitor_actor(monitor_ptr self, PoolMonitorArgs args) {
    self->state.a = std::move(args);
    self->monitor(self->state.a.worker);
    self->monitor(self->state.a.executor);
    self->set_down_handler([=](caf::down_msg& dm) {
        auto& st = self->state;
        if (dm.source == st.a.worker.address() || dm.source == st.a.executor.address())
            lose(self, std::string(dm.source == st.a.worker.address() ? "its connection closed (" : "its executor stopped (") +
                           self->system().render(dm.reason) + ")");
    });
    self->send(self, mon_tick_atom::value);
    return {
        [=](mon_tick_atom) {
            auto& st = self->state;
            const auto ms = [](double v) { return std::chrono::milliseconds((int64_t)v); };
            if (!st.lost) {
                self->request(st.a.worker, ms(st.a.cluster.heartbeat_timeout_ms), heartbeat_atom::value)
                    .then([=](const WorkerLoad& load) { apply_load(self->state, load); },
                          [=](caf::error& err) {
                              lose(self, "no heartbeat answer within " +
                                             std::to_string((long long)self->state.a.cluster.heartbeat_timeout_ms) + " ms (" +
                                             self->system().render(err) + ")");
                          });
                self->delayed_send(self, ms(st.a.cluster.heartbeat_ms), mon_tick_atom::value);
                return;
            }
            if (st.rejoined) return;  // the config actor builds the new generation; this pool is done
            auto c = connect_worker(self->system(), st.a.address, st.a.cluster);
            if (c) {
                bool has_pool = false;
                for (const RemotePoolInfo& p : c->info.pools) has_pool |= p.pool == st.a.remote_pool;
                if (has_pool) {
                    st.rejoined = true;
                    spdlog::info("worker {} answers again with pool '{}': rejoining it", st.a.address, st.a.remote_pool);
                    if (auto sh = st.a.shared.lock(); sh && sh->config) self->send(sh->config, rejoin_atom::value);
                    return;
                }
            }
            self->delayed_send(self, ms(st.a.cluster.reconnect_ms), mon_tick_atom::value);
        },
        [=](watch_atom, RequestActor who) {
            auto& st = self->state;
            if (st.lost)
                self->send(who, lost_atom::value, st.a.pool_id, st.why);
            else
                st.watchers.insert(std::move(who));
        },
        [=](unwatch_atom, const RequestActor& who) { self->state.watchers.erase(who); },
    };
}

}  // namespace

WorkerActor spawn_worker(caf::actor_system& sys, std::weak_ptr<SharedState> shared, std::string name, uint32_t version) {
    return sys.spawn(worker_actor, std::move(shared), std::move(name), version);
}

Expected<WorkerConnection> connect_worker(caf::actor_system& sys, const std::string& address, const ClusterConfig& cluster) {
    const double timeout_ms = cluster.connect_timeout_ms;
    std::string host;
    int port = 0;
    if (!split_host_port(address, host, port)) return make_error("worker address '", address, "' is not host:port (port 1..65535)");
    const std::string fix = "; start it with `steward worker -c W.toml --listen " + address + "`, or remove the pool";
    // TLS when the actor system was started with keys (CAF reads them once, at start).
    const bool tls = sys.has_openssl_manager() && !sys.config().openssl_certificate.empty();
    if (!tls && !cluster.insecure_loopback)
        return make_error("cannot connect to the worker at ", address, ": this front has no TLS keys; give [cluster] tls_cert, tls_key and "
                          "tls_ca (a certificate of the workers' CA, docs/cluster.md#tls) and restart, or set [cluster] insecure_loopback = true "
                          "when every worker listens on loopback");
    const caf::io::middleman_actor mm = tls ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
    // Through the middleman actor with a timeout, not middleman().remote_actor(): that one blocks
    // for as long as a peer that accepted the connection stays silent (not a Steward worker).
    const auto wait = std::chrono::milliseconds((int64_t)timeout_ms);
    caf::scoped_actor self{sys};
    WorkerActor a;
    std::string why;
    self->request(mm, wait, caf::connect_atom::value, host, (uint16_t)port)
        .receive([&](const caf::node_id&, caf::strong_actor_ptr& p, const std::set<std::string>&) { a = caf::actor_cast<WorkerActor>(p); },
                 [&](caf::error& e) {
                     why = e == caf::sec::request_timeout
                               ? "it accepted the connection but did not complete CAF's handshake within " +
                                     std::to_string((long long)timeout_ms) + " ms: is a steward worker listening there" +
                                     (tls ? ", and do this front's and the worker's certificates chain to each other's [cluster] tls_ca?" : "?")
                           : e == caf::sec::disconnect_during_handshake
                               ? "it closed the connection during CAF's handshake: " +
                                     std::string(tls ? "does this front's certificate chain to the worker's [cluster] tls_ca, and the worker's to this front's?"
                                                     : "does the worker require TLS (then give this front [cluster] tls_cert, tls_key and tls_ca)?") +
                                     " The worker's log says why it refused"
                               : sys.render(e);
                 });
    if (!a) return make_error("cannot reach the worker at ", address, ": ", why.empty() ? "no actor is published there" : why, fix);
    Expected<WorkerConnection> out = make_error("the worker at ", address, " did not answer hello");
    self->request(a, wait, hello_atom::value, k_wire_version)
        .receive(
            [&](const WorkerInfo& w) {
                if (!w.refused.empty())
                    out = make_error("the worker at ", address, " refused this front: ", w.refused);
                else if (w.version != k_wire_version)
                    out = make_error("the worker at ", address, " speaks Steward wire protocol ", std::to_string(w.version),
                                     " and this front ", std::to_string(k_wire_version), "; run the same Steward version on both");
                else
                    out = WorkerConnection{a, w};
            },
            [&](caf::error& e) {
                out = make_error("the worker at ", address, " did not answer hello within ", std::to_string((long long)timeout_ms),
                                 " ms: ", sys.render(e), fix);
            });
    return out;
}

PoolMonitorActor spawn_pool_monitor(caf::actor_system& sys, PoolMonitorArgs args) {
    return sys.spawn<caf::detached>(pool_monitor_actor, std::move(args));
}

}  // namespace steward
