// The engine's per-step question to a speculating sequence's policy (sched/spec_policy.h): who is
// asked and when, what the figures say, an invalid answer decoding plainly, and greedy output equal
// to plain decoding whatever k the policy answers step by step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "model/synth.h"
#include "process_temp_dir.h"
#include "sched/engine.h"

using namespace steward;

namespace {

struct Models {
    std::unique_ptr<Model> target, draft;
};
// A target with scaled-down late layers and its 2-layer draft: drafts are accepted and rejected both.
const Models& models() {
    static steward_test::ProcessTempDir dir("steward_test_spec_policy_");
    static Models m = [] {
        SynthSpec s;
        s.n_embd = 64; s.n_layer = 4; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512; s.n_ctx = 512;
        s.seed = 8;
        s.late_scale = 0.2f;
        s.late_from = 2;
        const std::string t = (dir.path() / "target.gguf").string(), d = (dir.path() / "draft.gguf").string();
        REQUIRE(synth_write(s, t).ok());
        REQUIRE(synth_draft(t, 2, d).ok());
        Models out;
        out.target = std::move(Model::load(t).value());
        out.draft = std::move(Model::load(d).value());
        return out;
    }();
    return m;
}

// Answers script[n % size] at its n-th question and records what it was told.
struct ScriptedPolicy : DraftBudgetPolicy {
    std::vector<int32_t> script{0};
    bool fail = false;  // answer as a misbehaving plugin would (fallback)
    // The question's pointers (bucket, tenant, the acceptance arrays) live only during the call, as
    // the ABI says: what is read later is copied here.
    struct Asked {
        SpecSeqStats q;
        std::vector<double> accept, bucket_accept;
        std::string bucket;
    };
    std::vector<Asked> asked;
    int step = 0;                                     // set by the test before each engine step
    std::vector<std::pair<int, size_t>> batch_calls;  // (step, questions) of each draft_budgets call
    std::vector<int> asked_step;                      // the step of each question
    void draft_budgets(std::span<const SpecSeqStats> qs, std::span<int32_t> out, std::span<uint8_t> fallback) override {
        batch_calls.emplace_back(step, qs.size());
        for (size_t i = 0; i < qs.size(); i++) asked_step.push_back(step);
        DraftBudgetPolicy::draft_budgets(qs, out, fallback);
    }
    int32_t draft_budget_seq(const SpecSeqStats& q, bool* fallback) override {
        Asked a{q, std::vector<double>(q.accept_pos, q.accept_pos + q.n_accept_pos),
                std::vector<double>(q.bucket_accept_pos, q.bucket_accept_pos + q.n_bucket_accept_pos),
                q.bucket ? std::string(q.bucket) : std::string()};
        asked.push_back(a);
        *fallback = fail;
        return fail ? 0 : script[(asked.size() - 1) % script.size()];
    }
};

struct Run {
    std::map<uint64_t, std::vector<int32_t>> out;
    std::map<uint64_t, EngineEvent> last;
    EngineStats stats;
};

Run run(std::shared_ptr<DraftBudgetPolicy> policy, SpecSource source, int n_requests, int max_tokens) {
    EngineOptions o;
    o.n_blocks = 128;
    o.max_batch_tokens = 128;
    o.n_threads = 1;
    o.draft_model = models().draft.get();
    Engine e(*models().target, o);
    for (int i = 0; i < n_requests; i++) {
        EngineRequest r;
        r.id = (uint64_t)i + 1;
        r.bucket = "b";
        for (int j = 0; j < 10; j++) r.prompt.push_back(5 + (j * 31 + i * 97) % 500);
        r.max_tokens = max_tokens;
        r.stop_at_eos = false;
        if (policy) {
            r.spec.source = source;
            r.spec.k = 4;
            r.speculation = policy;
        }
        REQUIRE(e.submit(r).ok());
    }
    Run res;
    double t = 0;
    while (e.has_work())
        for (auto& ev : e.step(t += 0.001)) {
            for (int32_t tok : ev.tokens) res.out[ev.id].push_back(tok);
            res.last[ev.id] = ev;
        }
    res.stats = e.stats();
    CHECK(res.stats.kv.n_blocks_in_use == 0);
    return res;
}

}  // namespace

TEST_CASE("the engine asks a speculating sequence's policy once per decode step with two or more tokens left",
          "[sched][speculation]") {
    auto p = std::make_shared<ScriptedPolicy>();  // always 0: plain decoding
    const Run r = run(p, SpecSource::DRAFT, 1, 10);
    // Output tokens 2..9 are decode steps with >= 2 tokens left (token 1 comes with the prefill).
    REQUIRE(p->asked.size() == 8);
    for (size_t i = 0; i < p->asked.size(); i++) {
        const SpecSeqStats& q = p->asked[i].q;
        CHECK(q.request_id == 1);
        CHECK(p->asked[i].bucket == "b");
        CHECK(q.n_generated == (int)i + 1);
        CHECK(q.position == 10 + (int)i + 1);
        CHECK(q.max_tokens == 10);
        CHECK(q.max_budget == 4);
        CHECK(q.batch_size == 1);
        CHECK(q.draft_source == (int32_t)SpecSource::DRAFT);
        CHECK(q.n_steps == 0);
        CHECK(q.recent_acceptance == -1);
        for (double a : p->asked[i].accept) CHECK(a == -1);  // nothing observed
    }
    CHECK(r.stats.n_spec_asks == 8);
    CHECK(r.last.at(1).n_drafts == 0);
    CHECK(r.last.at(1).draft_s == 0);
    CHECK(r.last.at(1).verify_s == 0);
}

