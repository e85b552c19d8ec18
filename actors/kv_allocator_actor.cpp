// kv_allocator_actor: one per pool. Admission before the engine's queue (runtime/kv/admission): a request
// reserves its worst-case KV blocks until it finishes, within the pool's capacity and its tenant's quota;
// it is admitted, queued (told later) or refused (overloaded, naming the limit). Block allocation itself
// stays in the engine's step.
#include <optional>
#include <unordered_map>

#include "actors/actors.hpp"

namespace steward {

namespace {

struct kv_allocator_state {
    std::optional<Admission> core;
    std::unordered_map<uint64_t, RequestActor> waiting;  // queued request -> who to tell
    AdmissionFiguresFn on_figures;
    static inline const char* name = "kv_allocator";
};

using self_ptr = KvAllocatorActor::stateful_pointer<kv_allocator_state>;

AdmitAnswer to_answer(uint64_t id, const AdmissionDecision& d) {
    return AdmitAnswer{id, static_cast<int32_t>(d.verdict), static_cast<int32_t>(d.limit), d.n_blocks, d.message};
}

void publish_figures(self_ptr self) {
    auto& st = self->state;
    if (st.on_figures) st.on_figures(st.core->options().pool, st.core->figures());
}

// Tells the waiting requests what a release or a quota change decided for them.
void notify(self_ptr self, const AdmissionUpdate& u) {
    auto& st = self->state;
    for (uint64_t id : u.admitted) {
        auto it = st.waiting.find(id);
        if (it == st.waiting.end()) continue;
        self->send(it->second, admit_atom::value, to_answer(id, AdmissionDecision{}));  // ADMIT
        st.waiting.erase(it);
    }
    for (const auto& [id, d] : u.refused) {
        auto it = st.waiting.find(id);
        if (it == st.waiting.end()) continue;
        self->send(it->second, admit_atom::value, to_answer(id, d));
        st.waiting.erase(it);
    }
}

KvAllocatorActor::behavior_type kv_allocator_actor(self_ptr self, AdmissionOptions opt, AdmissionFiguresFn on_figures) {
    self->state.core.emplace(std::move(opt));
    self->state.on_figures = std::move(on_figures);
    return {
        [=](admit_atom, const AdmitRequest& r) {
            auto& st = self->state;
            const AdmissionDecision d = st.core->request(r.id, r.tenant, r.n_blocks);
            if (d.verdict == AdmissionVerdict::QUEUE)
                st.waiting[r.id] = caf::actor_cast<RequestActor>(self->current_sender());
            publish_figures(self);
            return to_answer(r.id, d);
        },
        // Answers (empty) once the release is in the figures: the request waits for it before it
        // counts as finished, so drain() sees every reservation released.
        [=](release_atom, uint64_t id) {
            auto& st = self->state;
            st.waiting.erase(id);
            notify(self, st.core->release(id));
            publish_figures(self);
        },
        [=](quota_atom, const std::string& tenant, int32_t quota_blocks) {
            notify(self, self->state.core->set_tenant_quota(tenant, quota_blocks));
            publish_figures(self);
        },
        [=](stats_atom) {
            const Admission& a = *self->state.core;
            return AllocatorStats{a.options().n_blocks_total, a.capacity_blocks(), a.n_blocks_reserved(),
                                  a.n_reservations(), a.n_waiting()};
        },
    };
}

}  // namespace

KvAllocatorActor spawn_kv_allocator(caf::actor_system& sys, AdmissionOptions opt, AdmissionFiguresFn on_figures) {
    return sys.spawn(kv_allocator_actor, std::move(opt), std::move(on_figures));
}

}  // namespace steward
