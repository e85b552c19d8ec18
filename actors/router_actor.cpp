// router_actor: classifies a request into a bucket by the config's rules and picks the bucket's
// pool. The decision carries the config generation and the hooks later policies answer
// (priority, draft budget).
#include "actors/actors.hpp"

namespace steward {

namespace {

struct router_state {
    std::shared_ptr<const Config> config;
    uint64_t generation = 0;
    static inline const char* name = "router";
};

caf::behavior router_actor(caf::stateful_actor<router_state>* self, std::shared_ptr<const Config> config, uint64_t gen) {
    self->state.config = std::move(config);
    self->state.generation = gen;
    return {
        [=](route_atom, const RouteQuery& q) {
            const Config& c = *self->state.config;
            RequestFeatures f;
            f.hint = q.hint;
            f.prompt_tokens = q.prompt_tokens;
            f.max_tokens = q.max_tokens;
            f.temperature = q.temperature;
            f.tools = q.tools;
            f.response_format = q.response_format;
            f.tenant = q.tenant;
            const BucketConfig& b = c.buckets[classify(c, f)];
            RouteDecision d;
            d.bucket = b.name;
            d.priority = b.priority;
            d.generation = self->state.generation;
            for (size_t i = 0; i < c.pools.size(); i++)
                if (c.pools[i].name == b.pool) d.pool = (int32_t)i;
            return d;
        },
    };
}

struct config_state {
    std::shared_ptr<const Config> config;
    uint64_t generation = 1;
    static inline const char* name = "config";
};

// config_actor: the live config. Reload (file watch, SIGHUP, API) arrives with the plugin issue;
// today it answers the current snapshot and its generation.
caf::behavior config_actor(caf::stateful_actor<config_state>* self, std::shared_ptr<const Config> config) {
    self->state.config = std::move(config);
    return {
        [=](config_atom) { return caf::make_message(self->state.generation, self->state.config->path); },
    };
}

}  // namespace

caf::actor spawn_router(caf::actor_system& sys, std::shared_ptr<const Config> config, uint64_t generation) {
    return sys.spawn(router_actor, std::move(config), generation);
}

caf::actor spawn_config(caf::actor_system& sys, std::shared_ptr<const Config> config) {
    return sys.spawn(config_actor, std::move(config));
}

}  // namespace steward
