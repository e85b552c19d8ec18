// KV admission of one pool (the kv_allocator actor's core): before a request enters the engine's queue
// it reserves ceil((prompt + max_tokens) / block_size) blocks until it finishes, within the pool's
// capacity and its tenant's KV quota; it is admitted, queued (FIFO) until reservations are released, or
// refused ("overloaded", naming the limit). Block-level allocation stays in the engine's step.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace steward {

enum class AdmissionVerdict : int32_t { ADMIT = 0, QUEUE = 1, REFUSE = 2 };
// What refused a request or made it wait.
enum class AdmissionLimit : int32_t { NONE = 0, TENANT_QUOTA = 1, POOL_CAPACITY = 2, QUEUE_LENGTH = 3 };
const char* admission_limit_name(AdmissionLimit l);  // "none", "tenant_quota", "pool_capacity", "queue_length"

struct AdmissionOptions {
    std::string pool;            // named in messages
    int32_t n_blocks_total = 0;  // the pool's KV blocks: free + evictable + in use
    int32_t max_queue = 0;       // requests waiting for a reservation; one more is refused
    // Reservations may total n_blocks_total * overcommit. 1: an admitted request never waits for blocks
    // held by another admitted one (no preemption among them); above 1 the engine's preemption absorbs
    // the difference (most requests stop well before max_tokens).
    double overcommit = 1.0;
};

struct AdmissionDecision {
    AdmissionVerdict verdict = AdmissionVerdict::ADMIT;
    AdmissionLimit limit = AdmissionLimit::NONE;  // REFUSE: what refused; QUEUE: what it waits for
    int32_t n_blocks = 0;                         // the reservation asked for
    std::string message;                          // QUEUE / REFUSE: the limit, its figures and the fix
};

// The figures of one tenant on one pool (reach the metrics as the admission section).
struct TenantAdmission {
    std::string tenant;
    int32_t quota_blocks = -1;      // -1: none
    int32_t n_blocks_reserved = 0;  // by its admitted, unreleased requests
    int32_t n_reservations = 0;     // its admitted, unreleased requests
    int32_t n_waiting = 0;          // its queued requests
    int64_t n_admitted = 0;         // admitted, at once or after waiting
    int64_t n_queued = 0;           // had to wait
    int64_t n_refused_quota = 0, n_refused_capacity = 0, n_refused_queue = 0;
    int64_t n_refused() const { return n_refused_quota + n_refused_capacity + n_refused_queue; }
};

// What a release or a quota change did to waiting requests.
struct AdmissionUpdate {
    std::vector<uint64_t> admitted;                                 // FIFO order
    std::vector<std::pair<uint64_t, AdmissionDecision>> refused;  // can no longer ever fit
};

// Not thread-safe: one owner (the pool's kv_allocator actor, or a test).
class Admission {
public:
    explicit Admission(AdmissionOptions opt);

    // The reservation of a request: ceil((n_prompt + max_tokens) / block_size) blocks.
    static int32_t blocks_for(int64_t n_prompt, int64_t max_tokens, int block_size);
    // The tenant's quota in blocks (-1: none). A lower quota refuses waiting requests that can no longer
    // fit; a higher one may admit some. Reservations already held are kept.
    AdmissionUpdate set_tenant_quota(const std::string& tenant, int32_t quota_blocks);

    // Asks for `n_blocks` for request `id` (ids must be unique among live ones). Refuses what could never
    // fit (more than the tenant's quota or the whole pool) and what would wait in a full queue; admits
    // when it fits now and nothing admissible waits before it; else queues it.
    AdmissionDecision request(uint64_t id, const std::string& tenant, int32_t n_blocks);
    // Ends a request: releases its reservation, or takes it out of the queue. Unknown ids are ignored
    // (a refused request's release). Returns the waiting requests this admitted.
    AdmissionUpdate release(uint64_t id);

    int32_t capacity_blocks() const { return capacity_; }  // n_blocks_total * overcommit
    int32_t n_blocks_reserved() const { return n_reserved_; }
    int32_t n_blocks_unreserved() const { return capacity_ - n_reserved_; }
    int32_t n_reservations() const { return static_cast<int32_t>(reserved_.size()); }
    int32_t n_waiting() const { return static_cast<int32_t>(queue_.size()); }
    bool is_admitted(uint64_t id) const { return reserved_.count(id) != 0; }
    bool is_waiting(uint64_t id) const;
    const AdmissionOptions& options() const { return opt_; }
    std::vector<TenantAdmission> figures() const;  // by tenant name

    // "" when consistent, else the first inconsistency: reserved totals vs live reservations, per
    // tenant and overall; nothing over capacity; waiting counts vs the queue.
    std::string check_invariants() const;

private:
    struct Reservation {
        std::string tenant;
        int32_t n_blocks = 0;
    };
    struct Waiting {
        uint64_t id = 0;
        std::string tenant;
        int32_t n_blocks = 0;
    };
    // Admits waiting requests in FIFO order: one blocked by its tenant's quota holds back only its
    // tenant's later requests; one blocked by the pool's capacity holds back every later one (else a
    // stream of small requests would starve a large one).
    std::vector<uint64_t> pump();
    bool fits_quota(const std::string& tenant, int32_t n_blocks) const;
    AdmissionDecision refusal(AdmissionLimit limit, const std::string& tenant, int32_t n_blocks) const;
    void reserve(uint64_t id, const std::string& tenant, int32_t n_blocks);

    AdmissionOptions opt_;
    int32_t capacity_ = 0;
    int32_t n_reserved_ = 0;
    std::unordered_map<uint64_t, Reservation> reserved_;
    std::deque<Waiting> queue_;
    std::map<std::string, TenantAdmission> tenants_;
};

}  // namespace steward
