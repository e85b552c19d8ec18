// Spawn functions of Steward's actors. Each actor is a small state struct plus a behavior; the
// work is done by the runtime/ cores they call.
#pragma once
#include <caf/all.hpp>

#include <functional>
#include <memory>

#include "actors/messages.hpp"
#include "config/config.h"
#include "sched/engine.h"

namespace steward {

struct SharedState;  // runtime-wide objects the actors share (defined in actors/shared_state.hpp)
struct Snapshot;
struct PoolLive;
class Model;

// One per pool; detached (its own thread) because a step blocks while the forward runs. Holds the
// model as long as it runs; exits when the pool's last snapshot lets go of it.
caf::actor spawn_executor(caf::actor_system& sys, std::unique_ptr<Engine> engine, std::shared_ptr<const Model> model,
                          std::shared_ptr<PoolLive> live, std::shared_ptr<SharedState> shared, std::string pool_name);
// One per config generation: classifies requests into buckets and asks the bucket's routing
// policy for the pool. Holds no owning reference to its snapshot (the snapshot owns the router).
caf::actor spawn_router(caf::actor_system& sys, std::weak_ptr<Snapshot> snap, std::weak_ptr<SharedState> shared);
// One per runtime, detached (a reload loads models and plugins): answers reload_atom by calling
// `reload` (parse, validate completely, swap).
using ReloadFn = std::function<Expected<uint64_t>()>;
caf::actor spawn_config(caf::actor_system& sys, ReloadFn reload, std::weak_ptr<SharedState> shared);
// One per request.
struct RequestContext;
caf::actor spawn_request(caf::actor_system& sys, std::shared_ptr<RequestContext> ctx);

}  // namespace steward
