// A plugin call's slots, the raw call through the table, and their wire form (see plugin_call.h).
#include "plugin/plugin_call.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace steward {

const char* plugin_op_name(PluginOp op) {
    switch (op) {
        case PluginOp::CREATE: return "create()";
        case PluginOp::ROUTE: return "route()";
        case PluginOp::CHECK_UPGRADE: return "check_upgrade()";
        case PluginOp::ON_OUTCOME: return "on_outcome()";
        case PluginOp::CHOOSE_VICTIM: return "choose_victim()";
        case PluginOp::DRAFT_BUDGET: return "draft budget call";
    }
    return "call";
}

uint32_t plugin_wire_layout() {
    uint32_t h = 2166136261u;  // FNV-1a over the sizes
    for (size_t s : {sizeof(steward_route_request), sizeof(steward_route_context), sizeof(steward_pool_view),
                     sizeof(steward_pool_extra), sizeof(steward_pool_load), sizeof(steward_route_decision),
                     sizeof(steward_token_view), sizeof(steward_route_outcome), sizeof(steward_evict_candidate),
                     sizeof(steward_evict_tenant), sizeof(steward_evict_context), sizeof(steward_evict_request),
                     sizeof(steward_spec_seq), sizeof(steward_spec_stats), (size_t)STEWARD_POLICY_ABI_VERSION})
        h = (h ^ (uint32_t)s) * 16777619u;
    return h;
}

// ---- frames

bool write_frame(int fd, const std::string& payload) {
    const uint32_t n = (uint32_t)payload.size();
    std::string buf(reinterpret_cast<const char*>(&n), sizeof n);
    buf += payload;
    for (size_t off = 0; off < buf.size();) {
        const ssize_t w = ::send(fd, buf.data() + off, buf.size() - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        off += (size_t)w;
    }
    return true;
}

namespace {

// Reads exactly n bytes before the deadline (a steady-clock time, or none).
FrameRead read_exact(int fd, char* p, size_t n, bool has_deadline, std::chrono::steady_clock::time_point deadline) {
    while (n > 0) {
        int wait_ms = -1;
        if (has_deadline) {
            const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now()).count();
            if (left <= 0) return FrameRead::TIMED_OUT;
            wait_ms = (int)((left + 999) / 1000);
        }
        pollfd pfd{fd, POLLIN, 0};
        const int pr = ::poll(&pfd, 1, wait_ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return FrameRead::CLOSED;
        if (pr == 0) continue;  // the deadline is checked above
        const ssize_t r = ::recv(fd, p, n, 0);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) return FrameRead::CLOSED;
        p += r;
        n -= (size_t)r;
    }
    return FrameRead::OK;
}

}  // namespace

FrameRead read_frame(int fd, std::string& out, uint32_t max_bytes, double deadline_ms) {
    const bool has_deadline = deadline_ms >= 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds((int64_t)(deadline_ms * 1000));
    uint32_t n = 0;
    FrameRead r = read_exact(fd, reinterpret_cast<char*>(&n), sizeof n, has_deadline, deadline);
    if (r != FrameRead::OK) return r;
    if (n > max_bytes) return FrameRead::BAD;
    out.resize(n);
    return n ? read_exact(fd, out.data(), n, has_deadline, deadline) : FrameRead::OK;
}

// ---- the slots

