// KV admission: reservations against the pool's capacity and per-tenant quotas, a FIFO wait queue.
#include "kv/admission.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace steward {

const char* admission_limit_name(AdmissionLimit l) {
    switch (l) {
        case AdmissionLimit::NONE: return "none";
        case AdmissionLimit::TENANT_QUOTA: return "tenant_quota";
        case AdmissionLimit::POOL_CAPACITY: return "pool_capacity";
        case AdmissionLimit::QUEUE_LENGTH: return "queue_length";
    }
    return "none";
}

Admission::Admission(AdmissionOptions opt) : opt_(std::move(opt)) {
    capacity_ = static_cast<int32_t>(std::floor(std::max(0, opt_.n_blocks_total) * std::max(0.0, opt_.overcommit)));
}

int32_t Admission::blocks_for(int64_t n_prompt, int64_t max_tokens, int block_size) {
    if (block_size <= 0) return 0;
    const int64_t n = std::max<int64_t>(0, n_prompt + max_tokens);
    return static_cast<int32_t>((n + block_size - 1) / block_size);
}

bool Admission::is_waiting(uint64_t id) const {
    return std::any_of(queue_.begin(), queue_.end(), [&](const Waiting& w) { return w.id == id; });
}

bool Admission::fits_quota(const std::string& tenant, int32_t n_blocks) const {
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || it->second.quota_blocks < 0) return true;
    return it->second.n_blocks_reserved + n_blocks <= it->second.quota_blocks;
}

AdmissionDecision Admission::refusal(AdmissionLimit limit, const std::string& tenant, int32_t n_blocks) const {
    AdmissionDecision d;
    d.verdict = AdmissionVerdict::REFUSE;
    d.limit = limit;
    d.n_blocks = n_blocks;
    const std::string need = "overloaded: the request needs " + std::to_string(n_blocks) + " KV blocks";
    switch (limit) {
        case AdmissionLimit::TENANT_QUOTA: {
            auto it = tenants_.find(tenant);
            const int32_t q = it == tenants_.end() ? -1 : it->second.quota_blocks;
            d.message = need + " but tenant '" + tenant + "' has a KV quota of " + std::to_string(q) +
                        " blocks on pool '" + opt_.pool + "'; raise the tenant's kv_quota or lower max_tokens";
            break;
        }
        case AdmissionLimit::POOL_CAPACITY:
            d.message = need + " but pool '" + opt_.pool + "' can reserve at most " +
                        std::to_string(std::min(capacity_, opt_.n_blocks_total)) +
                        "; raise the pool's kv_blocks / kv_gib or lower max_tokens";
            break;
        case AdmissionLimit::QUEUE_LENGTH:
            d.message = "overloaded: pool '" + opt_.pool + "' already has " + std::to_string(queue_.size()) +
                        " requests waiting for KV blocks (max_queue " + std::to_string(opt_.max_queue) +
                        "); retry later or raise the pool's max_queue";
            break;
        case AdmissionLimit::NONE: break;
    }
    return d;
}

void Admission::reserve(uint64_t id, const std::string& tenant, int32_t n_blocks) {
    reserved_[id] = Reservation{tenant, n_blocks};
    n_reserved_ += n_blocks;
    TenantAdmission& t = tenants_[tenant];
    t.n_blocks_reserved += n_blocks;
    ++t.n_reservations;
    ++t.n_admitted;
}

std::vector<uint64_t> Admission::pump() {
    std::vector<uint64_t> admitted;
    std::set<std::string> held_back;  // tenants with an earlier request still waiting
    for (auto it = queue_.begin(); it != queue_.end();) {
        if (held_back.count(it->tenant)) {
            ++it;
            continue;
        }
        if (!fits_quota(it->tenant, it->n_blocks)) {
            held_back.insert(it->tenant);
            ++it;
            continue;
        }
        if (n_reserved_ + it->n_blocks > capacity_) break;
        reserve(it->id, it->tenant, it->n_blocks);
        --tenants_[it->tenant].n_waiting;
        admitted.push_back(it->id);
        it = queue_.erase(it);
    }
    return admitted;
}

