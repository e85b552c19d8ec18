// One plugin call's inputs and outputs in C-ABI form (the slots an instance fills before a decision),
// the raw call through the plugin's table, and their wire form: length-prefixed binary frames over
// the socket between the server and a plugin host process (plugin/plugin_process.h). Both ends are the
// same build, so plain structs travel as bytes and every pointer in them is re-aimed at decoded storage.
#pragma once
#include <steward/policy.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "plugin/plugin_loader.h"
#include "plugin/route.h"

namespace steward {

// The decision functions a call reaches; each goes to the newest function of the plugin's table
// (route_v2, choose_victim_v2, draft_budget_seq when present).
enum class PluginOp : uint8_t {
    CREATE = 1,  // wire only: the plugin host's first message (plugin_process.cpp)
    ROUTE = 2,
    CHECK_UPGRADE = 3,
    ON_OUTCOME = 4,
    CHOOSE_VICTIM = 5,
    DRAFT_BUDGET = 6,
};
const char* plugin_op_name(PluginOp op);  // "route()", "choose_victim()", ...

// A frame's payload is at most this (a route over thousands of pools fits; a larger length read from
// the other end is garbage, and ends the connection).
constexpr uint32_t k_max_frame_bytes = 16u << 20;

// Appends plain values, strings and arrays to a frame's payload.
struct WireWriter {
    std::string buf;
    template <typename T>
    void pod(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        buf.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    void str(const char* s) {
        const uint32_t n = s ? (uint32_t)std::strlen(s) : 0;
        pod(n);
        if (n) buf.append(s, n);
    }
    void str(const std::string& s) { str(s.c_str()); }
    template <typename T>
    void array(const T* p, uint32_t n) {
        static_assert(std::is_trivially_copyable_v<T>);
        if (!p) n = 0;
        pod(n);
        if (n) buf.append(reinterpret_cast<const char*>(p), (size_t)n * sizeof(T));
    }
};

// Reads what WireWriter wrote; every length is checked against what is left, so a short or garbled
// frame fails (ok() false) instead of reading past it.
struct WireReader {
    const char* p = nullptr;
    const char* end = nullptr;
    bool good = true;
    explicit WireReader(const std::string& s) : p(s.data()), end(s.data() + s.size()) {}
    size_t left() const { return (size_t)(end - p); }
    bool ok() const { return good; }
    template <typename T>
    bool pod(T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        if (!good || left() < sizeof v) return good = false;
        std::memcpy(static_cast<void*>(&v), p, sizeof v);
        p += sizeof v;
        return true;
    }
    bool str(std::string& s) {
        uint32_t n = 0;
        if (!pod(n) || left() < n) return good = false;
        s.assign(p, n);
        p += n;
        return true;
    }
    template <typename T>
    bool array(std::vector<T>& v) {
        uint32_t n = 0;
        if (!pod(n) || left() / sizeof(T) < n) return good = false;
        v.resize(n);
        if (n) std::memcpy(static_cast<void*>(v.data()), p, (size_t)n * sizeof(T));
        p += (size_t)n * sizeof(T);
        return true;
    }
};

// Frame I/O on a stream socket: a uint32 length, then the payload. Writes never raise SIGPIPE.
bool write_frame(int fd, const std::string& payload);
enum class FrameRead { OK, CLOSED, TIMED_OUT, BAD };  // CLOSED: EOF or error; BAD: a length over the limit
// deadline_ms < 0: wait as long as it takes; else at most that long for the whole frame.
FrameRead read_frame(int fd, std::string& out, uint32_t max_bytes, double deadline_ms);

// The slots of one call: the C views the plugin is handed and the storage they point into, and the
// outputs. The caller fills the slots of its op (PolicyInstance in the server; decode() in a plugin
// host), invoke() calls the plugin on them.
struct PluginCall {
    int rc = STEWARD_PLUGIN_ERR;
    // routing
    RouteInput in;
    std::vector<std::string> pool_names;
    std::vector<steward_pool_view> pools;
    std::vector<steward_pool_extra> extra;
    std::vector<steward_pool_load> loads;  // worker strings point into in.pool_loads (server) or load_workers
    std::vector<std::string> load_workers;
    steward_route_request req{};
    steward_route_context ctx{};
    steward_route_decision d{};
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    steward_token_view token_view{};
    int32_t up = 0;
    steward_route_outcome outcome{};
    // eviction
    std::vector<steward_evict_candidate> cands;
    std::vector<steward_evict_tenant> tenants;
    std::vector<int32_t> reuse_priority;  // what erq.reuse_priority points at, per candidate
    std::vector<std::string> tenant_name_store;
    std::vector<const char*> tenant_names;
    std::string requesting_tenant, evict_bucket;
    steward_evict_context ecx{};
    steward_evict_request erq{};
    uint32_t victim = 0;
    // speculation
    std::string spec_bucket, spec_tenant;
    std::vector<double> spec_accept, spec_bucket_accept;  // what seq.accept_pos / bucket_accept_pos point at
    std::vector<int64_t> spec_hist;                        // what stats.accepted_hist points at
    steward_spec_seq seq{};
    steward_spec_stats stats{};
    int32_t budget = 0;

    // Points req / ctx at `in` for n_pools pools.
    void point_route_views(size_t n_pools);
    // Calls the plugin: sets rc and the op's output.
    void invoke(const PluginLibrary& lib, steward_policy* self, PluginOp op);

    // Wire form. The server encodes the op's inputs and decodes the result; a plugin host decodes the
    // inputs (false: a garbled frame) and encodes the result (rc and the op's output).
    void encode_inputs(PluginOp op, WireWriter& w) const;
    bool decode_inputs(PluginOp op, WireReader& r);
    void encode_result(PluginOp op, WireWriter& w) const;
    bool decode_result(PluginOp op, WireReader& r);
};

// A number both ends compute from the sizes of the structs that travel as bytes: a plugin host of
// another build refuses to start rather than misread them.
uint32_t plugin_wire_layout();

}  // namespace steward