void PluginCall::point_route_views(size_t n_pools) {
    req = steward_route_request{in.request_id, in.bucket.c_str(), in.tenant.c_str(), in.n_prompt_tokens, in.max_tokens,
                                in.temperature, in.tools ? 1 : 0, in.response_format.c_str()};
    ctx = steward_route_context{};
    ctx.size = sizeof ctx;
    ctx.session = in.session.c_str();
    ctx.session_pool = in.session_pool >= 0 && (size_t)in.session_pool < n_pools ? in.session_pool : -1;
    ctx.priority = in.priority;
    ctx.slo_ttft_ms = in.slo_ttft_ms;
    ctx.slo_tpot_ms = in.slo_tpot_ms;
    ctx.deadline_ms = in.deadline_ms;
    extra.resize(n_pools);
    for (size_t i = 0; i < n_pools; i++)
        extra[i].n_cached_prompt_tokens = i < in.n_cached_prompt_tokens.size() ? in.n_cached_prompt_tokens[i] : -1;
    ctx.pools = n_pools ? extra.data() : nullptr;
    loads.resize(n_pools);
    for (size_t i = 0; i < n_pools; i++) {
        if (i < in.pool_loads.size()) {
            const RouteInput::PoolLoad& l = in.pool_loads[i];
            loads[i] = steward_pool_load{l.n_kv_blocks_used, l.n_kv_blocks_total, l.block_size, l.n_inflight, l.worker.c_str()};
        } else {
            loads[i] = steward_pool_load{-1, -1, 0, -1, ""};
        }
    }
    ctx.loads = n_pools ? loads.data() : nullptr;
}

void PluginCall::invoke(const PluginLibrary& lib, steward_policy* self, PluginOp op) {
    switch (op) {
        case PluginOp::CREATE: break;
        case PluginOp::ROUTE: {
            const steward_routing_table& t = *lib.routing();
            rc = t.route_v2 ? t.route_v2(self, &req, &ctx, pools.data(), (uint32_t)pools.size(), &d)
                            : t.route(self, &req, pools.data(), (uint32_t)pools.size(), &d);
            break;
        }
        case PluginOp::CHECK_UPGRADE: rc = lib.routing()->check_upgrade(self, &req, &token_view, &up); break;
        case PluginOp::ON_OUTCOME: rc = lib.routing()->on_outcome(self, &req, &ctx, &outcome); break;
        case PluginOp::CHOOSE_VICTIM: {
            const steward_eviction_table& t = *lib.eviction();
            rc = t.choose_victim_v2 ? t.choose_victim_v2(self, &ecx, &erq, cands.data(), (uint32_t)cands.size(), &victim)
                                    : t.choose_victim(self, &ecx, cands.data(), (uint32_t)cands.size(), &victim);
            break;
        }
        case PluginOp::DRAFT_BUDGET: {
            const steward_speculation_table& t = *lib.speculation();
            rc = t.draft_budget_seq ? t.draft_budget_seq(self, &seq, &budget) : t.draft_budget(self, &stats, &budget);
            break;
        }
    }
}

// ---- wire form of the inputs. Structs go as bytes; their pointers are meaningless on the other side
// and each is re-aimed by decode_inputs at storage of its own (a pointer left unset there would be a
// bug that crashes the plugin host, never the server).

namespace {

void put_request(WireWriter& w, const steward_route_request& req) {
    w.pod(req);
    w.str(req.bucket);
    w.str(req.tenant);
    w.str(req.response_format);
}

bool get_request(WireReader& r, PluginCall& c) {
    if (!r.pod(c.req) || !r.str(c.in.bucket) || !r.str(c.in.tenant) || !r.str(c.in.response_format)) return false;
    c.req.bucket = c.in.bucket.c_str();
    c.req.tenant = c.in.tenant.c_str();
    c.req.response_format = c.in.response_format.c_str();
    return true;
}

// The context, with its per-pool arrays when with_pools (route), else NULL (on_outcome).
void put_context(WireWriter& w, const PluginCall& c, bool with_pools) {
    w.pod(c.ctx);
    w.str(c.ctx.session);
    if (!with_pools) return;
    w.array(c.ctx.pools, (uint32_t)c.pools.size());
    w.array(c.ctx.loads, (uint32_t)c.pools.size());
    if (c.ctx.loads)
        for (size_t i = 0; i < c.pools.size(); i++) w.str(c.ctx.loads[i].worker);
}

bool get_context(WireReader& r, PluginCall& c, bool with_pools, size_t n_pools) {
    if (!r.pod(c.ctx) || !r.str(c.in.session)) return false;
    c.ctx.session = c.in.session.c_str();
    c.ctx.pools = nullptr;
    c.ctx.loads = nullptr;
    if (!with_pools) return true;
    if (!r.array(c.extra) || !r.array(c.loads)) return false;
    if ((!c.extra.empty() && c.extra.size() != n_pools) || (!c.loads.empty() && c.loads.size() != n_pools)) return false;
    c.load_workers.resize(c.loads.size());
    for (size_t i = 0; i < c.loads.size(); i++) {
        if (!r.str(c.load_workers[i])) return false;
        c.loads[i].worker = c.load_workers[i].c_str();
    }
    c.ctx.pools = c.extra.empty() ? nullptr : c.extra.data();
    c.ctx.loads = c.loads.empty() ? nullptr : c.loads.data();
    return true;
}

}  // namespace