AdmissionDecision Admission::request(uint64_t id, const std::string& tenant, int32_t n_blocks) {
    TenantAdmission& t = tenants_[tenant];
    t.tenant = tenant;
    if (t.quota_blocks >= 0 && n_blocks > t.quota_blocks) {
        ++t.n_refused_quota;
        return refusal(AdmissionLimit::TENANT_QUOTA, tenant, n_blocks);
    }
    if (n_blocks > std::min(capacity_, opt_.n_blocks_total)) {
        ++t.n_refused_capacity;
        return refusal(AdmissionLimit::POOL_CAPACITY, tenant, n_blocks);
    }
    // Join the queue's tail and let FIFO decide, so nobody jumps a request waiting before it.
    queue_.push_back(Waiting{id, tenant, n_blocks});
    ++t.n_waiting;
    const std::vector<uint64_t> admitted = pump();
    // Admitting this one can admit no other (it only took capacity), so the answer is about it alone.
    if (std::find(admitted.begin(), admitted.end(), id) != admitted.end())
        return {AdmissionVerdict::ADMIT, AdmissionLimit::NONE, n_blocks, ""};
    queue_.pop_back();
    --t.n_waiting;
    if (static_cast<int32_t>(queue_.size()) >= opt_.max_queue) {
        ++t.n_refused_queue;
        return refusal(AdmissionLimit::QUEUE_LENGTH, tenant, n_blocks);
    }
    queue_.push_back(Waiting{id, tenant, n_blocks});
    ++t.n_waiting;
    ++t.n_queued;
    AdmissionDecision d;
    d.verdict = AdmissionVerdict::QUEUE;
    d.n_blocks = n_blocks;
    if (!fits_quota(tenant, n_blocks)) {
        d.limit = AdmissionLimit::TENANT_QUOTA;
        d.message = "waiting for " + std::to_string(n_blocks) + " KV blocks: tenant '" + tenant + "' holds " +
                    std::to_string(t.n_blocks_reserved) + " of its quota of " + std::to_string(t.quota_blocks) +
                    " on pool '" + opt_.pool + "'";
    } else {
        d.limit = AdmissionLimit::POOL_CAPACITY;
        d.message = "waiting for " + std::to_string(n_blocks) + " KV blocks: pool '" + opt_.pool + "' has " +
                    std::to_string(n_reserved_) + " of " + std::to_string(capacity_) + " reserved, " +
                    std::to_string(queue_.size() - 1) + " requests waiting before this one";
    }
    return d;
}

AdmissionUpdate Admission::release(uint64_t id) {
    AdmissionUpdate u;
    if (auto it = reserved_.find(id); it != reserved_.end()) {
        TenantAdmission& t = tenants_[it->second.tenant];
        t.n_blocks_reserved -= it->second.n_blocks;
        --t.n_reservations;
        n_reserved_ -= it->second.n_blocks;
        reserved_.erase(it);
    } else {
        auto w = std::find_if(queue_.begin(), queue_.end(), [&](const Waiting& x) { return x.id == id; });
        if (w == queue_.end()) return u;
        --tenants_[w->tenant].n_waiting;
        queue_.erase(w);
    }
    u.admitted = pump();
    return u;
}

AdmissionUpdate Admission::set_tenant_quota(const std::string& tenant, int32_t quota_blocks) {
    TenantAdmission& t = tenants_[tenant];
    t.tenant = tenant;
    t.quota_blocks = quota_blocks < 0 ? -1 : quota_blocks;
    AdmissionUpdate u;
    if (t.quota_blocks >= 0)
        for (auto it = queue_.begin(); it != queue_.end();) {
            if (it->tenant == tenant && it->n_blocks > t.quota_blocks) {
                --t.n_waiting;
                ++t.n_refused_quota;
                u.refused.emplace_back(it->id, refusal(AdmissionLimit::TENANT_QUOTA, tenant, it->n_blocks));
                it = queue_.erase(it);
            } else {
                ++it;
            }
        }
    u.admitted = pump();
    return u;
}

std::vector<TenantAdmission> Admission::figures() const {
    std::vector<TenantAdmission> out;
    out.reserve(tenants_.size());
    for (const auto& [name, t] : tenants_) out.push_back(t);
    return out;
}

std::string Admission::check_invariants() const {
    int64_t total = 0;
    std::map<std::string, std::pair<int64_t, int32_t>> by_tenant;  // blocks, reservations
    for (const auto& [id, r] : reserved_) {
        if (r.n_blocks < 0) return "reservation of request " + std::to_string(id) + " is negative";
        total += r.n_blocks;
        by_tenant[r.tenant].first += r.n_blocks;
        ++by_tenant[r.tenant].second;
    }
    if (total != n_reserved_)
        return "reserved blocks " + std::to_string(n_reserved_) + " != sum of live reservations " + std::to_string(total);
    if (n_reserved_ < 0 || n_reserved_ > capacity_)
        return "reserved blocks " + std::to_string(n_reserved_) + " outside [0, capacity " + std::to_string(capacity_) + "]";
    std::map<std::string, int32_t> waiting;
    for (const Waiting& w : queue_) {
        ++waiting[w.tenant];
        if (reserved_.count(w.id)) return "request " + std::to_string(w.id) + " both waiting and admitted";
    }
    if (static_cast<int32_t>(queue_.size()) > std::max(opt_.max_queue, 0))
        return "queue holds " + std::to_string(queue_.size()) + " > max_queue";
    for (const auto& [name, t] : tenants_) {
        const auto& bt = by_tenant[name];
        if (t.n_blocks_reserved != bt.first || t.n_reservations != bt.second)
            return "tenant '" + name + "' reserved figures disagree with its live reservations";
        if (t.n_waiting != waiting[name]) return "tenant '" + name + "' waiting count disagrees with the queue";
    }
    return "";
}

}  // namespace steward
