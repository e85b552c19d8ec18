// The C API (steward.h) over steward::Runtime: converts at the boundary and catches every C++
// exception there, turning it into a status (a C caller cannot unwind a C++ exception).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include <steward/runtime.h>
#include <steward/steward.h>

#include "config/config.h"  // check_response_format
#include "cpu/sampling.h"    // check_sampling
#include "request/request_check.h"
#include "util/utf8.h"

struct steward_runtime {
    std::unique_ptr<steward::Runtime> rt;
};

namespace {

void write_err(char* err, size_t err_len, const std::string& msg) {
    if (!err || err_len == 0) return;
    const size_t n = std::min(msg.size(), err_len - 1);
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
}

// malloc'ed so that any language's FFI can hand it back to steward_string_free.
char* dup_string(const std::string& s) {
    char* p = static_cast<char*>(std::malloc(s.size() + 1));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = '\0';
    return p;
}

steward_status status_of(steward::FinishReason finish) {
    using steward::FinishReason;
    switch (finish) {
        case FinishReason::STOP:
        case FinishReason::LENGTH: return STEWARD_OK;
        case FinishReason::OVERLOADED: return STEWARD_ERR_OVERLOADED;
        case FinishReason::TIMEOUT: return STEWARD_ERR_TIMEOUT;
        case FinishReason::CANCELLED: return STEWARD_ERR_CANCELLED;
        case FinishReason::ERROR: return STEWARD_ERR_GENERATION;
    }
    return STEWARD_ERR_INTERNAL;
}

// The C enum mirrors FinishReason number for number (and policy.h's steward_finish_reason).
static_assert(STEWARD_RESULT_STOP == static_cast<int>(steward::FinishReason::STOP) &&
              STEWARD_RESULT_LENGTH == static_cast<int>(steward::FinishReason::LENGTH) &&
              STEWARD_RESULT_CANCELLED == static_cast<int>(steward::FinishReason::CANCELLED) &&
              STEWARD_RESULT_TIMEOUT == static_cast<int>(steward::FinishReason::TIMEOUT) &&
              STEWARD_RESULT_ERROR == static_cast<int>(steward::FinishReason::ERROR) &&
              STEWARD_RESULT_OVERLOADED == static_cast<int>(steward::FinishReason::OVERLOADED) &&
              steward::n_finish_reasons == 6,
              "steward_result_finish must list FinishReason in order");

steward_result_finish finish_of(steward::FinishReason finish) {
    return static_cast<steward_result_finish>(static_cast<int>(finish));
}

steward_request_metrics metrics_of(const steward::RequestMetrics& m) {
    steward_request_metrics c;
    c.ttft_ms = m.ttft_ms;
    c.e2e_ms = m.e2e_ms;
    c.queue_ms = m.queue_ms;
    c.tpot_ms = m.tpot_ms;
    c.prompt_tokens = m.prompt_tokens;
    c.cached_tokens = m.cached_tokens;
    c.completion_tokens = m.completion_tokens;
    c.recomputed_tokens = m.recomputed_tokens;
    c.cost = m.cost;
    c.config_generation = m.config_generation;
    return c;
}

// Validates at the edge and copies into the C++ request; INVALID_ARGUMENT names the field in msg.
steward_status to_request(const steward_request* r, steward::GenerationRequest& out, std::string& msg) {
    if (r->n_prompt_ids > 0 && !r->prompt_ids)
        return msg = "prompt_ids is NULL but n_prompt_ids > 0", STEWARD_ERR_INVALID_ARGUMENT;
    if (r->max_tokens < -1)
        return msg = "max_tokens must be >= 0 (0: the config's default) or -1 (the rest of the context)",
               STEWARD_ERR_INVALID_ARGUMENT;
    {
        steward::SamplingParams sp;  // the rule `steward generate` applies too
        sp.temperature = r->temperature, sp.top_p = r->top_p, sp.top_k = r->top_k;
        if (auto ok = steward::check_sampling(sp); !ok)
            return msg = ok.error().message + "; start from steward_request_default()", STEWARD_ERR_INVALID_ARGUMENT;
    }
    if (r->response_format)
        if (auto ok = steward::check_response_format(r->response_format); !ok)
            return msg = ok.error().message, STEWARD_ERR_INVALID_ARGUMENT;
    if (r->n_prompt_ids == 0 && !r->prompt)
        return msg = "prompt is NULL and n_prompt_ids is 0; give the prompt's text (UTF-8) or its token ids", STEWARD_ERR_INVALID_ARGUMENT;
    if (r->n_prompt_ids > 0) {
        out.prompt_ids.assign(r->prompt_ids, r->prompt_ids + r->n_prompt_ids);
    } else {
        out.prompt = r->prompt;
        if (const size_t at = steward::utf8::invalid_at(out.prompt); at != std::string::npos)
            return msg = "prompt is not valid UTF-8 (byte " + std::to_string(at) + " of " + std::to_string(out.prompt.size()) +
                         " starts no well-formed character); pass UTF-8 text, or token ids in prompt_ids",
                   STEWARD_ERR_INVALID_ARGUMENT;
    }
    if (r->tenant && *r->tenant) out.tenant = r->tenant;
    if (r->session) out.session = r->session;
    if (r->bucket_hint) out.bucket_hint = r->bucket_hint;
    if (r->response_format) out.response_format = r->response_format;
    out.max_tokens = r->max_tokens;
    out.temperature = r->temperature;
    out.top_p = r->top_p;
    out.top_k = r->top_k;
    out.seed = r->seed;
    out.tools = r->tools != 0;
    out.add_bos = r->add_bos != 0;
    out.ignore_eos = r->ignore_eos != 0;
    return STEWARD_OK;
}

// The fields of steward_request_ext (API 3) onto the C++ request, then the rules every way in
// shares (check_request: ranges, stop strings, the grammar or schema compiles). ext may be NULL.
steward_status to_request_ext(const steward_request_ext* ext, steward::GenerationRequest& out,
                              steward_logprobs_cb& on_logprobs, std::string& msg) {
    on_logprobs = nullptr;
    if (ext) {
        if (ext->size == 0 || ext->size > sizeof(steward_request_ext))
            return msg = "steward_request_ext.size is " + std::to_string(ext->size) + "; this library (API " +
                         std::to_string(STEWARD_API_VERSION) + ") takes 1 to " + std::to_string(sizeof(steward_request_ext)) +
                         ": start from steward_request_ext_default(), and build against the library's steward.h",
                   STEWARD_ERR_INVALID_ARGUMENT;
        // A caller built against an older header passes a shorter struct: read what it has, the
        // rest keeps the defaults.
        steward_request_ext e = steward_request_ext_default();
        std::memcpy(&e, ext, ext->size);
        if (e.n_stop > 0 && !e.stop) return msg = "stop is NULL but n_stop > 0", STEWARD_ERR_INVALID_ARGUMENT;
        for (size_t i = 0; i < e.n_stop; i++) {
            if (!e.stop[i]) return msg = "stop[" + std::to_string(i) + "] is NULL", STEWARD_ERR_INVALID_ARGUMENT;
            out.stop.emplace_back(e.stop[i]);
        }
        if (e.n_logit_bias > 0 && !e.logit_bias)
            return msg = "logit_bias is NULL but n_logit_bias > 0", STEWARD_ERR_INVALID_ARGUMENT;
        for (size_t i = 0; i < e.n_logit_bias; i++) out.logit_bias.emplace_back(e.logit_bias[i].id, e.logit_bias[i].bias);
        if (e.grammar) out.grammar = e.grammar;
        if (e.json_schema) out.json_schema = e.json_schema;
        out.json_object = e.json_object != 0;
        out.top_logprobs = e.top_logprobs;
        if (e.pool) out.pool = e.pool;
        out.presence_penalty = e.presence_penalty;
        out.frequency_penalty = e.frequency_penalty;
        out.parse_special = e.parse_special != 0;
        on_logprobs = e.on_logprobs;
    }
    if (auto ok = steward::check_request(out); !ok) return msg = ok.error().message, STEWARD_ERR_INVALID_ARGUMENT;
    return STEWARD_OK;
}

// C rows of per-token alternatives: one flat copy of them (items), rows pointing into it (filled
// after items is complete: no reallocation under them).
void top_rows(const std::vector<std::vector<steward::TokenLogprob>>& top, std::vector<steward_top_logprobs>& rows,
              std::vector<steward_token_logprob>& items) {
    items.clear();
    rows.clear();
    for (const auto& alts : top)
        for (const steward::TokenLogprob& t : alts) items.push_back({t.id, t.logprob});
    size_t at = 0;
    for (const auto& alts : top) {
        rows.push_back({alts.empty() ? nullptr : items.data() + at, alts.size()});
        at += alts.size();
    }
}

// The C view of a finished request, valid while the C++ result, `rows` and `items` live.
steward_result result_view(const steward::GenerationResult& r, std::vector<steward_top_logprobs>& rows,
                           std::vector<steward_token_logprob>& items) {
    steward_result c;
    c.handle = r.id;
    c.status = status_of(r.finish);
    c.finish_reason = steward::finish_reason_name(r.finish);
    c.error = r.error.c_str();
    c.text = r.text.c_str();
    c.text_len = r.text.size();
    c.tokens = r.tokens.empty() ? nullptr : r.tokens.data();
    c.logprobs = r.logprobs.empty() ? nullptr : r.logprobs.data();
    c.n_tokens = r.tokens.size();
    c.bucket = r.bucket.c_str();
    c.pool = r.pool.c_str();
    c.metrics = metrics_of(r.metrics);
    c.finish = finish_of(r.finish);
    c.upgraded = r.upgraded ? 1 : 0;
    c.fallback = r.fallback ? 1 : 0;
    top_rows(r.top_logprobs, rows, items);
    c.top_logprobs = rows.empty() ? nullptr : rows.data();
    c.n_top_logprobs = rows.size();
    return c;
}

// The pool a steward_tokenize / steward_detokenize names: NULL or "" is the live config's first.
std::string pool_or_first(steward_runtime* rt, const char* pool) {
    if (pool && *pool) return pool;
    const auto pools = rt->rt->pools();
    return pools.empty() ? std::string() : pools.front().name;
}

// Runs body and turns any C++ exception into a status (and, when there is a buffer, a message
// naming the function): nothing may unwind into C.
template <class Body>
steward_status guarded(const char* fn, char* err, size_t err_len, Body&& body) {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        write_err(err, err_len, std::string(fn) + ": out of memory");
        return STEWARD_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        write_err(err, err_len, std::string(fn) + ": " + e.what());
        return STEWARD_ERR_INTERNAL;
    } catch (...) {
        write_err(err, err_len, std::string(fn) + ": unknown exception");
        return STEWARD_ERR_INTERNAL;
    }
}