void PluginCall::encode_inputs(PluginOp op, WireWriter& w) const {
    w.pod(op);
    switch (op) {
        case PluginOp::CREATE: break;
        case PluginOp::ROUTE:
            put_request(w, req);
            w.array(pools.data(), (uint32_t)pools.size());
            for (const auto& p : pools) w.str(p.name);
            put_context(w, *this, true);
            w.pod(d);
            break;
        case PluginOp::CHECK_UPGRADE:
            put_request(w, req);
            w.pod(token_view);
            w.array(token_view.tokens, token_view.tokens ? token_view.n : 0);
            w.array(token_view.logprobs, token_view.logprobs ? token_view.n : 0);
            w.pod(up);
            break;
        case PluginOp::ON_OUTCOME:
            put_request(w, req);
            put_context(w, *this, false);
            w.pod(outcome);
            break;
        case PluginOp::CHOOSE_VICTIM: {
            w.pod(ecx);
            w.array(ecx.tenants, ecx.n_tenants);
            w.array(cands.data(), (uint32_t)cands.size());
            const uint8_t has_erq = erq.size != 0;
            w.pod(has_erq);
            if (has_erq) {
                w.pod(erq);
                w.str(erq.bucket);
                w.str(erq.tenant);
                for (uint32_t i = 0; i < ecx.n_tenants; i++) w.str(erq.tenant_names ? erq.tenant_names[i] : "");
                w.array(erq.reuse_priority, erq.reuse_priority ? (uint32_t)cands.size() : 0u);
            }
            w.pod(victim);
            break;
        }
        case PluginOp::DRAFT_BUDGET:
            w.pod(seq);
            w.str(seq.bucket);
            w.str(seq.tenant);
            w.array(seq.accept_pos, seq.n_accept_pos);
            w.array(seq.bucket_accept_pos, seq.n_bucket_accept_pos);
            w.pod(stats);
            w.array(stats.accepted_hist, stats.n_hist);
            w.pod(budget);
            break;
    }
}

