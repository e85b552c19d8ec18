// TOML -> Config with complete validation. Unknown keys are errors (a typo must not silently
// fall back to a default), reported with their file:line:column.
#include "config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

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
            if (auto v = n->value<bool>()) return out = *v, true;
            return type_error(key, *n, "a boolean (true/false)");
        } else if constexpr (std::is_integral_v<T>) {
            if (auto v = n->value<int64_t>()) return out = (T)*v, true;
            return type_error(key, *n, "an integer");
        } else if constexpr (std::is_floating_point_v<T>) {
            if (auto v = n->value<double>()) return out = (T)*v, true;
            return type_error(key, *n, "a number");
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
                      "; check the spelling against the README's config reference";
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
        return fail_at(n, ctx_ + "." + key + " must be " + want + ", got a " + got.str());
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
        if (!r.get("request_timeout_ms", c.limits.request_timeout_ms) || !r.get("session_ttl_ms", c.limits.session_ttl_ms) ||
            !r.get("max_tokens_default", c.limits.max_tokens_default) ||
            !r.get("max_draft_tokens", c.limits.max_draft_tokens) || !r.finish())
            return fail(r.err);
        if (c.limits.request_timeout_ms < 0 || c.limits.session_ttl_ms < 0 || c.limits.max_tokens_default <= 0 ||
            c.limits.max_draft_tokens < 0)
            return fail(where(src, t->source()) + ": [limits] values must be >= 0 (max_tokens_default > 0)");
    }
    if (const toml::table* t = top.sub("server")) {
        TableReader r(*t, src, "[server]");
        if (!r.get("host", c.server.host) || !r.get("port", c.server.port) || !r.finish()) return fail(r.err);
        if (c.server.port < 0 || c.server.port > 65535) return fail(where(src, t->source()) + ": [server] port must be 0..65535");
    }
    const std::filesystem::path base = std::filesystem::path(src).parent_path();
    if (const toml::table* t = top.sub("plugins")) {
        TableReader r(*t, src, "[plugins]");
        if (!r.get("dirs", c.plugins.dirs) || !r.get("decision_budget_ms", c.plugins.decision_budget_ms) ||
            !r.get("step_decision_budget_ms", c.plugins.step_decision_budget_ms) ||
            !r.get("check_in_child", c.plugins.check_in_child) || !r.get("check_timeout_ms", c.plugins.check_timeout_ms) ||
            !r.finish())
            return fail(r.err);
        for (double v : {c.plugins.decision_budget_ms, c.plugins.step_decision_budget_ms, c.plugins.check_timeout_ms})
            if (!(v >= 0 && v <= 3.6e6))
                return fail(where(src, t->source()) +
                            ": [plugins] decision_budget_ms, step_decision_budget_ms and check_timeout_ms must be 0..3600000 (ms)");
        for (auto& d : c.plugins.dirs)
            if (std::filesystem::path(d).is_relative() && !base.empty()) d = (base / d).string();
    }
    if (const toml::table* t = top.sub("reload")) {
        TableReader r(*t, src, "[reload]");
        if (!r.get("watch", c.reload.watch) || !r.get("debounce_ms", c.reload.debounce_ms) || !r.finish()) return fail(r.err);
        if (c.reload.debounce_ms < 0 || c.reload.debounce_ms > 60000)
            return fail(where(src, t->source()) + ": [reload] debounce_ms must be 0..60000");
    }
    if (!top.finish()) return fail(top.err);

    if (const toml::array* a = array_of_tables(root, "pool", err, src)) {
        for (const auto& n : *a) {
            const toml::table& t = *n.as_table();
            PoolConfig p;
            TableReader r(t, src, "[[pool]]");
            bool ok = r.get("name", p.name) && r.get("model", p.model) && r.get("backend", p.backend) &&
                      r.get("threads", p.threads) && r.get("kv_blocks", p.kv_blocks) && r.get("kv_gib", p.kv_gib) &&
                      r.get("block_size", p.block_size) && r.get("kv_dtype", p.kv_dtype) &&
                      r.get("max_batch", p.max_batch) && r.get("max_batch_tokens", p.max_batch_tokens) &&
                      r.get("max_queue", p.max_queue) && r.get("prefix_cache", p.prefix_cache) &&
                      r.get("price_prompt", p.price_prompt) && r.get("price_output", p.price_output) &&
                      r.get("price_cached", p.price_cached) && r.get("quality", p.quality) &&
                      r.get("kv_overcommit", p.kv_overcommit);
            if (!ok) return fail(r.err);
            if (const toml::table* st = r.sub("synth")) {
                SynthConfig s;
                TableReader sr(*st, src, "[pool.synth]");
                if (!sr.get("arch", s.arch) || !sr.get("dim", s.dim) || !sr.get("layers", s.layers) ||
                    !sr.get("heads", s.heads) || !sr.get("kv_heads", s.kv_heads) || !sr.get("ffn", s.ffn) ||
                    !sr.get("vocab", s.vocab) || !sr.get("ctx", s.ctx) || !sr.get("dtype", s.dtype) ||
                    !sr.get("seed", s.seed) || !sr.get("draft_from", s.draft_from) ||
                    !sr.get("keep_layers", s.keep_layers) || !sr.finish())
                    return fail(sr.err);
                p.synth = s;
            }
            if (!r.finish()) return fail(r.err);
            if (p.name.empty()) return fail(where(src, t.source()) + ": [[pool]] needs a name");
            if (p.model.empty()) return fail(where(src, t.source()) + ": pool '" + p.name + "' needs model = \"path.gguf\"");
            if (std::filesystem::path(p.model).is_relative() && !base.empty()) p.model = (base / p.model).string();
            if (p.backend != "cpu" && p.backend != "cuda")
                return fail(where(src, t.source()) + ": pool '" + p.name + "' backend must be \"cpu\" or \"cuda\", got \"" + p.backend + "\"");
            if (p.kv_dtype != "f32" && p.kv_dtype != "f16")
                return fail(where(src, t.source()) + ": pool '" + p.name + "' kv_dtype must be \"f32\" or \"f16\"");
            if (p.block_size <= 0 || p.block_size > 256 || (p.block_size & (p.block_size - 1)))
                return fail(where(src, t.source()) + ": pool '" + p.name + "' block_size must be a power of two up to 256");
            if (p.kv_blocks < 0 || (p.kv_blocks == 0 && !(p.kv_gib > 0)))
                return fail(where(src, t.source()) + ": pool '" + p.name + "' needs kv_blocks > 0 or kv_gib > 0");
            if (p.max_batch <= 0 || p.max_batch_tokens <= 0 || p.max_queue < 0 || p.threads < 0)
                return fail(where(src, t.source()) + ": pool '" + p.name + "' max_batch and max_batch_tokens must be > 0, max_queue and threads >= 0");
            if (!(p.kv_overcommit >= 1.0))
                return fail(where(src, t.source()) + ": pool '" + p.name + "' kv_overcommit must be >= 1 (1: KV reservations never exceed the pool)");
            if (p.quality > 1.0)
                return fail(where(src, t.source()) + ": pool '" + p.name + "' quality must be in [0, 1] (or omitted)");
            if (c.find_pool(p.name)) return fail(where(src, t.source()) + ": pool '" + p.name + "' is defined twice");
            c.pools.push_back(p);
        }
    } else if (!err.empty()) {
        return fail(err);
    }
    if (c.pools.empty()) return fail(src + ": the config defines no [[pool]]; add one with a name and a model path");

    if (const toml::array* a = array_of_tables(root, "tenant", err, src)) {
        for (const auto& n : *a) {
            TenantConfig tc;
            TableReader r(*n.as_table(), src, "[[tenant]]");
            if (!r.get("name", tc.name) || !r.get("salt", tc.salt) || !r.get("api_keys", tc.api_keys) ||
                !r.get("kv_quota", tc.kv_quota) || !r.finish())
                return fail(r.err);
            if (tc.name.empty()) return fail(where(src, n.source()) + ": [[tenant]] needs a name");
            if (!tc.api_keys.empty())
                return fail(where(src, n.as_table()->get("api_keys")->source()) + ": tenant '" + tc.name +
                            "' api_keys: api_keys are checked by the HTTP server, which this build does not have yet; "
                            "remove the key");
            if (tc.kv_quota > 1.0)
                return fail(where(src, n.source()) + ": tenant '" + tc.name + "' kv_quota is a share of the pool's KV, in (0, 1]");
            c.tenants.push_back(tc);
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
            if (!r.get("name", b.name) || !r.get("pool", b.pool) || !r.get("priority", b.priority) ||
                !r.get("slo_ttft_ms", b.slo_ttft_ms) || !r.get("slo_tpot_ms", b.slo_tpot_ms))
                return fail(r.err);
            if (const toml::table* mt = r.sub("match")) {
                TableReader m(*mt, src, "[bucket.match]");
                BucketMatch& bm = b.match;
                if (!m.get("hint", bm.hints) || !m.get_opt("min_prompt_tokens", bm.min_prompt_tokens) ||
                    !m.get_opt("max_prompt_tokens", bm.max_prompt_tokens) || !m.get_opt("min_max_tokens", bm.min_max_tokens) ||
                    !m.get_opt("max_max_tokens", bm.max_max_tokens) || !m.get_opt("min_temperature", bm.min_temperature) ||
                    !m.get_opt("max_temperature", bm.max_temperature) || !m.get_opt("tools", bm.tools) ||
                    !m.get_opt("response_format", bm.response_format) || !m.get("tenant", bm.tenants) || !m.finish())
                    return fail(m.err);
                // A bucket rule on a format no request can carry would never match: say so now.
                if (bm.response_format && *bm.response_format != "json")
                    return fail(where(src, mt->get("response_format")->source()) + ": [bucket.match] of bucket '" + b.name +
                                "': response_format \"" + *bm.response_format +
                                "\" is not supported; the only format is \"json\" (a classification feature: output is "
                                "not constrained until structured output lands)");
            }
            for (const char* kind : {"routing", "eviction", "speculation"}) {
                const toml::table* pt = r.sub(kind);
                if (!pt) continue;
                PolicySpec spec;
                spec.where = where(src, pt->source());
                TableReader pr(*pt, src, std::string("[bucket.") + kind + "]");
                if (!pr.get("plugin", spec.plugin) || !pr.rest_as_params(spec)) return fail(pr.err);
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
    std::ifstream in(path);
    if (!in) return make_error("cannot read config '", path, "': no such file or not readable");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_config(ss.str(), path);
}

Expected<bool> check_response_format(const std::string& value) {
    if (value.empty() || value == "json") return true;
    return make_error("response_format \"", value, "\" is not supported; use \"json\" or leave it empty (\"json\" only ",
                      "classifies the request: output is not constrained until structured output lands)");
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

}  // namespace steward
