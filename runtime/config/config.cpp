// TOML -> Config with complete validation. Unknown keys are errors (a typo must not silently
// fall back to a default), reported with their file:line:column.
#include "config/config.h"
#include "reuse/document_store.h"
#include "util/strings.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "config/limits.h"
#include "model/synth.h"

namespace steward {

namespace {

std::string where(const std::string& src, const toml::source_region& r) {
    return src + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

// Reads typed keys from one table and remembers which keys were consumed.
class TableReader {
public:
    TableReader(const toml::table& t, std::string src, std::string ctx) : t_(t), src_(std::move(src)), ctx_(std::move(ctx)) {}

    template <typename T>
    bool get(const char* key, T& out) {
        seen_.insert(key);
        const toml::node* n = t_.get(key);
        if (!n) return true;
        if constexpr (std::is_same_v<T, bool>) {
            // value<bool>() would turn -1 or 2 into true: only a TOML boolean is one.
            if (n->is_boolean()) return out = n->as_boolean()->get(), true;
            return type_error(key, *n, "a boolean (true/false)");
        } else if constexpr (std::is_integral_v<T>) {
            // Read as int64 and range-checked: never narrowed (4294967297 is not 1), and a boolean
            // is not an integer.
            if (!n->is_integer()) return type_error(key, *n, "an integer");
            const int64_t v = n->as_integer()->get();
            const int64_t lo = std::is_signed_v<T> ? (int64_t)std::numeric_limits<T>::min() : 0;
            const int64_t hi = sizeof(T) >= 8 ? std::numeric_limits<int64_t>::max() : (int64_t)std::numeric_limits<T>::max();
            if (v < lo || v > hi)
                return fail_at(*n, ctx_ + "." + key + " is " + std::to_string(v) + ", out of range [" + std::to_string(lo) +
                                       ", " + std::to_string(hi) + "]");
            return out = (T)v, true;
        } else if constexpr (std::is_floating_point_v<T>) {
            // An integer is a number; a boolean is not. NaN and inf mean nothing in a config.
            double v = 0;
            if (n->is_floating_point()) v = n->as_floating_point()->get();
            else if (n->is_integer()) v = (double)n->as_integer()->get();
            else return type_error(key, *n, "a number");
            if (!std::isfinite(v)) return fail_at(*n, ctx_ + "." + key + " is " + std::to_string(v) + "; it must be a finite number");
            return out = (T)v, true;
        } else if constexpr (std::is_same_v<T, std::string>) {
            if (auto v = n->value<std::string>()) return out = *v, true;
            return type_error(key, *n, "a string");
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            if (const toml::array* a = n->as_array()) {
                out.clear();
                for (const auto& e : *a) {
                    auto s = e.value<std::string>();
                    if (!s) return type_error(key, e, "an array of strings");
                    out.push_back(*s);
                }
                return true;
            }
            if (auto s = n->value<std::string>()) return out = {*s}, true;
            return type_error(key, *n, "a string or an array of strings");
        } else {
            static_assert(sizeof(T) == 0, "unsupported type");
        }
    }
    // get() and then lo <= value <= hi, else an error naming the key, the value and `want`.
    template <typename T>
    bool get_in(const char* key, T& out, double lo, double hi, const std::string& want) {
        if (!get(key, out)) return false;
        const toml::node* n = t_.get(key);
        if (!n || ((double)out >= lo && (double)out <= hi)) return true;
        std::ostringstream v;
        v << out;
        return fail_at(*n, ctx_ + "." + key + " is " + v.str() + "; it must be " + want);
    }
    bool has(const char* key) const { return t_.get(key) != nullptr; }
    // A plugin isolation mode: "in_process" or "process"; left unset when the key is absent.
    bool get_isolation(const char* key, std::optional<PluginIsolation>& out) {
        std::string v;
        if (!get(key, v)) return false;
        const toml::node* n = t_.get(key);
        if (!n) return true;
        if (v == "in_process") return out = PluginIsolation::IN_PROCESS, true;
        if (v == "process") return out = PluginIsolation::PROCESS, true;
        return fail_at(*n, ctx_ + "." + key + " is \"" + v +
                               "\"; use \"in_process\" (plugins run inside the server) or \"process\" (each plugin "
                               "instance in a supervised plugin host process; docs/plugin-abi.md#isolation)");
    }
    template <typename T>
    bool get_opt(const char* key, std::optional<T>& out) {
        if (!t_.get(key)) {
            seen_.insert(key);
            return true;
        }
        T v{};
        if (!get(key, v)) return false;
        out = v;
        return true;
    }
    // Every key of the table not read so far, as a policy's parameters (scalars only).
    bool rest_as_params(PolicySpec& spec) {
        for (const auto& [k, v] : t_) {
            const std::string key(k.str());
            if (seen_.count(key)) continue;
            seen_.insert(key);
            PolicyParam p;
            if (auto i = v.value_exact<int64_t>()) p = *i;
            else if (auto d = v.value_exact<double>()) p = *d;
            else if (auto b = v.value_exact<bool>()) p = *b;
            else if (auto s = v.value_exact<std::string>()) p = *s;
            else return fail_at(v, ctx_ + "." + key + ": plugin parameters must be strings, numbers or booleans");
            spec.params[key] = p;
            spec.param_where[key] = where(src_, k.source());
        }
        return true;
    }
    const toml::table* sub(const char* key) {
        seen_.insert(key);
        const toml::node* n = t_.get(key);
        if (!n) return nullptr;
        return n->as_table();
    }
    // Fails on keys nobody read: a typo is an error, not a silent default.
    bool finish() {
        for (const auto& [k, v] : t_) {
            if (!seen_.count(std::string(k.str()))) {
                err = where(src_, k.source()) + ": unknown key '" + std::string(k.str()) + "' in " + ctx_ +
                      "; check the spelling against the config reference, docs/config.md";
                return false;
            }
        }
        return true;
    }
    bool fail_at(const toml::node& n, const std::string& msg) {
        if (err.empty()) err = where(src_, n.source()) + ": " + msg;
        return false;
    }
    bool fail_key(const char* key, const std::string& msg) {
        const toml::node* n = t_.get(key);
        if (err.empty()) err = where(src_, n ? n->source() : t_.source()) + ": " + ctx_ + "." + key + " " + msg;
        return false;
    }
    std::string err;

private:
    bool type_error(const char* key, const toml::node& n, const char* want) {
        std::ostringstream got;
        got << n.type();
        const std::string g = got.str();
        const bool vowel = !g.empty() && std::string("aeiou").find(g[0]) != std::string::npos;  // an integer, an array
        return fail_at(n, ctx_ + "." + key + " must be " + want + ", got " + (vowel ? "an " : "a ") + g);
    }
    const toml::table& t_;
    std::string src_, ctx_;
    std::set<std::string> seen_;
};

const toml::array* array_of_tables(const toml::table& root, const char* key, std::string& err, const std::string& src) {
    const toml::node* n = root.get(key);
    if (!n) return nullptr;
    const toml::array* a = n->as_array();
    if (!a || !a->is_array_of_tables()) {
        err = where(src, n->source()) + ": '" + key + "' must be an array of tables: write [[" + key + "]] sections";
        return nullptr;
    }
    return a;
}

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h ? h : 1;
}

}  // namespace

bool plugin_is_path(const std::string& plugin) {
    return plugin.find('/') != std::string::npos ||
           (plugin.size() > 3 && plugin.compare(plugin.size() - 3, 3, ".so") == 0);
}

const PoolConfig* Config::find_pool(const std::string& name) const {
    for (const auto& p : pools)
        if (p.name == name) return &p;
    return nullptr;
}

const TenantConfig* Config::find_tenant(const std::string& name) const {
    for (const auto& t : tenants)
        if (t.name == name) return &t;
    return nullptr;
}

uint64_t Config::tenant_salt(const std::string& tenant) const {
    if (const TenantConfig* t = find_tenant(tenant); t && t->salt) return t->salt;
    return fnv1a("tenant:" + tenant);
}

namespace {

// A device profile or model shape file of [pool.sim] (path relative to the config's folder): its
// one table [name] (a copy, with its source positions), nothing else beside it; `keys` names what
// the table needs in the error for a file without it.
Expected<toml::table> read_sim_table(const std::string& path, const std::string& what, const std::string& at,
                                     const char* name, const std::string& keys) {
    auto text = read_regular_file(path, 1 << 20, what);
    if (!text) return make_error(at, text.error().message, "; [pool.sim] names it relative to this config's folder");
    toml::table root;
    try {
        root = toml::parse(*text, path);
    } catch (const toml::parse_error& e) {
        return make_error(where(path, e.source()), ": TOML syntax error: ", std::string(e.description()));
    }
    TableReader top(root, path, "the " + what);
    const toml::table* t = top.sub(name);
    if (!top.finish()) return make_error(top.err);
    if (!t) return make_error(path, ": a ", what, " needs a [", name, "] table (", keys, ")");
    return *t;
}

bool sim_dtype_ok(const std::string& d) { return d == "f32" || d == "bf16" || d == "f16" || d == "fp8"; }

Expected<SimDeviceConfig> read_sim_device(const std::string& path, const std::string& at) {
    auto t = read_sim_table(path, "sim device profile", at, "device", "name, tflops_16, hbm_gbps, hbm_gib, ...");
    if (!t) return t.error();
    SimDeviceConfig d;
    d.file = path;
    TableReader r(*t, path, "[device]");
    const std::string pos = "a number > 0", eff = "in (0, 1]";
    if (!r.get("name", d.name) || !r.get_in("tflops_16", d.tflops_16, 1e-6, 1e9, pos) ||
        !r.get_in("tflops_8", d.tflops_8, 0, 1e9, "a number >= 0 (0: tflops_16)") ||
        !r.get_in("tflops_32", d.tflops_32, 0, 1e9, "a number >= 0 (0: tflops_16 / 2)") ||
        !r.get_in("hbm_gbps", d.hbm_gbps, 1e-6, 1e9, pos) || !r.get_in("hbm_gib", d.hbm_gib, 1e-6, 1e9, pos) ||
        !r.get_in("link_gbps", d.link_gbps, 0, 1e9, "a number >= 0 (0: no tensor parallelism)") ||
        !r.get_in("link_latency_us", d.link_latency_us, 0, 1e9, "a number >= 0") ||
        !r.get_in("eff_gemm", d.eff_gemm, 1e-6, 1, eff) || !r.get_in("eff_attn", d.eff_attn, 1e-6, 1, eff) ||
        !r.get_in("eff_mem", d.eff_mem, 1e-6, 1, eff) ||
        !r.get_in("eff_attn_decode", d.eff_attn_decode, 1e-6, 1, eff + " (omitted: eff_attn)") ||
        !r.get_in("gemm_ramp_tokens", d.gemm_ramp_tokens, 0, 1e6, "a number of tokens >= 0 (0: no ramp)") ||
        !r.get_in("step_overhead_us", d.step_overhead_us, 0, 1e9, "a number >= 0") ||
        !r.get_in("layer_overhead_us", d.layer_overhead_us, 0, 1e9, "a number >= 0") || !r.finish())
        return make_error(r.err);
    for (const char* k : {"tflops_16", "hbm_gbps", "hbm_gib"})
        if (!r.has(k)) return make_error(where(path, t->source()), ": [device] needs ", k);
    if (d.name.empty()) d.name = std::filesystem::path(path).stem().string();
    return d;
}

Expected<SimModelConfig> read_sim_model(const std::string& path, const std::string& at) {
    auto t = read_sim_table(path, "sim model shape", at, "model", "layers, dim, heads, kv_heads, ffn, vocab, ...");
    if (!t) return t.error();
    SimModelConfig m;
    m.file = path;
    TableReader r(*t, path, "[model]");
    if (!r.get("name", m.name) || !r.get_in("layers", m.layers, 1, 1024, "in [1, 1024]") ||
        !r.get_in("dim", m.dim, 1, 1 << 17, "in [1, 131072]") || !r.get_in("heads", m.heads, 1, 1024, "in [1, 1024]") ||
        !r.get_in("kv_heads", m.kv_heads, 1, 1024, "in [1, 1024]") ||
        !r.get_in("head_dim", m.head_dim, 0, 1024, "in [0, 1024] (0: dim / heads)") ||
        !r.get_in("ffn", m.ffn, 1, 1 << 20, "in [1, 1048576]") || !r.get_in("vocab", m.vocab, 354, 1 << 20, "in [354, 1048576]") ||
        !r.get_in("ctx", m.ctx, 16, 1 << 24, "in [16, 16777216]") || !r.get("weight_dtype", m.weight_dtype) ||
        !r.get("kv_dtype", m.kv_dtype) || !r.finish())
        return make_error(r.err);
    for (const char* k : {"layers", "dim", "heads", "kv_heads", "ffn", "vocab"})
        if (!r.has(k)) return make_error(where(path, t->source()), ": [model] needs ", k);
    if (m.heads % m.kv_heads)
        return make_error(where(path, t->source()), ": [model] heads (", m.heads, ") must be a multiple of kv_heads (", m.kv_heads, ")");
    if (m.head_dim == 0) {
        if (m.dim % m.heads) return make_error(where(path, t->source()), ": [model] dim must be a multiple of heads, or set head_dim");
        m.head_dim = m.dim / m.heads;
    }
    if (!sim_dtype_ok(m.weight_dtype) || !sim_dtype_ok(m.kv_dtype))
        return make_error(where(path, t->source()), ": [model] weight_dtype and kv_dtype must be \"f32\", \"bf16\", \"f16\" or \"fp8\"");
    if (m.name.empty()) m.name = std::filesystem::path(path).stem().string();
    return m;
}

}  // namespace

Expected<Config> parse_config(const std::string& text, const std::string& src) {
    toml::table root;
    try {
        root = toml::parse(text, src);
    } catch (const toml::parse_error& e) {
        return make_error(where(src, e.source()), ": TOML syntax error: ", std::string(e.description()));
    }
    Config c;
    c.path = src;
    std::string err;
    auto fail = [&](const std::string& m) { return make_error(m); };

    TableReader top(root, src, "the config");
    for (const char* k : {"pool", "bucket", "tenant", "public_prefix"}) top.sub(k);  // arrays, read below
    if (const toml::table* t = top.sub("limits")) {
        TableReader r(*t, src, "[limits]");
        const std::string ms = "in [0, 1e9] ms (0: none)";
        if (!r.get_in("request_timeout_ms", c.limits.request_timeout_ms, 0, k_max_ms, ms) ||
            !r.get_in("session_ttl_ms", c.limits.session_ttl_ms, 0, k_max_ms, "in [0, 1e9] ms") ||
            !r.get_in("max_tokens_default", c.limits.max_tokens_default, 1, 1 << 20, "in [1, 1048576]") ||
            !r.get_in("max_draft_tokens", c.limits.max_draft_tokens, 0, 256, "in [0, 256]") || !r.finish())
            return fail(r.err);
        c.limits.max_tokens_default_set = r.has("max_tokens_default");
    }
    if (const toml::table* t = top.sub("server")) {
        TableReader r(*t, src, "[server]");
        ServerConfig& sv = c.server;
        if (!r.get("host", sv.host) || !r.get_in("port", sv.port, 0, 65535, "in [0, 65535]") ||
            !r.get_in("io_threads", sv.io_threads, 1, 256, "in [1, 256]") ||
            !r.get_in("max_connections", sv.max_connections, 1, 1 << 20, "in [1, 1048576]") ||
            !r.get_in("max_body_bytes", sv.max_body_bytes, 1024, 1LL << 30, "in [1024, 1073741824] bytes") ||
            !r.get_in("max_header_bytes", sv.max_header_bytes, 1024, 1 << 20, "in [1024, 1048576] bytes") ||
            !r.get_in("read_timeout_ms", sv.read_timeout_ms, 1, k_max_ms, "in [1, 1e9] ms") ||
            !r.get_in("idle_timeout_ms", sv.idle_timeout_ms, 1, k_max_ms, "in [1, 1e9] ms") ||
            !r.get_in("write_timeout_ms", sv.write_timeout_ms, 1, k_max_ms, "in [1, 1e9] ms") ||
            !r.get_in("max_stream_buffer_bytes", sv.max_stream_buffer_bytes, 4096, 1LL << 30, "in [4096, 1073741824] bytes") ||
            !r.get_in("trace_requests", sv.trace_requests, 0, 1 << 20, "in [0, 1048576]") || !r.finish())
            return fail(r.err);
    }
    const std::filesystem::path base = std::filesystem::path(src).parent_path();
    if (const toml::table* t = top.sub("plugins")) {
        TableReader r(*t, src, "[plugins]");
        std::optional<PluginIsolation> isolation;
        if (!r.get("dirs", c.plugins.dirs) || !r.get("decision_budget_ms", c.plugins.decision_budget_ms) ||
            !r.get("step_decision_budget_ms", c.plugins.step_decision_budget_ms) ||
            !r.get("check_in_child", c.plugins.check_in_child) || !r.get("check_timeout_ms", c.plugins.check_timeout_ms) ||
            !r.get_isolation("isolation", isolation) || !r.finish())
            return fail(r.err);
        if (isolation) c.plugins.isolation = *isolation;
        for (double v : {c.plugins.decision_budget_ms, c.plugins.step_decision_budget_ms, c.plugins.check_timeout_ms})
            if (!(v >= 0 && v <= 3.6e6))
                return fail(where(src, t->source()) +
                            ": [plugins] decision_budget_ms, step_decision_budget_ms and check_timeout_ms must be 0..3600000 (ms)");
        for (auto& d : c.plugins.dirs)
            if (std::filesystem::path(d).is_relative() && !base.empty()) d = (base / d).string();
    }
    if (const toml::table* t = top.sub("cpu")) {
        TableReader r(*t, src, "[cpu]");
        if (!r.get_in("prefetch_bytes", c.cpu.prefetch_bytes, 0, 65536, "in [0, 65536] bytes (0: the measured plan)") ||
            !r.get_in("gemm_min_tokens", c.cpu.gemm_min_tokens, 0, 4096, "in [0, 4096] tokens (0: the measured plan)") ||
            !r.get_in("f32_stream_rows", c.cpu.f32_stream_rows, 0, 4, "0 (the measured plan), 1 or 4 rows") ||
            !r.get_in("half_stream_rows", c.cpu.half_stream_rows, 0, 4, "0 (the measured plan), 1 or 4 rows") || !r.finish())
            return fail(r.err);
        for (const auto& [key, v] : {std::pair<const char*, int>{"f32_stream_rows", c.cpu.f32_stream_rows}, {"half_stream_rows", c.cpu.half_stream_rows}})
            if (v != 0 && v != 1 && v != 4)
                return fail(where(src, t->source()) + ": [cpu] " + key + " " + std::to_string(v) +
                            " is no tile the kernels have; give 0 (the measured plan), 1 (a row at a time) or 4 (4-row tiles)");
        if (c.cpu.prefetch_bytes > 0 && c.cpu.prefetch_bytes < 64)
            return fail(where(src, t->source()) + ": [cpu] prefetch_bytes " + std::to_string(c.cpu.prefetch_bytes) +
                        " is under a cache line; give 0 (the measured plan) or 64 to 65536");
    }
    if (const toml::table* t = top.sub("reload")) {
        TableReader r(*t, src, "[reload]");
        if (!r.get("watch", c.reload.watch) || !r.get_in("debounce_ms", c.reload.debounce_ms, 0, 60000, "in [0, 60000]") ||
            !r.finish())
            return fail(r.err);
    }
    if (const toml::table* t = top.sub("cluster")) {
        TableReader r(*t, src, "[cluster]");
        ClusterConfig& cl = c.cluster;
        const std::string want = "in [1, 3600000] ms";
        if (!r.get_in("connect_timeout_ms", cl.connect_timeout_ms, 1, 3.6e6, want) ||
            !r.get_in("heartbeat_ms", cl.heartbeat_ms, 1, 3.6e6, want) ||
            !r.get_in("heartbeat_timeout_ms", cl.heartbeat_timeout_ms, 1, 3.6e6, want) ||
            !r.get_in("reconnect_ms", cl.reconnect_ms, 1, 3.6e6, want) || !r.get("tls_cert", cl.tls_cert) ||
            !r.get("tls_key", cl.tls_key) || !r.get("tls_ca", cl.tls_ca) || !r.get("insecure_loopback", cl.insecure_loopback) ||
            !r.get_in("max_frame_bytes", cl.max_frame_bytes, 65536, 4294967295.0, "in [65536, 4294967295] bytes") ||
            !r.get_in("max_connections", cl.max_connections, 1, 65536, "in [1, 65536]") ||
            !r.get_in("max_pending_bytes", cl.max_pending_bytes, 65536, 1e12, "in [65536, 1e12] bytes") || !r.finish())
            return fail(r.err);
        const std::string at = where(src, t->source()) + ": [cluster] ";
        if (cl.max_pending_bytes < cl.max_frame_bytes)
            return fail(at + "max_pending_bytes (" + std::to_string(cl.max_pending_bytes) + ") is below max_frame_bytes (" +
                        std::to_string(cl.max_frame_bytes) + "): no frame of the largest size could pass; raise it");
        const int n_tls = !cl.tls_cert.empty() + !cl.tls_key.empty() + !cl.tls_ca.empty();
        if (n_tls != 0 && n_tls != 3)
            return fail(at + "tls_cert, tls_key and tls_ca go together (missing:" + (cl.tls_cert.empty() ? " tls_cert" : "") +
                        (cl.tls_key.empty() ? " tls_key" : "") + (cl.tls_ca.empty() ? " tls_ca" : "") +
                        "); give all three PEM files (docs/cluster.md#tls)");
        if (n_tls == 3 && cl.insecure_loopback)
            return fail(at + "insecure_loopback = true and tls_cert are both set; keep TLS and remove insecure_loopback");
        for (auto [key, f] : {std::pair<const char*, std::string*>{"tls_cert", &cl.tls_cert}, {"tls_key", &cl.tls_key}, {"tls_ca", &cl.tls_ca}}) {
            if (f->empty()) continue;
            if (std::filesystem::path(*f).is_relative() && !base.empty()) *f = (base / *f).string();
            std::error_code ec;
            if (!std::filesystem::is_regular_file(*f, ec))
                return fail(at + key + " '" + *f + "' is not a file; give a PEM file (docs/cluster.md#tls says how to make them)");
        }
        if (cl.heartbeat_timeout_ms <= cl.heartbeat_ms)
            return fail(where(src, t->source()) + ": [cluster] heartbeat_timeout_ms (" + std::to_string((long long)cl.heartbeat_timeout_ms) +
                        ") must be longer than heartbeat_ms (" + std::to_string((long long)cl.heartbeat_ms) +
                        "), or every worker would be declared lost between two heartbeats");
    }
    if (const toml::table* t = top.sub("metrics")) {
        TableReader r(*t, src, "[metrics]");
        if (!r.get("vllm_names", c.metrics.vllm_names) || !r.finish()) return fail(r.err);
    }
    if (const toml::table* t = top.sub("tracing")) {
        TableReader r(*t, src, "[tracing]");
        if (!r.get("otlp_file", c.tracing.otlp_file) || !r.finish()) return fail(r.err);
        std::string& f = c.tracing.otlp_file;
        if (!f.empty() && std::filesystem::path(f).is_relative() && !base.empty()) f = (base / f).string();
    }
    if (const toml::table* t = top.sub("sim")) {
        TableReader r(*t, src, "[sim]");
        if (!r.get_in("dilation", c.sim.dilation, 1e-3, 1e6, "in [0.001, 1e6] simulated seconds per real second") || !r.finish())
            return fail(r.err);
    }
    if (!top.finish()) return fail(top.err);

    if (const toml::array* a = array_of_tables(root, "pool", err, src)) {
        for (const auto& n : *a) {
            const toml::table& t = *n.as_table();
            PoolConfig p;
            TableReader r(t, src, "[[pool]]");
            const std::string threads_want = "0 (all " + std::to_string(n_cores()) + " cores) or 1.." +
                                             std::to_string(max_threads()) + " (4 x the cores of this machine)";
            const double price_max = 1e9;  // per million tokens
            bool ok = r.get("name", p.name) && r.get("model", p.model) && r.get("backend", p.backend) &&
                      r.get_in("threads", p.threads, 0, max_threads(), threads_want) &&
                      r.get_in("kv_blocks", p.kv_blocks, 0, (double)k_max_kv_blocks, "in [0, 16777216] (0: from kv_gib)") &&
                      r.get_in("kv_gib", p.kv_gib, 0, 1 << 20, "in [0, 1048576] GiB") &&
                      r.get("block_size", p.block_size) && r.get("kv_dtype", p.kv_dtype) &&
                      r.get("kv_type_k", p.kv_type_k) && r.get("kv_type_v", p.kv_type_v) &&
                      r.get_in("max_batch", p.max_batch, 1, (double)k_max_batch, "in [1, 4096] sequences") &&
                      r.get_in("max_batch_tokens", p.max_batch_tokens, 1, (double)k_max_batch_tokens, "in [1, 65536] tokens") &&
                      r.get_in("spec_max_slowdown", p.spec_max_slowdown, 0, 10, "in [0, 10] (a share of the plain step; 0: no cap)") &&
                      r.get_in("max_queue", p.max_queue, 1, (double)k_max_queue, "in [1, 1048576] requests (0 would refuse every request)") &&
                      r.get("prefix_cache", p.prefix_cache) && r.get("chat_template_file", p.chat_template_file) &&
                      r.get("pooling", p.pooling) &&
                      r.get("chat_template_fallback", p.chat_template_fallback) &&
                      r.get_in("ctx", p.ctx, 0, 1 << 24, "in [0, 16777216] tokens (0: the model's trained context)") &&
                      r.get("draft", p.draft) && r.get("remote", p.remote) && r.get("remote_pool", p.remote_pool) &&
                      r.get_in("price_prompt", p.price_prompt, 0, price_max, "a price >= 0 per million tokens") &&
                      r.get_in("price_output", p.price_output, 0, price_max, "a price >= 0 per million tokens") &&
                      r.get_in("price_cached", p.price_cached, 0, price_max, "a price >= 0 per million tokens") &&
                      r.get_in("quality", p.quality, 0, 1, "in [0, 1] (or omitted: from the parameter count)") &&
                      r.get_in("kv_overcommit", p.kv_overcommit, 1, 64, "in [1, 64] (1: KV reservations never exceed the pool)") &&
                      r.get_in("gpu_memory_fraction", p.gpu_memory_fraction, 0.05, 1, "in [0.05, 1] (a share of the device's free memory)") &&
                      r.get("cuda_graphs", p.cuda_graphs);
            if (!ok) return fail(r.err);
            p.kv_size_set = r.has("kv_blocks") || r.has("kv_gib");
            if (const toml::table* st = r.sub("synth")) {
                SynthConfig s;
                TableReader sr(*st, src, "[pool.synth]");
                const double dmax = 1 << 16;
                if (!sr.get("arch", s.arch) || !sr.get_in("dim", s.dim, 1, dmax, "in [1, 65536]") ||
                    !sr.get_in("layers", s.layers, 1, 1024, "in [1, 1024]") || !sr.get_in("heads", s.heads, 1, 1024, "in [1, 1024]") ||
                    !sr.get_in("kv_heads", s.kv_heads, 1, 1024, "in [1, 1024]") || !sr.get_in("ffn", s.ffn, 1, 1 << 18, "in [1, 262144]") ||
                    !sr.get_in("vocab", s.vocab, 354, 1 << 20, "in [354, 1048576]") ||
                    !sr.get_in("ctx", s.ctx, 1, 1 << 24, "in [1, 16777216]") || !sr.get("dtype", s.dtype) ||
                    !sr.get("seed", s.seed) || !sr.get("draft_from", s.draft_from) ||
                    !sr.get_in("keep_layers", s.keep_layers, 0, 1024, "in [1, 1024] (with draft_from)") ||
                    !sr.get_in("late_scale", s.late_scale, 0, 1e3, "a number >= 0 (a residual scale; 1: off)") ||
                    !sr.get_in("late_from", s.late_from, -1, 1024, "-1 (off) or a layer index in [0, layers]") || !sr.finish())
                    return fail(sr.err);
                const std::string at = where(src, st->source()) + ": [pool.synth] of pool '" + p.name + "': ";
                if (s.draft_from.empty()) {
                    if (sr.has("keep_layers")) return fail(at + "keep_layers is only for a draft; add draft_from = \"<pool>\" or drop it");
                    SynthSpec spec;
                    spec.arch = s.arch, spec.n_embd = s.dim, spec.n_layer = s.layers, spec.n_head = s.heads;
                    spec.n_head_kv = s.kv_heads, spec.n_ff = s.ffn, spec.n_vocab = s.vocab, spec.n_ctx = s.ctx;
                    auto dt = parse_ggml_type(s.dtype);
                    if (!dt) return fail(at + dt.error().message);
                    spec.dtype = *dt;
                    spec.late_scale = (float)s.late_scale;
                    spec.late_from = s.late_from;
                    if (auto v = synth_validate(spec); !v) return fail(at + v.error().message);
                } else {
                    if (sr.has("late_scale") || sr.has("late_from"))
                        return fail(at + "late_scale / late_from shape a target's layers; set them on the pool the draft "
                                         "is cut from (\"" + s.draft_from + "\")");
                    if (s.keep_layers < 1) return fail(at + "draft_from needs keep_layers = N (N >= 1 layers of the target)");
                    if (s.draft_from == p.name) return fail(at + "draft_from names the pool itself; name the target pool it is cut from");
                }
                p.synth = s;
            }
            if (const toml::table* st = r.sub("sim")) {
                SimPoolConfig sc;
                TableReader sr(*st, src, "[pool.sim]");
                std::string device, model, draft;
                if (!sr.get("device", device) || !sr.get("model", model) || !sr.get("draft", draft) ||
                    !sr.get_in("tp", sc.tp, 1, 64, "in [1, 64] devices") ||
                    !sr.get_in("memory_fraction", sc.memory_fraction, 0.01, 1, "in [0.01, 1]") ||
                    !sr.get_in("acceptance", sc.acceptance, 0, 1, "in [0, 1] (a draft token's acceptance per position)") ||
                    !sr.get_in("concentration", sc.concentration, 0.01, 1e6, "in [0.01, 1e6]") || !sr.get("seed", sc.seed) ||
                    !sr.finish())
                    return fail(sr.err);
                const std::string at = where(src, st->source()) + ": [pool.sim] of pool '" + p.name + "': ";
                if (device.empty() || model.empty())
                    return fail(at + "needs device = \"<profile>.toml\" and model = \"<shape>.toml\" (configs/sim has A100, H100, H200 and 8B, 70B)");
                auto rel = [&](std::string f) { return std::filesystem::path(f).is_relative() && !base.empty() ? (base / f).string() : f; };
                auto d = read_sim_device(rel(device), at);
                if (!d) return fail(d.error().message);
                sc.device = *d;
                auto m = read_sim_model(rel(model), at);
                if (!m) return fail(m.error().message);
                sc.model = *m;
                if (!draft.empty()) {
                    auto dm = read_sim_model(rel(draft), at);
                    if (!dm) return fail(dm.error().message);
                    if (dm->vocab != sc.model.vocab)
                        return fail(at + "draft '" + dm->name + "' has vocab " + std::to_string(dm->vocab) + " and the model " +
                                    std::to_string(sc.model.vocab) + "; a draft shares the target's vocabulary");
                    sc.draft = *dm;
                }
                if (sc.tp > 1 && !(sc.device.link_gbps > 0))
                    return fail(at + "tp = " + std::to_string(sc.tp) + " needs the device profile's link_gbps (the all-reduce bandwidth)");
                p.sim = sc;
            }
            if (const toml::table* kt = r.sub("kv_tiers")) {
                TableReader kr(*kt, src, "[pool.kv_tiers]");
                KvTiersConfig& k = p.kv_tiers;
                if (!kr.get_in("host_gib", k.host_gib, 0, 1 << 20, "in [0, 1048576] GiB (0: no host tier)") ||
                    !kr.get_in("disk_gib", k.disk_gib, 0, 1 << 24, "in [0, 16777216] GiB (0: no disk tier)") ||
                    !kr.get("disk_dir", k.disk_dir) || !kr.finish())
                    return fail(kr.err);
                const std::string at = where(src, kt->source()) + ": [pool.kv_tiers] of pool '" + p.name + "': ";
                if (k.disk_gib > 0 && k.disk_dir.empty())
                    return fail(at + "disk_gib needs disk_dir = \"DIR\" (a private directory for this pool's KV files; created 0700)");
                if (k.disk_gib <= 0 && !k.disk_dir.empty())
                    return fail(at + "disk_dir without disk_gib; set disk_gib = N (GiB of KV files) or drop disk_dir");
                if (!k.enabled()) return fail(at + "set host_gib and/or disk_gib (both 0 means no tiers: drop the table)");
                if (!k.disk_dir.empty() && std::filesystem::path(k.disk_dir).is_relative() && !base.empty())
                    k.disk_dir = (base / k.disk_dir).lexically_normal().string();
            }
            if (!r.finish()) return fail(r.err);
            if (p.name.empty()) return fail(where(src, t.source()) + ": [[pool]] needs a name");
            if (p.backend == "sim" || p.sim) {
                const std::string at = where(src, t.source()) + ": pool '" + p.name + "' ";
                if (p.backend != "sim") return fail(at + "has [pool.sim] but backend = \"" + p.backend + "\"; set backend = \"sim\" or drop [pool.sim]");
                if (!p.sim) return fail(at + "has backend = \"sim\" but no [pool.sim] table; add one with device = and model = (see configs/sim)");
                for (const char* k : {"model", "synth", "draft", "remote", "threads", "kv_gib", "kv_dtype", "kv_type_k",
                                      "kv_type_v", "gpu_memory_fraction", "cuda_graphs", "ctx"})
                    if (r.has(k))
                        return fail(at + "is simulated: '" + k + "' does not apply (the model and KV come from [pool.sim]; its draft is [pool.sim] draft)");
            }
            if (!p.remote.empty()) {
                // The worker's config has the model and the engine fields; here only the routing side.
                const std::string at = where(src, t.source()) + ": pool '" + p.name + "' is remote (\"" + p.remote + "\"): ";
                for (const char* k : {"model", "synth", "draft", "backend", "threads", "kv_blocks", "kv_gib", "block_size",
                                      "kv_dtype", "kv_type_k", "kv_type_v", "max_batch", "max_batch_tokens", "kv_overcommit", "prefix_cache",
                                      "gpu_memory_fraction", "cuda_graphs", "ctx", "spec_max_slowdown"})
                    if (r.has(k))
                        return fail(at + "'" + k + "' belongs in the worker's own config (its [[pool]]); remove it here");
                std::string host;
                int port = 0;
                if (!split_host_port(p.remote, host, port))
                    return fail(at + "remote must be \"host:port\" with a port in [1, 65535], as the worker's --listen");
                if (c.cluster.insecure_loopback && !is_loopback_host(host))
                    return fail(at + "[cluster] insecure_loopback = true allows only loopback workers, and [[pool]] remote = \"" +
                                p.remote + "\" is not one; give [cluster] tls_cert, tls_key and tls_ca instead (docs/cluster.md#tls)");
                if (p.remote_pool.empty()) p.remote_pool = p.name;
            } else {
                if (!p.remote_pool.empty())
                    return fail(where(src, t.source()) + ": pool '" + p.name + "' sets remote_pool without remote = \"host:port\"");
                if (p.model.empty() && !p.sim) return fail(where(src, t.source()) + ": pool '" + p.name + "' needs model = \"path.gguf\" (or remote = \"host:port\" for a worker's pool)");
            }
            if (!p.model.empty() && std::filesystem::path(p.model).is_relative() && !base.empty()) p.model = (base / p.model).string();
            if (!p.chat_template_file.empty()) {
                if (std::filesystem::path(p.chat_template_file).is_relative() && !base.empty())
                    p.chat_template_file = (base / p.chat_template_file).string();
                auto text = read_regular_file(p.chat_template_file, 1 << 20, "chat template of pool '" + p.name + "'");
                if (!text) return fail(where(src, t.source()) + ": " + text.error().message);
                p.chat_template = std::move(*text);
            }
            if (!p.chat_template_fallback.empty() && p.chat_template_fallback != "chatml")
                return fail(where(src, t.source()) + ": pool '" + p.name + "' chat_template_fallback must be \"chatml\" or omitted "
                            "(a chat to a pool without a template is then refused), got \"" + p.chat_template_fallback + "\"");
            if (p.backend != "cpu" && p.backend != "cuda" && p.backend != "auto" && p.backend != "sim")
                return fail(where(src, t.source()) + ": pool '" + p.name + "' backend must be \"cpu\", \"cuda\", \"auto\" or \"sim\", got \"" + p.backend + "\"");
            if (!p.pooling.empty() && p.pooling != "mean" && p.pooling != "last" && p.pooling != "cls")
                return fail(where(src, t.source()) + ": pool '" + p.name + "' pooling must be \"mean\", \"last\" or \"cls\" " +
                            "(how /v1/embeddings pools the hidden states), got \"" + p.pooling + "\"");
            for (auto [key, value] : {std::pair<const char*, std::string*>{"kv_dtype", &p.kv_dtype},
                                      {"kv_type_k", &p.kv_type_k}, {"kv_type_v", &p.kv_type_v}}) {
                if (value->empty() && key != std::string("kv_dtype")) continue;  // follows kv_dtype
                // kv/kv_storage.h's names (parse_kv_dtype); config/ stays below kv/, so spelled here.
                std::string name = *value;
                std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return (char)std::tolower(ch); });
                if (name == "fp8_e4m3") name = "fp8";
                const std::set<std::string> kv_types{"f32", "f16", "bf16", "q8_0", "q4_0", "fp8"};
                if (!kv_types.count(name))
                    return fail(where(src, t.source()) + ": pool '" + p.name + "' " + key + " = \"" + *value +
                                "\" is not a KV cache type; use one of f32, f16, bf16, q8_0, q4_0, fp8 (docs/kv-cache-types.md)");
                if (name == "fp8" && p.backend != "cuda")
                    return fail(where(src, t.source()) + ": pool '" + p.name + "' " + key + " = \"" + *value +
                                "\" needs backend = \"cuda\" (the CPU forward has no fp8 kernels); use q8_0 on the CPU");
                *value = name;  // one spelling, for the pool's key
            }
            if (p.block_size <= 0 || p.block_size > 256 || (p.block_size & (p.block_size - 1)))
                return fail(where(src, t.source()) + ": pool '" + p.name + "' block_size must be a power of two up to 256");
            if (p.kv_blocks < 0 || (p.kv_blocks == 0 && !(p.kv_gib > 0) && !p.sim))
                return fail(where(src, t.source()) + ": pool '" + p.name + "' needs kv_blocks > 0 or kv_gib > 0");
            if (p.kv_tiers.enabled() && (p.sim || !p.remote.empty()))
                return fail(where(src, t.source()) + ": pool '" + p.name + "' has [pool.kv_tiers], but " +
                            (p.sim ? "a simulated pool holds no KV bytes to keep" : "a remote pool's KV lives on its worker (set the tiers in the worker's config)") +
                            "; drop the table");
            for (const PoolConfig& q : c.pools)
                if (!p.kv_tiers.disk_dir.empty() && q.kv_tiers.disk_dir == p.kv_tiers.disk_dir)
                    return fail(where(src, t.source()) + ": pools '" + q.name + "' and '" + p.name + "' share the KV disk_dir \"" +
                                p.kv_tiers.disk_dir + "\"; give each pool its own directory");
            if (c.find_pool(p.name)) return fail(where(src, t.source()) + ": pool '" + p.name + "' is defined twice");
            c.pools.push_back(p);
        }
    } else if (!err.empty()) {
        return fail(err);
    }
    if (c.pools.empty()) return fail(src + ": the config defines no [[pool]]; add one with a name and a model path");
    // A pool's draft model is another pool's model, loaded again with the target.
    for (size_t i = 0; i < c.pools.size(); i++) {
        const PoolConfig& p = c.pools[i];
        if (p.draft.empty()) continue;
        const toml::node& dn = *(*root.get("pool")->as_array())[i].as_table()->get("draft");
        const std::string at = where(src, dn.source()) + ": pool '" + p.name + "' draft = \"" + p.draft + "\" ";
        if (p.draft == p.name) return fail(at + "names the pool itself; name the pool whose (smaller) model drafts for it");
        if (const PoolConfig* d = c.find_pool(p.draft); d && !d->remote.empty())
            return fail(at + "names a remote pool; a draft model runs in the target's process: give the worker's config the draft");
        if (!c.find_pool(p.draft))
            return fail(at + "names no pool; define it with [[pool]] name = \"" + p.draft + "\" (e.g. a [pool.synth] "
                             "draft_from = \"" + p.name + "\" cut of this pool's model)");
    }
    // Drafts are written after their targets in one pass (ensure_models), so a draft's target must
    // be a pool that is not itself a draft: this also rules out every draft_from cycle.
    for (size_t i = 0; i < c.pools.size(); i++) {
        const PoolConfig& p = c.pools[i];
        if (!p.synth || p.synth->draft_from.empty()) continue;
        const toml::node& sn = *(*root.get("pool")->as_array())[i].as_table()->get("synth");
        const std::string at = where(src, sn.source()) + ": [pool.synth] of pool '" + p.name + "': draft_from \"" +
                               p.synth->draft_from + "\" ";
        const PoolConfig* t = c.find_pool(p.synth->draft_from);
        if (!t) return fail(at + "names no pool; define it with [[pool]] name = \"" + p.synth->draft_from + "\"");
        if (t->synth && !t->synth->draft_from.empty())
            return fail(at + "is itself a draft (of \"" + t->synth->draft_from +
                        "\"); cut every draft from a full model (a chain or cycle of drafts cannot be written)");
        if (t->synth && p.synth->keep_layers > t->synth->layers)
            return fail(at + "has " + std::to_string(t->synth->layers) + " layers; keep_layers " +
                        std::to_string(p.synth->keep_layers) + " must be at most that");
    }

    if (const toml::array* a = array_of_tables(root, "tenant", err, src)) {
        for (const auto& n : *a) {
            TenantConfig tc;
            TableReader r(*n.as_table(), src, "[[tenant]]");
            if (!r.get("name", tc.name) || !r.get("salt", tc.salt) || !r.get("api_keys", tc.api_keys) || !r.get("admin", tc.admin) ||
                !r.get_in("kv_quota", tc.kv_quota, 1e-9, 1, "a share of the pool's KV, in (0, 1]") ||
                !r.get("labels", tc.labels) || !r.get("allowed_labels", tc.allowed_labels))
                return fail(r.err);
            const std::string at = where(src, n.source()) + ": tenant '" + tc.name + "' ";
            for (const auto* list : {&tc.labels, &tc.allowed_labels})
                for (const auto& l : *list) {
                    if (reuse::label_problem(l))
                        return fail(at + "has the label \"" + l + "\"; a label is 1-128 printable ASCII characters without spaces (e.g. \"team:legal\", \"user:*\")");
                }
            if (const toml::node* tn = n.as_table()->get("tool_cache")) {
                r.sub("tool_cache");
                const toml::array* ta = tn->as_array();
                if (!ta || !ta->is_array_of_tables())
                    return fail(where(src, tn->source()) + ": tenant '" + tc.name + "' tool_cache must be an array of tables: [[tenant.tool_cache]] tool = \"NAME\", ttl_s = 300, scope = \"session\"");
                for (const auto& e : *ta) {
                    ToolCacheConfig tcc;
                    TableReader er(*e.as_table(), src, "[[tenant.tool_cache]]");
                    if (!er.get("tool", tcc.tool) || !er.get_in("ttl_s", tcc.ttl_s, 1e-3, 1e9, "seconds, > 0") ||
                        !er.get("scope", tcc.scope) || !er.get("key", tcc.key) || !er.finish())
                        return fail(er.err);
                    const std::string eat = where(src, e.source()) + ": tenant '" + tc.name + "' [[tenant.tool_cache]] ";
                    if (tcc.tool.empty()) return fail(eat + "needs tool = \"NAME\" (the function's name)");
                    if (tcc.scope != "session" && tcc.scope != "tenant" && tcc.scope != "public")
                        return fail(eat + "scope is \"" + tcc.scope + "\"; use \"session\", \"tenant\" or \"public\"");
                    for (const auto& o : tc.tool_cache)
                        if (o.tool == tcc.tool) return fail(eat + "declares tool '" + tcc.tool + "' twice; keep one entry per tool");
                    tc.tool_cache.push_back(tcc);
                }
            }
            if (!r.finish()) return fail(r.err);
            if (tc.name.empty()) return fail(where(src, n.source()) + ": [[tenant]] needs a name");
            if (c.find_tenant(tc.name)) return fail(at + "is defined twice; give each [[tenant]] a unique name");
            c.tenants.push_back(tc);
            // Tenants share KV blocks exactly when their salts are equal: two tenants with one
            // salt (written, or derived from a name) would read each other's cache.
            for (size_t i = 0; i + 1 < c.tenants.size(); i++)
                if (c.tenant_salt(c.tenants[i].name) == c.tenant_salt(tc.name))
                    return fail(at + "has the same salt as tenant '" + c.tenants[i].name +
                                "': they would share KV blocks; give each tenant its own salt (or none: derived from the name)");
            for (const auto& k : tc.api_keys) {
                if (k.empty()) return fail(at + "has an empty api key; remove it");
                for (size_t i = 0; i + 1 < c.tenants.size(); i++)
                    for (const auto& o : c.tenants[i].api_keys)
                        if (o == k) return fail(at + "uses an api key of tenant '" + c.tenants[i].name + "'; give each tenant its own keys");
                if (std::count(tc.api_keys.begin(), tc.api_keys.end(), k) > 1) return fail(at + "lists an api key twice");
            }
        }
    } else if (!err.empty()) {
        return fail(err);
    }

    if (const toml::array* a = array_of_tables(root, "public_prefix", err, src)) {
        for (const auto& n : *a) {
            PublicPrefixConfig pp;
            TableReader r(*n.as_table(), src, "[[public_prefix]]");
            if (!r.get("name", pp.name) || !r.get("text", pp.text) || !r.finish()) return fail(r.err);
            if (pp.text.empty()) return fail(where(src, n.source()) + ": [[public_prefix]] '" + pp.name + "' needs text");
            for (const auto& o : c.public_prefixes)
                if (!pp.name.empty() && o.name == pp.name)
                    return fail(where(src, n.source()) + ": [[public_prefix]] '" + pp.name + "' is defined twice; give each a unique name");
            c.public_prefixes.push_back(pp);
        }
    } else if (!err.empty()) {
        return fail(err);
    }

    if (const toml::array* a = array_of_tables(root, "bucket", err, src)) {
        for (const auto& n : *a) {
            const toml::table& t = *n.as_table();
            BucketConfig b;
            TableReader r(t, src, "[[bucket]]");
            if (!r.get("name", b.name) || !r.get("pool", b.pool) || !r.get_in("priority", b.priority, -1e6, 1e6, "in [-1e6, 1e6]") ||
                !r.get_in("slo_ttft_ms", b.slo_ttft_ms, 0, k_max_ms, "in [0, 1e9] ms (0: none)") ||
                !r.get_in("slo_tpot_ms", b.slo_tpot_ms, 0, k_max_ms, "in [0, 1e9] ms (0: none)") ||
                !r.get("on_worker_loss", b.on_worker_loss))
                return fail(r.err);
            if (const toml::table* st = r.sub("sim")) {
                TableReader sr(*st, src, "[bucket.sim]");
                if (!sr.get_in("acceptance", b.sim.acceptance, 0, 1, "in [0, 1] (a draft token's acceptance per position)") ||
                    !sr.get_in("concentration", b.sim.concentration, 0.01, 1e6, "in [0.01, 1e6]") || !sr.finish())
                    return fail(sr.err);
            }
            if (b.on_worker_loss != "retry" && b.on_worker_loss != "fail")
                return fail(where(src, t.source()) + ": bucket '" + b.name + "' on_worker_loss must be \"retry\" or \"fail\", got \"" +
                            b.on_worker_loss + "\"");
            if (const toml::table* mt = r.sub("match")) {
                TableReader m(*mt, src, "[bucket.match]");
                BucketMatch& bm = b.match;
                if (!m.get("hint", bm.hints) || !m.get_opt("min_prompt_tokens", bm.min_prompt_tokens) ||
                    !m.get_opt("max_prompt_tokens", bm.max_prompt_tokens) || !m.get_opt("min_max_tokens", bm.min_max_tokens) ||
                    !m.get_opt("max_max_tokens", bm.max_max_tokens) || !m.get_opt("min_temperature", bm.min_temperature) ||
                    !m.get_opt("max_temperature", bm.max_temperature) || !m.get_opt("tools", bm.tools) ||
                    !m.get_opt("response_format", bm.response_format) || !m.get("tenant", bm.tenants) || !m.finish())
                    return fail(m.err);
                for (const auto& v : {bm.min_prompt_tokens, bm.max_prompt_tokens, bm.min_max_tokens, bm.max_max_tokens})
                    if (v && *v < 0) return fail(where(src, mt->source()) + ": [bucket.match] of bucket '" + b.name + "': token bounds must be >= 0");
                for (const auto& v : {bm.min_temperature, bm.max_temperature})
                    if (v && *v < 0) return fail(where(src, mt->source()) + ": [bucket.match] of bucket '" + b.name + "': temperature bounds must be >= 0");
                // A rule whose minimum is above its maximum matches nothing: a typo, not a plan.
                auto crossed = [](const auto& lo, const auto& hi) { return lo && hi && *lo > *hi; };
                if (crossed(bm.min_prompt_tokens, bm.max_prompt_tokens) || crossed(bm.min_max_tokens, bm.max_max_tokens) ||
                    crossed(bm.min_temperature, bm.max_temperature))
                    return fail(where(src, mt->source()) + ": [bucket.match] of bucket '" + b.name +
                                "': a min_ bound is above its max_ bound, so the bucket matches nothing; swap or fix them");
                // A bucket rule on a format no request can carry would never match: say so now.
                if (bm.response_format && *bm.response_format != "json")
                    return fail(where(src, mt->get("response_format")->source()) + ": [bucket.match] of bucket '" + b.name +
                                "': response_format \"" + *bm.response_format +
                                "\" is not supported; the only format a bucket matches is \"json\" (requests in JSON mode, "
                                "json_object or json_schema; docs/config.md)");
            }
            for (const char* kind : {"routing", "eviction", "speculation"}) {
                const toml::table* pt = r.sub(kind);
                if (!pt) continue;
                PolicySpec spec;
                spec.where = where(src, pt->source());
                TableReader pr(*pt, src, std::string("[bucket.") + kind + "]");
                const bool is_spec = std::string(kind) == "speculation";
                if (!pr.get("plugin", spec.plugin) || !pr.get_isolation("isolation", spec.isolation) ||
                    (is_spec && (!pr.get("source", b.speculation_source) ||
                                 !pr.get_in("self_layers", b.speculation_self_layers, 1, 1024, "in [1, the target's layers)") ||
                                 !pr.get("tree", b.speculation_tree) ||
                                 !pr.get_in("tree_branch", b.speculation_tree_branch, 1, 8, "in [1, 8]") ||
                                 !pr.get_in("tree_depth", b.speculation_tree_depth, 1, 16, "in [1, 16]") ||
                                 !pr.get_in("control_share", b.speculation_control_share, 0.0, 0.5,
                                            "in [0, 0.5] (the share of requests run without speculation as a control)"))) ||
                    !pr.rest_as_params(spec))
                    return fail(pr.err);
                if (is_spec) {
                    const std::string at = where(src, pt->source()) + ": [bucket.speculation] of bucket '" + b.name + "': ";
                    const std::string& so = b.speculation_source;
                    if (!so.empty() && so != "ngram" && so != "draft" && so != "self" && so != "suffix")
                        return fail(where(src, pt->get("source")->source()) + ": [bucket.speculation] source of bucket '" + b.name +
                                    "' is \"" + so + "\"; use \"draft\" (the pool's draft model), \"self\" (the target's "
                                    "first self_layers layers), \"ngram\" (prompt lookup) or \"suffix\" (suffix decoding over "
                                    "the tenant's recent outputs), or omit it (draft where the pool has one, else ngram)");
                    if (so == "self" && b.speculation_self_layers < 1)
                        return fail(at + "source = \"self\" needs self_layers = N (the target's first N layers draft)");
                    if (so != "self" && pt->contains("self_layers"))
                        return fail(at + "self_layers is only for source = \"self\"; add it or drop self_layers");
                    const std::string& tr = b.speculation_tree;
                    if (tr != "chain" && tr != "fixed" && tr != "dynamic")
                        return fail(at + "tree is \"" + tr + "\"; use \"chain\", \"fixed\" (tree_branch children per node, "
                                    "tree_depth deep) or \"dynamic\" (EAGLE-2: grown where the draft is surest)");
                    if (tr != "chain" && so == "ngram")
                        return fail(at + "an n-gram draft is a chain; drop tree or use source = \"draft\", \"self\" or "
                                    "\"suffix\" (tree = \"dynamic\")");
                    if (tr == "fixed" && so == "suffix")
                        return fail(at + "a suffix tree grows where its history branches: use tree = \"dynamic\" (or "
                                    "\"chain\"), not \"fixed\"");
                }
                if (spec.plugin.empty())
                    return fail(spec.where + ": [bucket." + kind + "] of bucket '" + b.name +
                                "' needs plugin = \"name\" (a built-in such as \"lru\", or a path to a .so)");
                // A path (not a bare name) is relative to the config file.
                if (plugin_is_path(spec.plugin) && std::filesystem::path(spec.plugin).is_relative() && !base.empty())
                    spec.plugin = (base / spec.plugin).string();
                (std::string(kind) == "routing" ? b.routing : std::string(kind) == "eviction" ? b.eviction : b.speculation) = spec;
            }
            if (!r.finish()) return fail(r.err);
            if (b.name.empty()) return fail(where(src, t.source()) + ": [[bucket]] needs a name");
            if (b.pool.empty()) b.pool = c.pools.front().name;
            if (!c.find_pool(b.pool))
                return fail(where(src, t.source()) + ": bucket '" + b.name + "' routes to pool '" + b.pool +
                            "', which is not defined; define it with [[pool]] name = \"" + b.pool + "\"");
            if (const PoolConfig* bp = c.find_pool(b.pool);
                b.speculation_source == "draft" && bp->draft.empty() && !(bp->sim && bp->sim->draft))
                return fail(where(src, t.source()) + ": bucket '" + b.name + "' speculates with source \"draft\" but its pool '" +
                            b.pool + "' has no draft model; add draft = \"<pool>\" to pool '" + b.pool +
                            "' (a simulated pool: [pool.sim] draft = \"<shape>.toml\") or use source = \"ngram\"");
            for (const auto& tn : b.match.tenants)
                if (!c.find_tenant(tn))
                    return fail(where(src, t.source()) + ": bucket '" + b.name + "' matches tenant '" + tn + "', which has no [[tenant]] entry");
            for (const auto& o : c.buckets)
                if (o.name == b.name) return fail(where(src, t.source()) + ": bucket '" + b.name + "' is defined twice");
            c.buckets.push_back(b);
        }
    } else if (!err.empty()) {
        return fail(err);
    }
    if (c.buckets.empty()) {
        BucketConfig b;
        b.name = "default";
        b.pool = c.pools.front().name;
        c.buckets.push_back(b);
    }
    return c;
}

