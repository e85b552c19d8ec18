// config_actor: one per runtime, detached (a reload loads models and plugins). The single entry
// point of reloads (file save, SIGHUP, Runtime::reload): one at a time, in arrival order.
#include <pthread.h>

#include "actors/actors.hpp"
#include "actors/shared_state.hpp"

namespace steward {

namespace {

struct config_state {
    ReloadFn reload;
    std::function<void()> rejoin;
    std::weak_ptr<SharedState> shared;
    static inline const char* name = "config";
};

ConfigActor::behavior_type config_actor(ConfigActor::stateful_pointer<config_state> self, ReloadFn reload,
                                        std::function<void()> rejoin, std::weak_ptr<SharedState> shared) {
    pthread_setname_np(pthread_self(), "steward-config");
    self->state.reload = std::move(reload);
    self->state.rejoin = std::move(rejoin);
    self->state.shared = std::move(shared);
    return {
        // -> (ok, live generation, error message)
        [=](reload_atom) -> std::tuple<bool, uint64_t, std::string> {
            auto r = self->state.reload();
            if (r) return {true, *r, std::string()};
            uint64_t g = 0;
            if (auto sh = self->state.shared.lock())
                if (auto s = sh->snapshot()) g = s->generation;
            return {false, g, r.error().message};
        },
        [=](rejoin_atom) {
            if (self->state.rejoin) self->state.rejoin();
        },
    };
}

}  // namespace

ConfigActor spawn_config(caf::actor_system& sys, ReloadFn reload, std::function<void()> rejoin, std::weak_ptr<SharedState> shared) {
    return sys.spawn<caf::detached>(config_actor, std::move(reload), std::move(rejoin), std::move(shared));
}

}  // namespace steward