TEST_CASE("greedy output is the plain output whatever k the policy answers step by step, and the figures it is "
          "given follow the verifications",
          "[sched][speculation]") {
    const Run plain = run(nullptr, SpecSource::NONE, 3, 24);
    for (SpecSource src : {SpecSource::DRAFT, SpecSource::NGRAM}) {
        auto p = std::make_shared<ScriptedPolicy>();
        p->script = {3, 0, 1, 4, 2, 0, 4};
        const Run r = run(p, src, 3, 24);
        CHECK(r.out == plain.out);
        // The figures each question carries are what the sequence's verifications did so far.
        std::map<uint64_t, int32_t> last_answer;
        for (size_t i = 0; i < p->asked.size(); i++) {
            const SpecSeqStats& q = p->asked[i].q;
            CHECK(q.batch_size >= 1);
            CHECK(q.batch_size <= 3);
            CHECK(q.n_accepted <= q.n_proposed);
            CHECK(q.last_budget == last_answer[q.request_id]);
            last_answer[q.request_id] = p->script[i % p->script.size()];
            for (double a : p->asked[i].accept) CHECK((a == -1 || (a >= 0 && a <= 1)));
        }
        if (src == SpecSource::DRAFT) {
            for (const auto& [id, ev] : r.last) {
                CHECK(ev.n_drafts > 0);
                CHECK(ev.draft_s > 0);
                CHECK(ev.verify_s > 0);
            }
            // After verifications, position 0's acceptance is measured for the sequence and its bucket.
            CHECK(p->asked.back().accept[0] >= 0);
            CHECK(p->asked.back().bucket_accept[0] >= 0);
            CHECK(r.stats.draft_ms_per_token_model > 0);
            CHECK(r.stats.verify_ms > 0);
        }
        CHECK(r.stats.n_spec_fallbacks == 0);
    }
}

TEST_CASE("a policy that misbehaves is counted per sequence and its steps decode plainly, output intact",
          "[sched][speculation]") {
    const Run plain = run(nullptr, SpecSource::NONE, 2, 12);
    auto p = std::make_shared<ScriptedPolicy>();
    p->fail = true;
    const Run r = run(p, SpecSource::DRAFT, 2, 12);
    CHECK(r.out == plain.out);
    CHECK(r.stats.n_spec_fallbacks == (int64_t)p->asked.size());
    CHECK(r.stats.n_drafts == 0);
    for (const auto& [id, ev] : r.last) CHECK(ev.n_spec_fallbacks == 10);  // tokens 2..11 of 12
}

namespace {
// n requests of 2-token prompts decoding under a step budget of max_batch_tokens; the policy is
// told each step's number.
EngineStats run_budgeted(const std::shared_ptr<ScriptedPolicy>& p, int n, int max_batch_tokens, int max_tokens) {
    EngineOptions o;
    o.n_blocks = 128;
    o.max_batch_tokens = max_batch_tokens;
    o.n_threads = 1;
    o.draft_model = models().draft.get();
    Engine e(*models().target, o);
    for (int i = 0; i < n; i++) {
        EngineRequest r;
        r.id = (uint64_t)i + 1;
        r.prompt = {5 + i, 40 + 3 * i};
        r.max_tokens = max_tokens;
        r.stop_at_eos = false;
        r.spec.source = SpecSource::DRAFT;
        r.spec.k = 4;
        r.speculation = p;
        REQUIRE(e.submit(r).ok());
    }
    double t = 0;
    while (e.has_work()) {
        p->step++;
        e.step(t += 0.001);
    }
    return e.stats();
}
}  // namespace

TEST_CASE("a step's questions go to the policy in one call while the step's tokens cover every answer", "[sched][speculation]") {
    auto p = std::make_shared<ScriptedPolicy>();
    p->script = {4};
    run_budgeted(p, 6, 128, 12);  // 6 decode tokens + at most 6 x 4 drafts: far under 128
    REQUIRE_FALSE(p->batch_calls.empty());
    std::map<int, int> calls_per_step;
    for (const auto& [step, n] : p->batch_calls) calls_per_step[step]++;
    for (const auto& [step, calls] : calls_per_step) CHECK(calls == 1);
    // The first decode step asks all six at once.
    CHECK(p->batch_calls.front().second == 6);
}

TEST_CASE("under a tight step budget a sequence is asked only while tokens are left after the drafts before it, as "
          "when asked one by one",
          "[sched][speculation]") {
    // 6 sequences decoding one token each under a 12-token budget leave 6 for drafts. One by one:
    // answers of 4 grant 4 then 2 and nobody else is asked; answers of 1 grant 1 each and all six
    // are asked. Worked out per step from the batch size the policy was told (left = 12 - batch).
    for (int answer : {4, 1}) {
        auto p = std::make_shared<ScriptedPolicy>();
        p->script = {answer};
        run_budgeted(p, 6, 12, 10);
        REQUIRE_FALSE(p->asked.empty());
        std::map<int, int> asked_in_step, batch_of_step;
        for (size_t i = 0; i < p->asked.size(); i++) {
            asked_in_step[p->asked_step[i]]++;
            batch_of_step[p->asked_step[i]] = p->asked[i].q.batch_size;
        }
        bool saw_full = false;
        for (const auto& [step, n] : asked_in_step) {
            const int left = 12 - batch_of_step[step];  // every planned sequence decodes one token
            const int most = (left + answer - 1) / answer;  // asked until the tokens left are spent
            CHECK(n <= most);
            if (batch_of_step[step] == 6 && !saw_full) {  // the first decode step: all six can draft
                saw_full = true;
                CHECK(n == std::min(6, most));
            }
        }
        CHECK(saw_full);
    }
}