Expected<Config> load_config(const std::string& path) {
    // A FIFO or /dev/zero (also behind a symlink) is refused at once: it would block or grow
    // without bound, here and on every reload.
    auto text = read_regular_file(path, k_max_config_bytes, "config");
    if (!text) return text.error();
    return parse_config(*text, path);
}

Expected<bool> check_response_format(const std::string& value) {
    if (value.empty() || value == "json") return true;
    return make_error("response_format \"", value, "\" is not supported; use \"json\" or leave it empty (it classifies ",
                      "the request for the bucket rules; json_schema, json_object or grammar constrain the output, ",
                      "docs/structured-output.md)");
}

size_t classify(const Config& c, const RequestFeatures& f) {
    for (size_t i = 0; i < c.buckets.size(); i++) {
        const BucketMatch& m = c.buckets[i].match;
        if (!m.hints.empty() && std::find(m.hints.begin(), m.hints.end(), f.hint) == m.hints.end()) continue;
        if (m.min_prompt_tokens && f.prompt_tokens < *m.min_prompt_tokens) continue;
        if (m.max_prompt_tokens && f.prompt_tokens > *m.max_prompt_tokens) continue;
        if (m.min_max_tokens && f.max_tokens < *m.min_max_tokens) continue;
        if (m.max_max_tokens && f.max_tokens > *m.max_max_tokens) continue;
        if (m.min_temperature && f.temperature < *m.min_temperature) continue;
        if (m.max_temperature && f.temperature > *m.max_temperature) continue;
        if (m.tools && f.tools != *m.tools) continue;
        if (m.response_format && f.response_format != *m.response_format) continue;
        if (!m.tenants.empty() && std::find(m.tenants.begin(), m.tenants.end(), f.tenant) == m.tenants.end()) continue;
        return i;
    }
    return c.buckets.size() - 1;
}