bool PluginCall::decode_inputs(PluginOp op, WireReader& r) {
    switch (op) {
        case PluginOp::CREATE: return false;
        case PluginOp::ROUTE: {
            if (!get_request(r, *this) || !r.array(pools)) return false;
            pool_names.resize(pools.size());
            for (size_t i = 0; i < pools.size(); i++) {
                if (!r.str(pool_names[i])) return false;
                pools[i].name = pool_names[i].c_str();
            }
            return get_context(r, *this, true, pools.size()) && r.pod(d);
        }
        case PluginOp::CHECK_UPGRADE: {
            if (!get_request(r, *this) || !r.pod(token_view) || !r.array(tokens) || !r.array(logprobs) || !r.pod(up)) return false;
            if ((!tokens.empty() && tokens.size() != token_view.n) || (!logprobs.empty() && logprobs.size() != token_view.n))
                return false;
            token_view.tokens = tokens.empty() ? nullptr : tokens.data();
            token_view.logprobs = logprobs.empty() ? nullptr : logprobs.data();
            if (!token_view.tokens && !token_view.logprobs) token_view.n = 0;
            return true;
        }
        case PluginOp::ON_OUTCOME: return get_request(r, *this) && get_context(r, *this, false, 0) && r.pod(outcome);
        case PluginOp::CHOOSE_VICTIM: {
            uint8_t has_erq = 0;
            if (!r.pod(ecx) || !r.array(tenants) || !r.array(cands) || !r.pod(has_erq)) return false;
            ecx.n_tenants = (uint32_t)tenants.size();
            ecx.tenants = tenants.empty() ? nullptr : tenants.data();
            erq = steward_evict_request{};
            if (has_erq) {
                if (!r.pod(erq) || !r.str(evict_bucket) || !r.str(requesting_tenant)) return false;
                tenant_name_store.resize(tenants.size());
                tenant_names.resize(tenants.size());
                for (size_t i = 0; i < tenants.size(); i++)
                    if (!r.str(tenant_name_store[i])) return false;
                for (size_t i = 0; i < tenants.size(); i++) tenant_names[i] = tenant_name_store[i].c_str();
                if (!r.array(reuse_priority)) return false;
                if (!reuse_priority.empty() && reuse_priority.size() != cands.size()) return false;
                erq.bucket = evict_bucket.c_str();
                erq.tenant = requesting_tenant.c_str();
                erq.tenant_names = tenant_names.data();
                erq.reuse_priority = reuse_priority.empty() ? nullptr : reuse_priority.data();
            }
            return r.pod(victim) && !cands.empty();
        }
        case PluginOp::DRAFT_BUDGET: {
            if (!r.pod(seq) || !r.str(spec_bucket) || !r.str(spec_tenant) || !r.array(spec_accept) || !r.array(spec_bucket_accept) ||
                !r.pod(stats) || !r.array(spec_hist) || !r.pod(budget))
                return false;
            seq.bucket = spec_bucket.c_str();
            seq.tenant = spec_tenant.c_str();
            seq.n_accept_pos = (uint32_t)spec_accept.size();
            seq.accept_pos = spec_accept.empty() ? nullptr : spec_accept.data();
            seq.n_bucket_accept_pos = (uint32_t)spec_bucket_accept.size();
            seq.bucket_accept_pos = spec_bucket_accept.empty() ? nullptr : spec_bucket_accept.data();
            stats.n_hist = (uint32_t)spec_hist.size();
            stats.accepted_hist = spec_hist.empty() ? nullptr : spec_hist.data();
            return true;
        }
    }
    return false;
}

void PluginCall::encode_result(PluginOp op, WireWriter& w) const {
    w.pod((int32_t)rc);
    switch (op) {
        case PluginOp::CREATE:
        case PluginOp::ON_OUTCOME: break;
        case PluginOp::ROUTE: w.pod(d); break;
        case PluginOp::CHECK_UPGRADE: w.pod(up); break;
        case PluginOp::CHOOSE_VICTIM: w.pod(victim); break;
        case PluginOp::DRAFT_BUDGET: w.pod(budget); break;
    }
}

bool PluginCall::decode_result(PluginOp op, WireReader& r) {
    int32_t code = 0;
    if (!r.pod(code)) return false;
    rc = code;
    bool ok = true;
    switch (op) {
        case PluginOp::CREATE:
        case PluginOp::ON_OUTCOME: break;
        case PluginOp::ROUTE: ok = r.pod(d); break;
        case PluginOp::CHECK_UPGRADE: ok = r.pod(up); break;
        case PluginOp::CHOOSE_VICTIM: ok = r.pod(victim); break;
        case PluginOp::DRAFT_BUDGET: ok = r.pod(budget); break;
    }
    return ok && r.left() == 0;  // exactly the op's answer: anything else is garbage
}

}  // namespace steward
