// `steward run`: the main job. Generates the default synthetic models when missing, replays a
// mixed workload (the standard one of docs/workloads.md, or a JSONL file) through the runtime at its
// arrival times, with a progress bar, then prints the per-bucket table and writes it as JSON and as
// an HTML page (runtime/report) next to it.
#include "cli/commands.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include <steward/runtime.h>

#include "kv/kv_storage.h"
#include "report/html_report.h"
#include "report/prefix_diagnosis.h"
#include "reuse/tool_cache.h"
#include "sim/sim_clock.h"
#include "util/strings.h"
#include "workload/workload.h"

namespace steward {

namespace {

using clk = std::chrono::steady_clock;

struct Progress {
    std::mutex mu;
    int total = 0, done = 0, failed = 0;
    int64_t tokens = 0;
    clk::time_point start = clk::now();
    bool tty = isatty(2);
    int last_decile = -1;
    void print(bool final = false) {
        const double el = std::chrono::duration<double>(clk::now() - start).count();
        const int width = 30;
        const int filled = total ? done * width / total : width;
        if (tty) {
            std::fprintf(stderr, "\r[%.*s%.*s] %d/%d requests, %d failed, %lld tokens, %.1f tok/s, %.0f s%s",
                         filled, "==============================", width - filled, "                              ",
                         done, total, failed, (long long)tokens, el > 0 ? tokens / el : 0.0, el, final ? "\n" : "");
        } else {
            const int decile = total ? done * 10 / total : 10;
            if (decile == last_decile && !final) return;
            last_decile = decile;
            std::fprintf(stderr, "progress: %d/%d requests, %d failed, %lld tokens, %.0f s\n", done, total, failed,
                         (long long)tokens, el);
        }
        std::fflush(stderr);
    }
};

// A file to write, its folder made first (out/ on a first run).
std::ofstream open_output(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::path(path).has_parent_path())
        std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    return std::ofstream(path);
}

}  // namespace

Expected<WorkloadGenParams> workload_gen_params(const RunOptions& o) {
    WorkloadGenParams gp;
    gp.n_requests = o.n_requests;
    gp.rate = o.rate;
    gp.scale = o.scale;
    gp.seed = o.seed;
    gp.burst = o.burst;
    gp.volatile_share = o.volatile_share;
    gp.tool_pause_ms = o.tool_pause_ms;
    gp.agent_turns = o.agent_turns;
    gp.agent_tools = o.agent_tools;
    gp.agent_repeat = o.agent_repeat;
    if (o.n_tenants < 1 || o.n_tenants > 4) return make_error("--tenants is ", o.n_tenants, "; give 1 to 4 tenants");
    gp.n_tenants = o.n_tenants;
    if (!o.mix.empty()) {
        auto mix = parse_workload_mix(o.mix);
        if (!mix) return mix.error();
        gp.mix = std::move(*mix);
    }
    if (o.volatile_at != "early" && o.volatile_at != "late")
        return make_error("--volatile-at is '", o.volatile_at, "'; give early (after the public system prompt) or late (at the end of the prompt)");
    gp.volatile_late = o.volatile_at == "late";
    if (auto ok = check_workload_gen(gp); !ok) return ok.error();
    return gp;
}

int cmd_bench_gen(const RunOptions& o) {
    auto gp = workload_gen_params(o);
    if (!gp) return cli_fail(gp.error().message);
    const Workload wl = generate_workload(*gp);
    if (auto e = write_workload_file(wl, o.save_workload)) return cli_fail(e->message);
    std::string docs;
    if (!wl.documents.empty()) docs = ", " + std::to_string(wl.documents.size()) + " documents";
    std::printf("wrote %zu requests (%zu shared segments%s) to %s\n", wl.requests.size(), wl.segments.size(),
                docs.c_str(), o.save_workload.c_str());
    return 0;
}

namespace {
struct RunResult {
    int failed = 0;
    double wall_s = 0;
    nlohmann::json metrics;
};
int run_one(const RunOptions& o, const Workload& wl, const Config* cfg, bool quiet, bool reuse, RunResult& result);
int run_compare(const RunOptions& o, const Workload& wl);
}  // namespace