namespace {

// The first rule of `m` that `f` fails, or "" when it matches; `matched` collects the rules it met.
std::string first_failed_rule(const BucketMatch& m, const RequestFeatures& f, std::vector<std::string>* matched) {
    auto list = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
        return "[" + s + "]";
    };
    auto num = [](double v) {
        std::ostringstream o;
        o << v;
        return o.str();
    };
    auto range = [&](const char* what, double v, const std::optional<double>& lo, const std::optional<double>& hi) -> std::string {
        if (!lo && !hi) return "";
        const std::string r = std::string(what) + " " + num(v) + " in [" + (lo ? num(*lo) : "") + ", " + (hi ? num(*hi) : "") + "]";
        if ((lo && v < *lo) || (hi && v > *hi)) return "not " + r;
        if (matched) matched->push_back(r);
        return "";
    };
    auto opt = [](const std::optional<int>& o) { return o ? std::optional<double>(*o) : std::nullopt; };
    if (!m.hints.empty()) {
        if (std::find(m.hints.begin(), m.hints.end(), f.hint) == m.hints.end()) return "hint '" + f.hint + "' not in " + list(m.hints);
        if (matched) matched->push_back("hint '" + f.hint + "'");
    }
    if (auto e = range("prompt_tokens", f.prompt_tokens, opt(m.min_prompt_tokens), opt(m.max_prompt_tokens)); !e.empty()) return e;
    if (auto e = range("max_tokens", f.max_tokens, opt(m.min_max_tokens), opt(m.max_max_tokens)); !e.empty()) return e;
    if (auto e = range("temperature", f.temperature, m.min_temperature, m.max_temperature); !e.empty()) return e;
    if (m.tools) {
        if (f.tools != *m.tools) return std::string("tools ") + (f.tools ? "present" : "absent");
        if (matched) matched->push_back(std::string("tools ") + (f.tools ? "present" : "absent"));
    }
    if (m.response_format) {
        if (f.response_format != *m.response_format) return "response_format '" + f.response_format + "' is not '" + *m.response_format + "'";
        if (matched) matched->push_back("response_format '" + f.response_format + "'");
    }
    if (!m.tenants.empty()) {
        if (std::find(m.tenants.begin(), m.tenants.end(), f.tenant) == m.tenants.end())
            return "tenant '" + f.tenant + "' not in " + list(m.tenants);
        if (matched) matched->push_back("tenant '" + f.tenant + "'");
    }
    return "";
}

}  // namespace

std::string explain_classification(const Config& c, const RequestFeatures& f) {
    std::string why;
    for (size_t i = 0; i < c.buckets.size(); i++) {
        std::vector<std::string> matched;
        const std::string failed = first_failed_rule(c.buckets[i].match, f, &matched);
        if (failed.empty()) {
            std::string rules;
            for (const auto& r : matched) rules += (rules.empty() ? "" : ", ") + r;
            return "bucket '" + c.buckets[i].name + "': " + (rules.empty() ? "no rules (takes every request)" : "matched " + rules) +
                   (why.empty() ? "" : "; skipped " + why);
        }
        why += (why.empty() ? "" : "; ") + ("'" + c.buckets[i].name + "' (" + failed + ")");
    }
    return "bucket '" + (c.buckets.empty() ? std::string() : c.buckets.back().name) + "': the last bucket, as no bucket matched; skipped " + why;
}

}  // namespace steward
