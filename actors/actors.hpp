// Spawn functions of Steward's actors. Each actor is a small state struct plus a behavior; the
// work is done by the runtime/ cores they call.
#pragma once
#include <caf/all.hpp>

#include <memory>

#include "actors/messages.hpp"
#include "config/config.h"
#include "sched/engine.h"

namespace steward {

struct SharedState;  // runtime-wide objects the actors share (defined in actors/shared_state.hpp)

// One per pool; detached (its own thread) because a step blocks while the forward runs.
caf::actor spawn_executor(caf::actor_system& sys, std::unique_ptr<Engine> engine, std::shared_ptr<SharedState> shared,
                          int pool_index);
// One per runtime: classifies requests into buckets and picks their pool (rules for now).
caf::actor spawn_router(caf::actor_system& sys, std::shared_ptr<const Config> config, uint64_t generation);
// One per runtime: holds the live config and its generation.
caf::actor spawn_config(caf::actor_system& sys, std::shared_ptr<const Config> config);
// One per request.
struct RequestContext;
caf::actor spawn_request(caf::actor_system& sys, std::shared_ptr<RequestContext> ctx);

}  // namespace steward
