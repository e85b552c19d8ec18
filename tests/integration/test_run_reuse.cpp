// `steward run --compare no_reuse` on a small generated workload with the rag bucket and agent tool
// calls (docs/workloads.md#the-rag-bucket-and-agent-tools): the reuse variant (the runner's default)
// serves every document reference, finds more document tokens cached than the no_reuse variant,
// and resolves exactly the repeated tool calls of a tenant; no_reuse resolves none.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "process_temp_dir.h"
#include "run_command.h"
#include "workload/workload.h"

namespace {

// A tiny model with a vocabulary of whole words (~1 token a word), a context for the rag prompts,
// and a bucket each for rag and agent.
const char* k_config = R"(
[limits]
request_timeout_ms = 60000
session_ttl_ms = 60000
max_tokens_default = 16

[[pool]]
chat_template_fallback = "chatml"
name = "tiny"
model = "tiny-reuse.gguf"
threads = 1
kv_blocks = 512
block_size = 16
max_batch = 8
max_batch_tokens = 256
[pool.synth]
dim = 64
layers = 2
heads = 4
kv_heads = 2
ffn = 128
vocab = 4096
ctx = 2048
seed = 7

[[bucket]]
name = "rag"
pool = "tiny"
[bucket.match]
hint = "rag"

[[bucket]]
name = "agent"
pool = "tiny"
[bucket.match]
tools = true

[[bucket]]
name = "default"
pool = "tiny"
)";

int64_t at(const nlohmann::json& j, std::initializer_list<const char*> path) {
    const nlohmann::json* p = &j;
    for (const char* k : path) {
        if (!p->is_object() || !p->contains(k)) return -1;
        p = &(*p)[k];
    }
    return p->is_number() ? p->get<int64_t>() : -1;
}

}  // namespace

TEST_CASE("run compare no_reuse shows the documents and tool results reused", "[cli][reuse]") {
    static steward_test::ProcessTempDir dir("steward_run_reuse_");
    const std::string d = dir.path().string();
    {
        std::ofstream f(d + "/reuse.toml");
        f << k_config;
    }
    const std::string cmd = "run -c " + d + "/reuse.toml --requests 24 --rate 10 --scale 0.5 --seed 2 --tenants 2 "
                            "--mix short_qa=0,long_doc=0,long_output=0,high_temp=0,structured=0,rag=1,agent=1 --agent-tools --tool-pause-ms 150 --compare no_reuse --save-workload " +
                            d + "/w.jsonl -o " + d + "/cmp.json";
    const auto r = steward_test::run_steward(cmd);
    INFO(r.out);
    REQUIRE(r.rc == 0);
    CHECK(r.out.find("doc_saved_tok") != std::string::npos);
    CHECK(r.out.find("trips_saved") != std::string::npos);

    // What to expect, from the workload itself: every document reference, and the tool calls that
    // repeat an earlier call of the same tenant (the runner learns a result when it sends its turn,
    // and sends turns in file order; the run is far shorter than the 600 s ttl).
    auto wl = steward::read_workload_file(d + "/w.jsonl");
    REQUIRE(wl.ok());
    int64_t n_doc_refs = 0, n_repeats = 0, n_calls = 0;
    std::set<std::tuple<std::string, std::string, std::string>> seen;
    for (const auto& q : wl->requests) {
        if (q.bucket == "rag") n_doc_refs += (int64_t)q.documents.size();
        if (q.tool_call) {
            ++n_calls;
            n_repeats += !seen.insert({q.tenant, q.tool_call->tool, q.tool_call->arguments}).second;
        }
    }
    REQUIRE(n_doc_refs > 0);
    REQUIRE(n_calls > 0);
    REQUIRE(n_repeats > 0);

    std::ifstream f(d + "/cmp.json");
    std::stringstream ss;
    ss << f.rdbuf();
    const auto out = nlohmann::json::parse(ss.str());
    REQUIRE(out["variants"] == nlohmann::json({"baseline", "no_reuse"}));
    const auto& on = out["runs"]["baseline"]["metrics"]["buckets"];
    const auto& off = out["runs"]["no_reuse"]["metrics"]["buckets"];
    CHECK(out["runs"]["baseline"]["failed"] == 0);
    CHECK(out["runs"]["no_reuse"]["failed"] == 0);

    // Documents: every reference counted in both variants; the canonical place finds more cached.
    CHECK(at(on, {"rag", "reuse", "documents", "hits"}) == n_doc_refs);
    CHECK(at(off, {"rag", "reuse", "documents", "hits"}) == n_doc_refs);
    const int64_t saved_on = at(on, {"rag", "reuse", "documents", "saved_prefill_tokens"});
    const int64_t saved_off = at(off, {"rag", "reuse", "documents", "saved_prefill_tokens"});
    INFO("document tokens found cached: reuse " << saved_on << ", no_reuse " << saved_off);
    CHECK(saved_on > 0);
    CHECK(saved_on > saved_off);

    // Tool results: exactly the repeated calls resolved with reuse, none without.
    CHECK(at(on, {"agent", "reuse", "tools", "hits"}) == n_repeats);
    CHECK(at(on, {"agent", "reuse", "tools", "round_trips_saved"}) == n_repeats);
    CHECK(at(off, {"agent", "reuse", "tools", "round_trips_saved"}) == 0);
    CHECK(at(off, {"agent", "reuse", "tools", "hits"}) == 0);
    CHECK(at(on, {"agent", "reuse", "tools", "resolved_tokens_saved"}) > 0);
}

TEST_CASE("run refuses an unknown compare variant naming no_reuse among the choices", "[cli][reuse]") {
    const auto r = steward_test::run_steward("run -c " + std::string(STEWARD_SOURCE_DIR) +
                                             "/configs/test_tiny.toml --requests 2 --compare no_reuses");
    INFO(r.out);
    CHECK(r.rc == 1);
    CHECK(r.out.find("unknown variant 'no_reuses'") != std::string::npos);
    CHECK(r.out.find("or no_reuse, comma-separated") != std::string::npos);
}
