// steward-plugin-host: one policy plugin instance in a process of its own ([plugins] isolation =
// "process"). Started by the server (plugin/plugin_process.cpp) with the socket on fd 3 and the
// server's checked copy of the library on fd 4; not meant to be run by hand:
//   steward-plugin-host 3 4
// It reads the create message (kind, bucket, parameters, pools), creates the instance with the same
// code as in-process (so the same errors), answers one decision per frame, and exits at EOF.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "plugin/plugin_call.h"
#include "plugin/policies.h"

using namespace steward;

namespace {

constexpr uint32_t k_host_magic = 0x48505453;  // "STPH", as plugin_process.cpp

void reply_create(int fd, bool ok, const std::string& message) {
    WireWriter w;
    w.pod((uint8_t)(ok ? 1 : 0));
    w.str(message);
    write_frame(fd, w.buf);
}

template <typename P>
Expected<std::unique_ptr<PolicyInstance>> create(std::shared_ptr<PluginLibrary> lib, const PolicySpec& spec,
                                                 const std::string& bucket, const std::vector<std::string>& pools) {
    auto p = P::create(std::move(lib), spec, bucket, std::make_shared<PolicyCounters>(), pools);
    if (!p) return p.error();
    return std::unique_ptr<PolicyInstance>(std::move(*p));
}

}  // namespace

int main(int argc, char** argv) {
    const int fd = argc > 1 ? std::atoi(argv[1]) : 3;
    const int lib_fd = argc > 2 ? std::atoi(argv[2]) : 4;
    if (fd < 3 || lib_fd < 3 || fd == lib_fd) return 2;
    ::closefrom(std::max(fd, lib_fd) + 1);  // nothing else of the server's, should it have leaked one

    std::string frame;
    if (read_frame(fd, frame, k_max_frame_bytes, -1) != FrameRead::OK) return 2;
    WireReader r(frame);
    PluginOp op{};
    uint32_t magic = 0, layout = 0, kind = 0, n_params = 0, n_pools = 0;
    int32_t level = 0;
    std::string path, bucket;
    PolicySpec spec;
    if (!r.pod(op) || op != PluginOp::CREATE || !r.pod(magic) || magic != k_host_magic || !r.pod(layout) || !r.pod(kind) ||
        !r.pod(level) || !r.str(path) || !r.str(bucket) || !r.str(spec.plugin) || !r.str(spec.where) || !r.pod(n_params))
        return 2;
    if (layout != plugin_wire_layout()) {
        reply_create(fd, false, spec.where + ": the plugin host '" + std::string(argv[0]) +
                                    "' is of another Steward build than the server; use the steward-plugin-host built with it");
        return 2;
    }
    spdlog::set_level((spdlog::level::level_enum)std::clamp<int32_t>(level, 0, 6));
    for (uint32_t i = 0; i < n_params && r.ok(); i++) {
        std::string key, where;
        uint8_t type = 0;
        if (!r.str(key) || !r.str(where) || !r.pod(type)) break;
        PolicyParam v;
        if (type == 0) {
            int64_t x = 0;
            r.pod(x), v = x;
        } else if (type == 1) {
            double x = 0;
            r.pod(x), v = x;
        } else if (type == 2) {
            uint8_t x = 0;
            r.pod(x), v = x != 0;
        } else {
            std::string x;
            r.str(x), v = x;
        }
        spec.params[key] = v;
        if (!where.empty()) spec.param_where[key] = where;
    }
    std::vector<std::string> pools;
    if (r.ok() && r.pod(n_pools))
        for (uint32_t i = 0; i < n_pools && r.ok(); i++) r.str(pools.emplace_back());
    if (!r.ok() || kind < STEWARD_POLICY_ROUTING || kind > STEWARD_POLICY_SPECULATION) return 2;

    auto lib = PluginLibrary::open_fd(lib_fd, path, (PolicyKind)kind);
    if (!lib) {
        reply_create(fd, false, spec.where + ": bucket '" + bucket + "': " + lib.error().message);
        return 0;
    }
    Expected<std::unique_ptr<PolicyInstance>> inst = make_error("unreachable");
    switch ((PolicyKind)kind) {
        case PolicyKind::ROUTING: inst = create<RoutingPolicy>(*lib, spec, bucket, pools); break;
        case PolicyKind::EVICTION: inst = create<PluginEvictionPolicy>(*lib, spec, bucket, pools); break;
        case PolicyKind::SPECULATION: inst = create<SpeculationPolicy>(*lib, spec, bucket, pools); break;
    }
    if (!inst) {
        reply_create(fd, false, inst.error().message);
        return 0;
    }
    reply_create(fd, true, "");

    // One call per frame, answered in order; the server waits at most its budget and kills us past it.
    steward_policy* self = (*inst)->plugin_self();
    PluginCall c;
    for (;;) {
        if (read_frame(fd, frame, k_max_frame_bytes, -1) != FrameRead::OK) break;  // EOF: the server let go
        WireReader in(frame);
        if (!in.pod(op) || !c.decode_inputs(op, in)) return 3;  // the server sees EOF and restarts us
        c.invoke(**lib, self, op);
        WireWriter out;
        c.encode_result(op, out);
        if (!write_frame(fd, out.buf)) break;
    }
    return 0;  // the instance is destroyed, then the library unloaded
}