int cmd_run(const RunOptions& o) {
    Workload wl;
    if (!o.workload_path.empty()) {
        auto w = read_workload_file(o.workload_path);
        if (!w) return cli_fail(w.error().message);
        wl = std::move(*w);
    } else {
        auto gp = workload_gen_params(o);
        if (!gp) return cli_fail(gp.error().message);
        wl = generate_workload(*gp);
    }
    if (!o.save_workload.empty()) {
        if (auto e = write_workload_file(wl, o.save_workload)) return cli_fail(e->message);
    }
    Runtime::route_sighup_to_reload();  // kill -HUP reloads the config while the run goes on
    if (o.compare.empty()) {
        RunResult r;
        return run_one(o, wl, nullptr, false, !o.no_reuse, r);
    }
    return run_compare(o, wl);
}

namespace {

// One replay of wl through a runtime started from o.config_path, or from *cfg (an ablation's
// variant). quiet: only the figures (result), no table, diagnosis, outputs or report files.
// reuse (docs/reuse.md, the runner's side of it): a request's documents go at the canonical place
// (sorted by name, right after the leading shared segments) rather than where documents_at says,
// and an agent turn whose tool_call result the runner has cached (learned from an earlier turn of the
// tenant) is resolved: sent as soon as the previous turn finished, without the tool pause.
int run_one(const RunOptions& o, const Workload& wl, const Config* cfg, bool quiet, bool reuse, RunResult& result) {
    // Segments the workload declares public become public prefixes. They are start options, not
    // edits of a loaded Config, so that a reload (SIGHUP, a save) applies them again and keeps
    // every unchanged pool and its cache.
    RuntimeOptions ro;
    std::map<std::string, bool> pub;
    for (const auto& r : wl.requests)
        if (!r.public_prefix.empty()) pub[r.public_prefix] = true;
    for (const auto& [name, _] : pub)
        if (const WorkloadSegment* s = wl.find_segment(name)) ro.extra_public_prefixes.push_back({name, s->text});

    Expected<std::unique_ptr<Runtime>> rt = make_error("not started");
    if (cfg) {  // an ablation's variant: the workload's public prefixes go into the value itself
        Config c = *cfg;
        for (const PublicPrefixConfig& pp : ro.extra_public_prefixes)
            if (std::none_of(c.public_prefixes.begin(), c.public_prefixes.end(),
                             [&](const PublicPrefixConfig& q) { return q.name == pp.name; }))
                c.public_prefixes.push_back(pp);
        rt = Runtime::start(c);
    } else {
        rt = Runtime::start(o.config_path, std::move(ro));
    }
    if (!rt) return cli_fail(rt.error().message);
    Runtime& runtime = **rt;
    {
        const auto cfg = runtime.config();
        const bool reusable = !wl.documents.empty() ||
                              std::any_of(wl.requests.begin(), wl.requests.end(), [](const WorkloadRequest& r) { return r.tool_call.has_value(); });
        std::fprintf(stderr, "steward run: config %s, %zu requests, %zu pools, %zu buckets%s\n", o.config_path.c_str(),
                     wl.requests.size(), cfg->pools.size(), cfg->buckets.size(),
                     reusable ? (reuse ? ", reuse on" : ", reuse off") : "");
    }

    // With reuse, the workload's documents are registered with the runtime for each tenant that
    // references them, and each request names its documents (GenerationRequest::documents) and says
    // where its prompt holds them: their KV gets reuse priority (docs/reuse.md#kv-priority-and-invalidation).
    if (reuse) {
        std::set<std::pair<std::string, std::string>> registered;
        for (const WorkloadRequest& r : wl.requests) {
            if (r.prompt_kind == PromptKind::IDS) continue;
            for (const std::string& name : r.documents) {
                if (!registered.insert({r.tenant, name}).second) continue;
                const WorkloadDocument* d = wl.find_document(name);
                if (!d) continue;  // place_prompt names it below
                auto v = runtime.put_document(r.tenant, name, {d->text, (uint64_t)std::max<int64_t>(d->version, 1), 0, {}});
                if (!v) return cli_fail("workload document '" + name + "': " + v.error().message);
            }
        }
    }

    Progress prog;
    prog.total = (int)wl.requests.size();
    std::mutex mu;
    std::condition_variable cv;
    // Agent sessions: when the next turn may go; their text is in `conversations`.
    SessionConversations conversations;
    struct SessionState {
        bool busy = false;
        clk::time_point ready = clk::time_point::min();
    };
    // Keyed by (tenant, session): two tenants using one session id are two conversations, and
    // neither's text may be appended to the other's prompt.
    std::map<std::pair<std::string, std::string>, SessionState> sessions;
    // Tool results the runner learned from the conversations it sent (reuse on): tenant-scoped, keyed
    // by every argument, fresh for the call's ttl_s on the run's (simulated) clock.
    reuse::ToolResultCache tool_cache;
    std::atomic<int> in_flight{0};
    const double dilation = time_dilation();  // [sim] dilation, set by Runtime::start
    if (dilation != 1)
        std::fprintf(stderr, "steward run: simulated time runs %.3g x real time ([sim] dilation): latencies, rates and "
                             "arrival times below are simulated\n", dilation);
    const clk::time_point t0 = clk::now();
    prog.start = t0;

    auto make_request = [&](const WorkloadRequest& r, const std::string& text) {
        GenerationRequest g;
        g.tenant = r.tenant;
        g.bucket_hint = r.bucket;
        g.session = r.session;
        g.max_tokens = r.max_tokens;
        g.ignore_eos = o.ignore_eos;
        g.temperature = o.greedy ? 0.0f : (float)r.temperature;
        g.top_p = o.greedy ? 1.0f : (float)r.top_p;
        g.seed = r.seed.value_or(0);
        g.tools = r.tools;
        // A workload's response_format "json" is JSON mode (OpenAI's json_object): the output is
        // constrained to one JSON object, and the request classifies as "json" (the structured bucket).
        g.response_format = r.response_json ? "json" : "";
        g.json_object = r.response_json;
        if (r.prompt_kind == PromptKind::IDS) g.prompt_ids = r.prompt_ids;
        else g.prompt = text;
        return g;
    };

    std::thread ticker([&] {
        std::unique_lock<std::mutex> lk(prog.mu);
        while (prog.done < prog.total) {
            prog.print();
            lk.unlock();
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
            lk.lock();
        }
    });

    // What each request sent and where it went, for the prefix-miss diagnosis after the run.
    struct Sent {
        std::string tenant, text, bucket, pool;
        std::vector<int32_t> ids;
        std::string output, finish, error;
        RequestMetrics metrics;
        bool upgraded = false, fallback = false, ok = false;
        // Reuse: the documents' block in text ([doc_begin, doc_end), empty without documents), and
        // whether the turn's tool call was resolved from the runner's cache.
        size_t n_documents = 0, doc_begin = 0, doc_end = 0;
        bool resolved = false;
        double tool_age_s = 0;
    };
    std::vector<Sent> sent(wl.requests.size());
    size_t n_submitted = 0;
    for (const WorkloadRequest& r : wl.requests) {
        // Arrival times are simulated time: with [sim] dilation D the replay runs D times faster.
        const clk::time_point at = t0 + std::chrono::microseconds((int64_t)(r.arrival_ms * 1e3 / dilation));
        PlacedPrompt placed;
        if (r.prompt_kind != PromptKind::IDS)
            placed = wl.place_prompt(r, reuse ? DocumentPlacement::CANONICAL : DocumentPlacement::AS_LISTED);
        std::string text = std::move(placed.text);
        bool resolved = false;
        double tool_age_s = 0;
        {
            std::unique_lock<std::mutex> lk(mu);
            if (!r.session.empty()) {
                // A later turn waits for the previous one and its tool pause; its prompt is the
                // conversation so far plus its new content.
                const auto key = std::make_pair(r.tenant, r.session);
                cv.wait(lk, [&] { return !sessions[key].busy; });
                SessionState& s = sessions[key];
                // Its tool call: resolved from the cache when a fresh result is there (no pause: the
                // client's round trip is saved), else learned from the conversation as it is sent.
                std::optional<reuse::ToolCachePolicy> policy;
                reuse::ToolCaller caller{r.tenant, 0, r.session, {}};
                nlohmann::json args;
                auto run_clock_s = [&] { return std::chrono::duration<double>(clk::now() - t0).count() * dilation; };
                if (reuse && r.tool_call) {
                    policy = reuse::ToolCachePolicy{r.tool_call->tool, r.tool_call->ttl_s, reuse::ToolScope::TENANT, {}};
                    args = nlohmann::json::parse(r.tool_call->arguments, nullptr, false);
                    if (auto hit = tool_cache.lookup(*policy, caller, args, run_clock_s())) {
                        resolved = true;
                        tool_age_s = hit->age_s;
                    }
                }
                if (!o.sequential && !resolved) cv.wait_until(lk, std::max(at, s.ready), [] { return false; });
                if (policy && !resolved) tool_cache.store(*policy, caller, args, r.prompt, run_clock_s());
                const size_t before = text.size();
                text = conversations.open_turn(r.tenant, r.session, text);
                placed.doc_begin += text.size() - before;
                placed.doc_end += text.size() - before;
                s.busy = true;
            } else if (!o.sequential) {
                cv.wait_until(lk, at, [] { return false; });
            }
            if (o.sequential) cv.wait(lk, [&] { return in_flight.load() == 0; });
        }
        in_flight++;
        const std::string session = r.session, tenant = r.tenant;
        const double pause_ms = r.tool_pause_ms;
        RequestCallbacks cb;
        const size_t slot = n_submitted++;
        sent[slot].tenant = r.tenant;
        if (r.prompt_kind == PromptKind::IDS) sent[slot].ids = r.prompt_ids;
        else sent[slot].text = text;
        sent[slot].n_documents = r.prompt_kind == PromptKind::IDS ? 0 : r.documents.size();
        sent[slot].doc_begin = placed.doc_begin;
        sent[slot].doc_end = placed.doc_end;
        sent[slot].resolved = resolved;
        sent[slot].tool_age_s = tool_age_s;
        cb.on_finish = [&, session, tenant, pause_ms, slot](const GenerationResult& res) {
            {
                std::lock_guard<std::mutex> lk(mu);
                sent[slot].bucket = res.bucket;
                sent[slot].pool = res.pool;
                sent[slot].output = res.text;
                sent[slot].finish = finish_reason_name(res.finish);
                sent[slot].metrics = res.metrics;
                sent[slot].upgraded = res.upgraded;
                sent[slot].fallback = res.fallback;
                sent[slot].error = res.error;
                sent[slot].ok = res.ok();
                if (!session.empty()) {
                    SessionState& s = sessions[{tenant, session}];
                    conversations.close_turn(tenant, session, res.text);
                    s.busy = false;
                    s.ready = clk::now() + std::chrono::microseconds((int64_t)(pause_ms * 1e3 / dilation));
                }
            }
            {
                std::lock_guard<std::mutex> lk(prog.mu);
                prog.done++;
                prog.tokens += (int64_t)res.tokens.size();
                if (!res.ok()) {
                    prog.failed++;
                    if (o.verbose) std::fprintf(stderr, "\nrequest %llu %s: %s\n", (unsigned long long)res.id,
                                                finish_reason_name(res.finish), res.error.c_str());
                }
            }
            in_flight--;
            cv.notify_all();
        };
        GenerationRequest g = make_request(r, text);
        if (reuse && r.prompt_kind != PromptKind::IDS && !r.documents.empty() && placed.doc_end > placed.doc_begin) {
            for (const std::string& name : r.documents)
                if (const WorkloadDocument* d = wl.find_document(name))
                    g.documents.push_back({name, (uint64_t)std::max<int64_t>(d->version, 1)});
            // The prompt is placed already: the hook hands it over as is, with where the documents are.
            g.render = [text, b = placed.doc_begin, e = placed.doc_end](const PromptPool&) {
                PoolPrompt p;
                p.text = text;
                p.documents_begin = b;
                p.documents_end = e;
                return p;
            };
        }
        runtime.submit(std::move(g), std::move(cb));
    }
    runtime.drain();
    ticker.join();
    prog.print(true);

    result.failed = prog.failed;
    result.wall_s = std::chrono::duration<double>(clk::now() - t0).count();
    // The reuse figures of each request, in its bucket (docs/reuse.md#figures). A document's saved
    // prefill tokens are measured: the prompt tokenized (by the pool that answered) up to and through
    // the documents' block, the request's cached tokens clamped to that span.
    for (size_t i = 0; i < n_submitted; i++) {
        const Sent& s = sent[i];
        if (!s.ok || s.pool.empty()) continue;
        ReuseCounts c;
        if (s.n_documents > 0 && s.doc_end > s.doc_begin) {
            c.document_hits = (int64_t)s.n_documents;
            auto before = runtime.tokenize(s.pool, s.text.substr(0, s.doc_begin), true);
            auto through = runtime.tokenize(s.pool, s.text.substr(0, s.doc_end), true);
            if (before && through) {
                const int64_t n_before = (int64_t)before->size(), span = std::max<int64_t>(0, (int64_t)through->size() - n_before);
                c.document_saved_prefill_tokens = std::clamp<int64_t>(s.metrics.cached_tokens - n_before, 0, span);
            }
        }
        if (s.resolved) {
            c.tool_hits = 1;
            c.tool_round_trips_saved = 1;
            c.tool_resolved_tokens_saved = s.metrics.cached_tokens;
            c.tool_age_at_use_s.push_back(s.tool_age_s);
        }
        if (c.document_hits || c.tool_hits) runtime.record_reuse(s.bucket, c);
    }
    result.metrics = nlohmann::json::parse(runtime.metrics_json());
    if (quiet) return prog.failed == 0 ? 0 : 3;
    const std::string table = runtime.metrics_table(o.wide);
    std::printf("\n%s\n", table.c_str());
    if (!o.outputs_path.empty()) {  // one line per request in workload order
        std::ofstream f = open_output(o.outputs_path);
        for (size_t i = 0; i < n_submitted; i++) {
            const Sent& s = sent[i];
            f << nlohmann::json{{"line", i + 1}, {"bucket_hint", wl.requests[i].bucket}, {"bucket", s.bucket},
                                {"pool", s.pool}, {"tenant", s.tenant}, {"finish", s.finish},
                                {"prompt_tokens", s.metrics.prompt_tokens}, {"cached_tokens", s.metrics.cached_tokens},
                                {"completion_tokens", s.metrics.completion_tokens}, {"ttft_ms", s.metrics.ttft_ms},
                                {"tpot_ms", s.metrics.tpot_ms}, {"e2e_ms", s.metrics.e2e_ms}, {"upgraded", s.upgraded},
                                {"fallback", s.fallback}, {"error", s.error}, {"text", s.output}}
                     .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
        }
        if (!f) return cli_fail("cannot write the outputs to '" + o.outputs_path + "'");
    }
    // Prefix misses: each prompt (in the pool that served it, as that pool tokenizes it) against the
    // earlier prompts of its pool and tenant, what one prefix cache could share.
    std::vector<DiagnosisPrompt> diag_prompts;
    std::map<std::string, std::string> scope_pool;
    for (Sent& s : sent) {
        if (s.pool.empty()) continue;  // refused before a pool took it
        DiagnosisPrompt d;
        d.bucket = s.bucket.empty() ? "-" : s.bucket;
        d.scope = s.pool + "\x1f" + s.tenant;
        scope_pool[d.scope] = s.pool;
        if (!s.ids.empty()) d.ids = std::move(s.ids);
        else if (auto ids = runtime.tokenize(s.pool, s.text, true)) d.ids = std::move(*ids);
        else continue;
        diag_prompts.push_back(std::move(d));
    }
    const auto diagnosis = diagnose_prefix_misses(diag_prompts, [&](const std::string& scope, const std::vector<int32_t>& ids) {
        auto t = runtime.detokenize(scope_pool[scope], ids);
        return t ? *t : std::string("?");
    });
    std::printf("prefix misses: where each prompt leaves the longest prefix an earlier prompt of its pool and tenant "
                "shares (token position ranges); volatile: the prompts agree again after a short span\n%s\n",
                prefix_diagnosis_table(diagnosis).c_str());
    // Peak RSS against what it should be: the model files (copied once into anonymous huge-page
    // memory, or read in place from the mapping with STEWARD_MMAP=1: the same bytes either way) plus
    // the KV pools (allocated whole at start) plus a small overhead (activations, actors, buffers).
    int64_t model_bytes = 0, kv_total = 0;
    for (const PoolInfo& p : runtime.pools()) model_bytes += p.model_bytes, kv_total += p.kv_bytes;
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    const int64_t peak = (int64_t)ru.ru_maxrss * 1024;  // Linux reports KiB
    const double mib = 1024.0 * 1024.0;
    std::printf("memory: peak RSS %.1f MiB = model files %.1f MiB + KV pools %.1f MiB + other %.1f MiB\n",
                (double)peak / mib, (double)model_bytes / mib, (double)kv_total / mib,
                (double)(peak - model_bytes - kv_total) / mib);
    nlohmann::json report;
    report["config"] = o.config_path;
    report["requests"] = wl.requests.size();
    report["wall_s"] = std::chrono::duration<double>(clk::now() - t0).count();
    report["metrics"] = result.metrics;
    report["prefix_diagnosis"] = prefix_diagnosis_json(diagnosis);
    report["memory"] = {{"peak_rss_bytes", peak}, {"model_bytes", model_bytes}, {"kv_bytes", kv_total},
                        {"other_bytes", peak - model_bytes - kv_total}};
    std::ofstream out = open_output(o.out_path);
    if (!out) return cli_fail("cannot write the report to '" + o.out_path + "'");
    out << report.dump(2) << "\n";
    // The same report as a page to read (charts and tables, the JSON embedded), next to the JSON.
    const std::string html_path = html_report_path(o.out_path);
    std::ofstream html(html_path);
    if (!html) return cli_fail("cannot write the HTML report to '" + html_path + "'");
    html << html_report(report);
    std::printf("report written to %s and %s\n", o.out_path.c_str(), html_path.c_str());
    return prog.failed == 0 ? 0 : 3;
}


// An ablation: the config with one mechanism changed (see RunOptions::compare).
Expected<Config> variant_config(const Config& base, const std::string& v) {
    Config c = base;
    if (v == "baseline") return c;
    if (v == "no_reuse") return c;  // a runner option (documents as listed, no tool results resolved): run_compare
    if (v == "no_prefix_cache") {
        for (auto& p : c.pools) p.prefix_cache = false;
        return c;
    }
    if (v == "no_speculation") {
        for (auto& b : c.buckets) b.speculation.reset();
        return c;
    }
    if (v == "global_speculation") {  // the first speculating bucket's policy on every bucket
        auto it = std::find_if(c.buckets.begin(), c.buckets.end(), [](const BucketConfig& b) { return b.speculation.has_value(); });
        if (it == c.buckets.end()) return make_error("--compare global_speculation: no bucket of the config speculates");
        const BucketConfig src = *it;
        for (auto& b : c.buckets) {
            b.speculation = src.speculation;
            b.speculation_source = "";  // each pool's own: its draft model, else n-gram
            b.speculation_tree = src.speculation_tree;
            b.speculation_tree_branch = src.speculation_tree_branch;
            b.speculation_tree_depth = src.speculation_tree_depth;
        }
        return c;
    }
    if (v == "no_routing") {
        for (auto& b : c.buckets) b.routing.reset();
        return c;
    }
    if (v == "kv_tiers=off") {  // evicted blocks are gone, as without [pool.kv_tiers]
        bool any = false;
        for (auto& p : c.pools) any = any || p.kv_tiers.enabled(), p.kv_tiers = KvTiersConfig{};
        if (!any) return make_error("--compare kv_tiers=off: no pool of the config has [pool.kv_tiers]");
        return c;
    }
    if (v.rfind("kv_type=", 0) == 0 && v.size() > 8) {  // every local pool's K and V cache type
        const std::string t = v.substr(8);
        if (!parse_kv_dtype(t))
            return make_error("--compare ", v, ": '", t, "' is not a KV cache type; use f32, f16, bf16, q8_0 or q4_0");
        for (auto& p : c.pools)
            if (p.remote.empty() && !p.sim) p.kv_dtype = p.kv_type_k = p.kv_type_v = t;
        return c;
    }
    if (v.rfind("speculation=", 0) == 0 && v.size() > 12) {  // one policy on every bucket, e.g. a fixed k everywhere
        for (auto& b : c.buckets) {
            b.speculation = PolicySpec{};
            b.speculation->plugin = v.substr(12);
            b.speculation->where = "--compare " + v;
            b.speculation_source = "";  // each pool's own: its draft model, else n-gram
        }
        return c;
    }
    if (v.rfind("spec_source=", 0) == 0 && v.size() > 12) {  // every speculating bucket drafts from one source
        const std::string src = v.substr(12);
        if (src != "ngram" && src != "suffix" && src != "draft" && src != "self")
            return make_error("--compare ", v, ": '", src, "' is not a draft source; use ngram, suffix, draft or self");
        bool any = false;
        for (auto& b : c.buckets)
            if (b.speculation) {
                any = true;
                b.speculation_source = src;
                if (src == "ngram" || src == "suffix") b.speculation_tree = "chain";
            }
        if (!any) return make_error("--compare ", v, ": no bucket of the config speculates");
        return c;
    }
    if (v.rfind("eviction=", 0) == 0 && v.size() > 9) {
        for (auto& b : c.buckets) {
            b.eviction = PolicySpec{};
            b.eviction->plugin = v.substr(9);
            b.eviction->where = "--compare " + v;  // errors name where the policy came from
        }
        return c;
    }
    return make_error("--compare: unknown variant '", v,
                      "'; give baseline, no_prefix_cache, no_speculation, global_speculation, speculation=PLUGIN (e.g. "
                      "speculation=fixed), spec_source=SRC (ngram, suffix, draft or self), no_routing, eviction=PLUGIN (e.g. eviction=lru), "
                      "kv_tiers=off, kv_type=TYPE "
                      "(e.g. kv_type=q8_0) or no_reuse, comma-separated");
}

// --compare: the workload through each variant in turn (a fresh runtime each, the same requests at
// the same arrival times), then per bucket each figure side by side with its ratio to the first.
int run_compare(const RunOptions& o, const Workload& wl) {
    auto base = load_config(o.config_path);
    if (!base) return cli_fail(base.error().message);
    std::vector<std::string> names = split_list(o.compare);
    if (names.empty() || names[0] != "baseline") names.insert(names.begin(), "baseline");
    std::vector<Config> configs;
    for (const std::string& n : names) {
        auto c = variant_config(*base, n);
        if (!c) return cli_fail(c.error().message);
        configs.push_back(std::move(*c));
    }
    std::vector<RunResult> results(names.size());
    int rc = 0;
    for (size_t i = 0; i < names.size(); i++) {
        std::fprintf(stderr, "steward run --compare: %s (%zu of %zu)\n", names[i].c_str(), i + 1, names.size());
        // no_reuse is the runner's: the same config, documents inlined as listed, no tool result resolved.
        const bool reuse = !o.no_reuse && names[i] != "no_reuse";
        const int r = run_one(o, wl, &configs[i], true, reuse, results[i]);
        if (r == 1) return r;  // could not start: the message is out
        rc = std::max(rc, r);
    }
    struct Fig {
        const char* name;
        std::vector<const char*> path;
        bool only_when_some = false;  // a row only when some variant has it above 0 (the reuse figures)
    };
    const std::vector<Fig> figs = {{"ttft_p50", {"ttft_ms", "p50"}},   {"ttft_p99", {"ttft_ms", "p99"}},
                                   {"tpot_mean", {"tpot_ms", "mean"}}, {"tpot_p99", {"tpot_ms", "p99"}},
                                   {"e2e_p99", {"e2e_ms", "p99"}},
                                   {"tok/s", {"throughput_tok_s"}},    {"hit_rate", {"prefix_cache", "hit_rate"}},
                                   {"saved_prefill_tok", {"prefix_cache", "saved_prefill_tokens"}},
                                   {"doc_hits", {"reuse", "documents", "hits"}, true},
                                   {"doc_saved_tok", {"reuse", "documents", "saved_prefill_tokens"}, true},
                                   {"tool_hits", {"reuse", "tools", "hits"}, true},
                                   {"trips_saved", {"reuse", "tools", "round_trips_saved"}, true},
                                   {"tool_saved_tok", {"reuse", "tools", "resolved_tokens_saved"}, true}};
    // A bucket's figure at `path` (null when absent): a bucket's figures are under "buckets", every
    // request's under "all".
    auto find = [](const nlohmann::json& m, const std::string& bucket, const std::vector<const char*>& path) -> const nlohmann::json* {
        const nlohmann::json* j = &m;
        std::vector<const char*> where =
            bucket == "all" ? std::vector<const char*>{"all"} : std::vector<const char*>{"buckets", bucket.c_str()};
        where.insert(where.end(), path.begin(), path.end());
        for (const char* k : where) {
            if (!j->is_object() || !j->contains(k)) return nullptr;
            j = &(*j)[k];
        }
        return j;
    };
    auto value = [&](const nlohmann::json& m, const std::string& bucket, const Fig& f) -> double {
        const nlohmann::json* j = find(m, bucket, f.path);
        return j && j->is_number() ? j->get<double>() : -1;
    };
    std::printf("\nablations: the same %zu requests through each variant; value (ratio to %s)\n%-12s %-10s", wl.requests.size(),
                names[0].c_str(), "bucket", "figure");
    for (const std::string& n : names) std::printf(" %22s", n.c_str());
    std::printf("\n");
    nlohmann::json out = {{"variants", names}, {"runs", nlohmann::json::object()}};
    std::vector<std::string> buckets;
    if (results[0].metrics.contains("buckets"))
        for (const auto& [b, _] : results[0].metrics["buckets"].items()) buckets.push_back(b);
    buckets.push_back("all");  // last, as the table does
    for (const std::string& b : buckets)
        for (const Fig& f : figs) {
            if (f.only_when_some &&
                std::none_of(results.begin(), results.end(), [&](const RunResult& r) { return value(r.metrics, b, f) > 0; }))
                continue;
            std::printf("%-12s %-10s", b.c_str(), f.name);
            const double v0 = value(results[0].metrics, b, f);
            for (size_t i = 0; i < names.size(); i++) {
                const double v = value(results[i].metrics, b, f);
                char cell[64];
                if (v < 0) std::snprintf(cell, sizeof cell, "-");
                else if (i == 0 || v0 <= 0) std::snprintf(cell, sizeof cell, "%.3g", v);
                else std::snprintf(cell, sizeof cell, "%.3g (%.2fx)", v, v / v0);
                std::printf(" %22s", cell);
            }
            std::printf("\n");
        }
    // With no_speculation among the variants: per bucket and speculating variant, the gain measured
    // against it (its TPOT mean over the variant's, the same requests) beside what the variant's own
    // report said (its gain and where it came from) and the estimate from the measured parts, with
    // the estimate's error against the measurement.
    if (const auto off = std::find(names.begin(), names.end(), "no_speculation"); off != names.end()) {
        const size_t i_off = (size_t)(off - names.begin());
        const Fig tpot{"tpot_mean", {"tpot_ms", "mean"}};
        auto spec = [&](const nlohmann::json& m, const std::string& b, const char* key) -> nlohmann::json {
            const nlohmann::json* j = find(m, b, {"speculation", key});
            return j ? *j : nlohmann::json(nullptr);
        };
        bool header = false;
        for (const std::string& b : buckets) {
            if (b == "all") continue;
            const double t_off = value(results[i_off].metrics, b, tpot);
            for (size_t i = 0; i < names.size(); i++) {
                const nlohmann::json gain = spec(results[i].metrics, b, "gain");
                if (i == i_off || !gain.is_number()) continue;
                const double t = value(results[i].metrics, b, tpot);
                if (t <= 0 || t_off <= 0) continue;
                if (!header) {
                    std::printf("\nspeculation gain against no_speculation (its TPOT mean / the variant's, the same requests), "
                                "beside the variant's own report\n%-12s %-22s %9s %9s %-15s %9s %9s\n",
                                "bucket", "variant", "measured", "reported", "source", "estimate", "est_error");
                    header = true;
                }
                const double measured = t_off / t;
                const nlohmann::json est = spec(results[i].metrics, b, "gain_estimate");
                const nlohmann::json src = spec(results[i].metrics, b, "gain_source");
                char e[32] = "-", err[32] = "-";
                if (est.is_number()) {
                    std::snprintf(e, sizeof e, "%.2fx", est.get<double>());
                    std::snprintf(err, sizeof err, "%+.0f%%", (est.get<double>() / measured - 1) * 100);
                }
                std::printf("%-12s %-22s %8.2fx %8.2fx %-15s %9s %9s\n", b.c_str(), names[i].c_str(), measured,
                            gain.get<double>(), src.is_string() ? src.get<std::string>().c_str() : "-", e, err);
            }
        }
    }
    for (size_t i = 0; i < names.size(); i++)
        out["runs"][names[i]] = {{"failed", results[i].failed}, {"wall_s", results[i].wall_s}, {"metrics", results[i].metrics}};
    std::ofstream f = open_output(o.out_path);
    f << out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!f) return cli_fail("cannot write the comparison to '" + o.out_path + "'");
    std::printf("comparison written to %s\n", o.out_path.c_str());
    return rc;
}

}  // namespace

}  // namespace steward