// The steward_metrics_* functions: one of the runtime's renderings, as a string the caller frees.
steward_status metrics_string(const char* fn, steward_runtime* rt, char** out,
                              std::string (steward::Runtime::*render)() const) {
    if (out) *out = nullptr;
    if (!rt || !out) return STEWARD_ERR_INVALID_ARGUMENT;
    return guarded(fn, nullptr, 0, [&] {
        *out = dup_string((rt->rt.get()->*render)());
        return STEWARD_OK;
    });
}

}  // namespace

extern "C" {

const char* steward_status_name(steward_status status) {
    switch (status) {
        case STEWARD_OK: return "STEWARD_OK";
        case STEWARD_ERR_INVALID_ARGUMENT: return "STEWARD_ERR_INVALID_ARGUMENT";
        case STEWARD_ERR_CONFIG: return "STEWARD_ERR_CONFIG";
        case STEWARD_ERR_OVERLOADED: return "STEWARD_ERR_OVERLOADED";
        case STEWARD_ERR_TIMEOUT: return "STEWARD_ERR_TIMEOUT";
        case STEWARD_ERR_CANCELLED: return "STEWARD_ERR_CANCELLED";
        case STEWARD_ERR_GENERATION: return "STEWARD_ERR_GENERATION";
        case STEWARD_ERR_NOT_FOUND: return "STEWARD_ERR_NOT_FOUND";
        case STEWARD_ERR_OUT_OF_MEMORY: return "STEWARD_ERR_OUT_OF_MEMORY";
        case STEWARD_ERR_INTERNAL: return "STEWARD_ERR_INTERNAL";
    }
    return "unknown";
}

int steward_api_version(void) {
    return STEWARD_API_VERSION;
}

steward_request steward_request_default(void) {
    steward_request r;
    std::memset(&r, 0, sizeof r);
    r.top_p = 1.0f;
    r.add_bos = 1;
    return r;
}

steward_request_ext steward_request_ext_default(void) {
    steward_request_ext e;
    std::memset(&e, 0, sizeof e);
    e.size = sizeof e;
    return e;
}

steward_status steward_runtime_start(const char* config_path, steward_runtime** out, char* err, size_t err_len) {
    return steward_runtime_start_with_options(config_path, nullptr, out, err, err_len);
}

steward_status steward_runtime_start_with_options(const char* config_path, const steward_runtime_options* opts,
                                                  steward_runtime** out, char* err, size_t err_len) {
    if (out) *out = nullptr;
    if (!config_path || !out) {
        write_err(err, err_len, "steward_runtime_start: config_path and out must not be NULL");
        return STEWARD_ERR_INVALID_ARGUMENT;
    }
    steward::RuntimeOptions options;
    if (opts) {
        if (opts->n_public_prefixes > 0 && !opts->public_prefixes) {
            write_err(err, err_len, "steward_runtime_start_with_options: public_prefixes is NULL but n_public_prefixes > 0");
            return STEWARD_ERR_INVALID_ARGUMENT;
        }
        for (size_t i = 0; i < opts->n_public_prefixes; i++) {
            const steward_public_prefix& p = opts->public_prefixes[i];
            if (!p.name || !*p.name || !p.text) {
                write_err(err, err_len, "steward_runtime_start_with_options: public_prefixes[" + std::to_string(i) +
                                            "] needs a non-empty name and a non-NULL text");
                return STEWARD_ERR_INVALID_ARGUMENT;
            }
            options.extra_public_prefixes.push_back({p.name, p.text});
        }
    }
    return guarded("steward_runtime_start", err, err_len, [&] {
        auto rt = steward::Runtime::start(std::string(config_path), std::move(options));
        if (!rt) {
            write_err(err, err_len, rt.error().message);
            return STEWARD_ERR_CONFIG;
        }
        *out = new steward_runtime{std::move(rt.value())};
        write_err(err, err_len, "");
        return STEWARD_OK;
    });
}

// ~Runtime is noexcept: it cannot throw into C.
void steward_runtime_free(steward_runtime* rt) {
    delete rt;
}

steward_status steward_submit(steward_runtime* rt, const steward_request* req, steward_token_cb on_token,
                              steward_finish_cb on_finish, void* user, uint64_t* out_handle) {
    return steward_submit_ext(rt, req, nullptr, on_token, on_finish, user, out_handle, nullptr, 0);
}

steward_status steward_submit_ext(steward_runtime* rt, const steward_request* req, const steward_request_ext* ext,
                                  steward_token_cb on_token, steward_finish_cb on_finish, void* user,
                                  uint64_t* out_handle, char* err, size_t err_len) {
    if (out_handle) *out_handle = 0;
    if (!rt || !req) {
        write_err(err, err_len, "steward_submit: rt and req must not be NULL");
        return STEWARD_ERR_INVALID_ARGUMENT;
    }
    return guarded("steward_submit", err, err_len, [&] {
        steward::GenerationRequest gr;
        std::string msg;
        steward_logprobs_cb on_logprobs = nullptr;
        steward_status s = to_request(req, gr, msg);
        if (s == STEWARD_OK) s = to_request_ext(ext, gr, on_logprobs, msg);
        if (s != STEWARD_OK) {
            write_err(err, err_len, "steward_submit: " + msg);
            return s;
        }
        steward::RequestCallbacks cb;
        if (on_token)
            cb.on_token = [on_token, user](const std::string& piece, const std::vector<int32_t>& ids) {
                on_token(piece.c_str(), piece.size(), ids.empty() ? nullptr : ids.data(), ids.size(), user);
            };
        if (on_logprobs)
            cb.on_logprobs = [on_logprobs, user](const std::vector<int32_t>& ids, const std::vector<float>& lps,
                                                 const std::vector<std::vector<steward::TokenLogprob>>& top) {
                std::vector<steward_top_logprobs> rows;
                std::vector<steward_token_logprob> items;
                top_rows(top, rows, items);
                on_logprobs(ids.data(), lps.size() == ids.size() ? lps.data() : nullptr,
                            rows.size() == ids.size() ? rows.data() : nullptr, ids.size(), user);
            };
        if (on_finish)
            cb.on_finish = [on_finish, user](const steward::GenerationResult& r) {
                std::vector<steward_top_logprobs> rows;
                std::vector<steward_token_logprob> items;
                const steward_result c = result_view(r, rows, items);
                on_finish(&c, user);
            };
        const uint64_t h = rt->rt->submit(std::move(gr), std::move(cb));
        if (out_handle) *out_handle = h;
        write_err(err, err_len, "");
        return STEWARD_OK;
    });
}

steward_status steward_cancel(steward_runtime* rt, uint64_t handle) {
    if (!rt) return STEWARD_ERR_INVALID_ARGUMENT;
    return guarded("steward_cancel", nullptr, 0,
                   [&] { return rt->rt->cancel(handle) ? STEWARD_OK : STEWARD_ERR_NOT_FOUND; });
}

steward_status steward_generate(steward_runtime* rt, const steward_request* req, char** out_text,
                                steward_request_metrics* out_metrics, char* err, size_t err_len) {
    return steward_generate_ext(rt, req, nullptr, out_text, out_metrics, err, err_len);
}

steward_status steward_generate_ext(steward_runtime* rt, const steward_request* req, const steward_request_ext* ext,
                                    char** out_text, steward_request_metrics* out_metrics, char* err, size_t err_len) {
    if (out_text) *out_text = nullptr;
    if (!rt || !req || !out_text) {
        write_err(err, err_len, "steward_generate: rt, req and out_text must not be NULL");
        return STEWARD_ERR_INVALID_ARGUMENT;
    }
    return guarded("steward_generate", err, err_len, [&] {
        steward::GenerationRequest gr;
        std::string msg;
        steward_logprobs_cb on_logprobs = nullptr;  // a blocking call streams nothing
        steward_status s = to_request(req, gr, msg);
        if (s == STEWARD_OK) s = to_request_ext(ext, gr, on_logprobs, msg);
        if (s != STEWARD_OK) {
            write_err(err, err_len, "steward_generate: " + msg);
            return s;
        }
        const steward::GenerationResult r = rt->rt->generate(std::move(gr));
        *out_text = dup_string(r.text);
        if (out_metrics) *out_metrics = metrics_of(r.metrics);
        write_err(err, err_len, r.error);
        return status_of(r.finish);
    });
}

steward_status steward_end_session(steward_runtime* rt, const char* session) {
    if (!rt || !session) return STEWARD_ERR_INVALID_ARGUMENT;
    return guarded("steward_end_session", nullptr, 0, [&] {
        rt->rt->end_session(session);
        return STEWARD_OK;
    });
}

steward_status steward_put_document(steward_runtime* rt, const char* tenant, const char* id, const char* text,
                                    uint64_t version, double ttl_s, const char* const* acl, size_t n_acl,
                                    uint64_t* out_version, char* err, size_t err_len) {
    if (!rt || !tenant || !id || !text || (n_acl > 0 && !acl)) return STEWARD_ERR_INVALID_ARGUMENT;
    return guarded("steward_put_document", err, err_len, [&] {
        steward::Runtime::DocumentSpec d;
        d.text = text;
        d.version = version;
        d.ttl_s = ttl_s;
        for (size_t i = 0; i < n_acl; i++) {
            if (!acl[i]) return STEWARD_ERR_INVALID_ARGUMENT;
            d.acl.push_back(acl[i]);
        }
        auto v = rt->rt->put_document(tenant, id, std::move(d));
        if (!v) {
            write_err(err, err_len, v.error().message);
            return STEWARD_ERR_INVALID_ARGUMENT;
        }
        if (out_version) *out_version = *v;
        return STEWARD_OK;
    });
}

steward_status steward_remove_document(steward_runtime* rt, const char* tenant, const char* id) {
    if (!rt || !tenant || !id) return STEWARD_ERR_INVALID_ARGUMENT;
    return guarded("steward_remove_document", nullptr, 0,
                   [&] { return rt->rt->remove_document(tenant, id) ? STEWARD_OK : STEWARD_ERR_NOT_FOUND; });
}

steward_status steward_reload(steward_runtime* rt, uint64_t* out_generation, char* err, size_t err_len) {
    if (!rt) return STEWARD_ERR_INVALID_ARGUMENT;
    return guarded("steward_reload", err, err_len, [&] {
        auto g = rt->rt->reload();
        if (!g) {
            write_err(err, err_len, g.error().message);
            return STEWARD_ERR_CONFIG;
        }
        if (out_generation) *out_generation = *g;
        write_err(err, err_len, "");
        return STEWARD_OK;
    });
}

steward_status steward_metrics_json(steward_runtime* rt, char** out_json) {
    return metrics_string("steward_metrics_json", rt, out_json, &steward::Runtime::metrics_json);
}

steward_status steward_metrics_prometheus(steward_runtime* rt, char** out_text) {
    return metrics_string("steward_metrics_prometheus", rt, out_text, &steward::Runtime::metrics_prometheus);
}

steward_status steward_metrics_table(steward_runtime* rt, char** out_text) {
    return metrics_string("steward_metrics_table", rt, out_text, &steward::Runtime::metrics_table);
}

steward_status steward_config_generation(steward_runtime* rt, uint64_t* out_generation) {
    if (!rt || !out_generation) return STEWARD_ERR_INVALID_ARGUMENT;
    return guarded("steward_config_generation", nullptr, 0, [&] {
        *out_generation = rt->rt->config_generation();
        return STEWARD_OK;
    });
}

steward_status steward_check_config(const char* config_path, char** out_summary, char* err, size_t err_len) {
    if (out_summary) *out_summary = nullptr;
    if (!config_path) {
        write_err(err, err_len, "steward_check_config: config_path must not be NULL");
        return STEWARD_ERR_INVALID_ARGUMENT;
    }
    return guarded("steward_check_config", err, err_len, [&] {
        auto summary = steward::check_config_file(config_path);
        if (!summary) {
            write_err(err, err_len, summary.error().message);
            return STEWARD_ERR_CONFIG;
        }
        if (out_summary) *out_summary = dup_string(*summary);
        write_err(err, err_len, "");
        return STEWARD_OK;
    });
}

void steward_route_sighup_to_reload(void) {
    steward::Runtime::route_sighup_to_reload();
}

steward_status steward_drain(steward_runtime* rt) {
    if (!rt) return STEWARD_ERR_INVALID_ARGUMENT;
    return guarded("steward_drain", nullptr, 0, [&] {
        rt->rt->drain();
        return STEWARD_OK;
    });
}

steward_status steward_tokenize(steward_runtime* rt, const char* pool, const char* text, int add_special,
                                int32_t** out_ids, size_t* out_n, char* err, size_t err_len) {
    if (out_ids) *out_ids = nullptr;
    if (out_n) *out_n = 0;
    if (!rt || !text || !out_ids || !out_n) {
        write_err(err, err_len, "steward_tokenize: rt, text, out_ids and out_n must not be NULL");
        return STEWARD_ERR_INVALID_ARGUMENT;
    }
    return guarded("steward_tokenize", err, err_len, [&] {
        const std::string t = text;
        if (const size_t at = steward::utf8::invalid_at(t); at != std::string::npos) {
            write_err(err, err_len, "steward_tokenize: text is not valid UTF-8 (byte " + std::to_string(at) + ")");
            return STEWARD_ERR_INVALID_ARGUMENT;
        }
        auto ids = rt->rt->tokenize(pool_or_first(rt, pool), t, add_special != 0);
        if (!ids) {
            write_err(err, err_len, "steward_tokenize: " + ids.error().message);
            return STEWARD_ERR_INVALID_ARGUMENT;
        }
        if (!ids->empty()) {
            auto* p = static_cast<int32_t*>(std::malloc(ids->size() * sizeof(int32_t)));
            if (!p) throw std::bad_alloc();
            std::memcpy(p, ids->data(), ids->size() * sizeof(int32_t));
            *out_ids = p;
        }
        *out_n = ids->size();
        write_err(err, err_len, "");
        return STEWARD_OK;
    });
}

steward_status steward_detokenize(steward_runtime* rt, const char* pool, const int32_t* ids, size_t n_ids,
                                  char** out_text, size_t* out_len, char* err, size_t err_len) {
    if (out_text) *out_text = nullptr;
    if (out_len) *out_len = 0;
    if (!rt || !out_text || (n_ids > 0 && !ids)) {
        write_err(err, err_len, "steward_detokenize: rt and out_text must not be NULL, nor ids when n_ids > 0");
        return STEWARD_ERR_INVALID_ARGUMENT;
    }
    return guarded("steward_detokenize", err, err_len, [&] {
        auto text = rt->rt->detokenize(pool_or_first(rt, pool), std::vector<int32_t>(ids, ids + n_ids));
        if (!text) {
            write_err(err, err_len, "steward_detokenize: " + text.error().message);
            return STEWARD_ERR_INVALID_ARGUMENT;
        }
        *out_text = dup_string(*text);
        if (out_len) *out_len = text->size();
        write_err(err, err_len, "");
        return STEWARD_OK;
    });
}

void steward_ids_free(int32_t* ids) {
    std::free(ids);
}

steward_status steward_embed(steward_runtime* rt, const char* pool, const char* const* texts, size_t n_texts,
                             float** out_vectors, size_t* out_n_embd, int64_t* out_prompt_tokens, char* err,
                             size_t err_len) {
    if (out_vectors) *out_vectors = nullptr;
    if (out_n_embd) *out_n_embd = 0;
    if (out_prompt_tokens) *out_prompt_tokens = 0;
    if (!rt || !texts || !out_vectors || !out_n_embd || n_texts == 0) {
        write_err(err, err_len, "steward_embed: rt, texts, out_vectors and out_n_embd must not be NULL, and n_texts > 0");
        return STEWARD_ERR_INVALID_ARGUMENT;
    }
    return guarded("steward_embed", err, err_len, [&] {
        steward::EmbeddingRequest req;
        for (size_t i = 0; i < n_texts; i++) {
            if (!texts[i]) {
                write_err(err, err_len, "steward_embed: texts[" + std::to_string(i) + "] is NULL");
                return STEWARD_ERR_INVALID_ARGUMENT;
            }
            req.texts.emplace_back(texts[i]);
            if (const size_t at = steward::utf8::invalid_at(req.texts.back()); at != std::string::npos) {
                write_err(err, err_len, "steward_embed: texts[" + std::to_string(i) + "] is not valid UTF-8 (byte " +
                                            std::to_string(at) + ")");
                return STEWARD_ERR_INVALID_ARGUMENT;
            }
        }
        if (pool) req.pool = pool;
        const steward::EmbeddingResult r = rt->rt->embed(std::move(req));
        if (!r.ok()) {
            write_err(err, err_len, "steward_embed: " + r.error);
            return r.status == steward::EmbedStatus::FAILED ? STEWARD_ERR_GENERATION : STEWARD_ERR_INVALID_ARGUMENT;
        }
        const size_t n_embd = (size_t)r.n_embd;
        auto* p = static_cast<float*>(std::malloc(std::max<size_t>(1, r.vectors.size() * n_embd) * sizeof(float)));
        if (!p) throw std::bad_alloc();
        for (size_t i = 0; i < r.vectors.size(); i++) std::memcpy(p + i * n_embd, r.vectors[i].data(), n_embd * sizeof(float));
        *out_vectors = p;
        *out_n_embd = n_embd;
        if (out_prompt_tokens) *out_prompt_tokens = r.prompt_tokens;
        write_err(err, err_len, "");
        return STEWARD_OK;
    });
}

void steward_floats_free(float* p) {
    std::free(p);
}

void steward_string_free(char* s) {
    std::free(s);
}

}  // extern "C"
