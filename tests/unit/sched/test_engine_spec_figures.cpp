// The engine's per-request speculation figures (EngineEvent): per draft position counts that add up
// to the totals and follow the chain rule (a tree's positions are its depths), and draft / verify times only where drafts were verified.
#include <catch2/catch.hpp>

#include <map>

#include "model/synth.h"
#include "process_temp_dir.h"
#include "sched/engine.h"

using namespace steward;

TEST_CASE("per-position draft counts add up to the totals and a position is accepted only after the one before",
          "[engine][speculation]") {
    steward_test::ProcessTempDir dir("steward_test_spec_figures_");
    SynthSpec s;
    s.n_embd = 64; s.n_layer = 4; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512; s.n_ctx = 512;
    s.seed = 9;
    s.late_scale = 0.3f;  // the draft agrees often but not always: acceptances and rejections both
    s.late_from = 2;
    const std::string t = (dir.path() / "target.gguf").string(), d = (dir.path() / "draft.gguf").string();
    REQUIRE(synth_write(s, t).ok());
    REQUIRE(synth_draft(t, 2, d).ok());
    auto target = Model::load(t);
    auto draft = Model::load(d);
    REQUIRE(target.ok());
    REQUIRE(draft.ok());
    EngineOptions opt;
    opt.n_threads = 1;
    opt.draft_model = draft->get();
    Engine e(**target, opt);
    std::map<uint64_t, EngineEvent> last;
    for (uint64_t id = 1; id <= 5; id++) {
        EngineRequest r;
        r.id = id;
        r.prompt = {300 + (int32_t)id, 301, 302, 303};
        r.max_tokens = 40;
        r.stop_at_eos = false;
        if (id <= 3) r.spec = SpecSettings{SpecSource::DRAFT, (int)id + 1};  // k = 2, 3, 4; id 4 plain
        if (id == 5) {  // a tree of 6 tokens, 2 children a node, 3 deep: positions are depths
            r.spec.source = SpecSource::DRAFT;
            r.spec.k = 6;
            r.spec.tree = SpecTree::FIXED;
            r.spec.tree_branch = 2;
            r.spec.tree_depth = 3;
        }
        REQUIRE(e.submit(r).ok());
    }
    double now = 0;
    while (e.has_work())
        for (EngineEvent& ev : e.step(now += 0.01))
            if (ev.finished) last[ev.id] = ev;
    REQUIRE(last.size() == 5);
    int64_t n_rejected = 0;
    for (uint64_t id : {1, 2, 3, 5}) {
        const EngineEvent& ev = last[id];
        const int depth = id == 5 ? 3 : (int)id + 1;
        INFO("request " << id);
        REQUIRE(ev.n_drafts > 0);
        if (id == 5) CHECK(ev.n_draft_tokens_at[0] >= ev.n_drafts);  // every draft has a first position,
        else CHECK(ev.n_draft_tokens_at[0] == ev.n_drafts);           // once in a chain
        int sum_proposed = 0, sum_accepted = 0;
        for (int i = 0; i < k_max_spec_tokens; i++) {
            sum_proposed += ev.n_draft_tokens_at[(size_t)i];
            sum_accepted += ev.n_accepted_at[(size_t)i];
            CHECK(ev.n_accepted_at[(size_t)i] <= ev.n_draft_tokens_at[(size_t)i]);
            if (i > 0) CHECK(ev.n_accepted_at[(size_t)i] <= ev.n_accepted_at[(size_t)i - 1]);
            if (i >= depth) CHECK(ev.n_draft_tokens_at[(size_t)i] == 0);  // never past its depth
        }
        CHECK(sum_proposed == ev.n_draft_tokens);
        CHECK(sum_accepted == ev.n_accepted_tokens);
        n_rejected += ev.n_draft_tokens - ev.n_accepted_tokens;
        CHECK(ev.draft_s > 0);
        CHECK(ev.verify_s > 0);
    }
    CHECK(n_rejected > 0);
    // The tree proposes more tokens at depth 2 than at depth 1 (2 children a node), one path each.
    CHECK(last[5].n_draft_tokens_at[1] > last[5].n_draft_tokens_at[0]);
    // Branches: a chain is one per draft; the tree (6 nodes, 2 children a node) has at most 4
    // leaves, and more than one wherever it grew past its first level.
    for (uint64_t id : {1, 2, 3}) CHECK(last[id].n_spec_branches == last[id].n_drafts);
    CHECK(last[5].n_spec_branches > last[5].n_drafts);
    CHECK(last[5].n_spec_branches <= 4 * last[5].n_drafts);
    const EngineEvent& plain = last[4];
    CHECK(plain.n_drafts == 0);
    CHECK(plain.n_spec_branches == 0);
    CHECK(plain.n_draft_tokens_at[0] == 0);
    CHECK(plain.draft_s == 0);
    CHECK(plain.verify_s == 0);
}
