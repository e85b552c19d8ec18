// The request core without actors: a fake vocabulary and routing policy, events in, actions out.
// Cascade pass and fail, shadow agreement against an independent common prefix, cancel before the
// route, exactly one finish for every order of events (randomised), cost against the prices.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "request/request_fsm.h"

using namespace steward;

namespace {

struct FakeVocab : RequestVocab {
    std::map<int32_t, std::vector<int32_t>> prompts;  // a pool not listed: {1, 2, 3}
    std::vector<int32_t> prompt_ids(int32_t pool) override {
        auto it = prompts.find(pool);
        return it == prompts.end() ? std::vector<int32_t>{1, 2, 3} : it->second;
    }
    // Each id as "<id>"; flush gives "." so the finish's flush is visible.
    struct Decoder : TextDecoder {
        std::string push(int32_t id) override { return "<" + std::to_string(id) + ">"; }
        std::string flush() override { return "."; }
    };
    std::unique_ptr<TextDecoder> text_decoder(int32_t) override { return std::make_unique<Decoder>(); }
};

struct FakeRouting : RequestRouting {
    bool upgrade = false;
    int n_calls = 0;
    std::vector<int32_t> seen;
    bool seen_finished = false;
    bool check_upgrade(const std::vector<int32_t>& tokens, const std::vector<float>&, bool finished, bool*) override {
        n_calls++;
        seen = tokens;
        seen_finished = finished;
        return upgrade;
    }
};

RequestSetup setup() {
    RequestSetup s;
    s.id = 7;
    s.tenant = "t";
    s.max_tokens = 16;
    s.arrival_s = 100.0;
    s.pools = {{"cheap", 64, PoolPrice{0.1, 0.05, 0.3}}, {"strong", 64, PoolPrice{0.5, 0.25, 1.5}}};
    return s;
}

RouteDecision cascade(int check_after) {
    RouteDecision r;
    r.bucket = "qa";
    r.pool = 0;
    r.upgrade_pool = 1;
    r.check_after_tokens = check_after;
    r.generation = 3;
    return r;
}

template <typename T>
std::vector<T> all_of(const RequestActions& a) {
    std::vector<T> v;
    for (const RequestAction& x : a)
        if (auto* p = std::get_if<T>(&x)) v.push_back(*p);
    return v;
}

std::vector<int32_t> streamed_ids(const RequestActions& a) {
    std::vector<int32_t> v;
    for (const StreamText& s : all_of<StreamText>(a)) v.insert(v.end(), s.ids.begin(), s.ids.end());
    return v;
}

void append(RequestActions& to, RequestActions&& from) {
    for (auto& a : from) to.push_back(std::move(a));
}

EngineEvent end_with(FinishReason r, int n_prompt, int n_cached, double t) {
    EngineEvent e;
    e.finish = r;
    e.n_prompt_tokens = n_prompt;
    e.n_cached_prompt_tokens = n_cached;
    e.first_scheduled_s = 100.1;
    e.t_s = t;
    return e;
}

// Cost in the pricing's own terms: computed prompt, cached prompt and output tokens per million.
double priced(const PoolPrice& p, int n_prompt, int n_cached, int n_output) {
    return ((n_prompt - n_cached) * p.prompt_per_mtok + n_cached * p.cached_prompt_per_mtok + n_output * p.output_per_mtok) / 1e6;
}

}  // namespace

TEST_CASE("a cascade that passes holds the first tokens until the check, then streams them from the cheap pool",
          "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestFsm fsm(setup(), vocab, routing);
    RequestActions out = fsm.on_route(cascade(3), 100.0);
    REQUIRE(all_of<SubmitRun>(out).size() == 1);
    const SubmitRun s = all_of<SubmitRun>(out)[0];
    CHECK(s.role == RunRole::PRIMARY);
    CHECK(s.pool == 0);
    CHECK(s.run.id == run_engine_id(7, RunRole::PRIMARY));
    CHECK(s.run.prompt == std::vector<int32_t>{1, 2, 3});
    CHECK(s.run.generation == 3);

    CHECK(all_of<StreamText>(fsm.on_tokens(RunRole::PRIMARY, {11}, {-0.1f}, 100.2)).empty());
    CHECK(all_of<StreamText>(fsm.on_tokens(RunRole::PRIMARY, {12}, {-0.1f}, 100.3)).empty());
    CHECK(routing.n_calls == 0);
    out = fsm.on_tokens(RunRole::PRIMARY, {13}, {-0.1f}, 100.4);
    CHECK(routing.n_calls == 1);
    CHECK(routing.seen == std::vector<int32_t>{11, 12, 13});
    CHECK_FALSE(routing.seen_finished);
    CHECK(streamed_ids(out) == std::vector<int32_t>{11, 12, 13});
    CHECK(all_of<StreamText>(out)[0].piece == "<11><12><13>");
    CHECK(streamed_ids(fsm.on_tokens(RunRole::PRIMARY, {14}, {-0.1f}, 100.5)) == std::vector<int32_t>{14});
    out = fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::STOP, 3, 0, 100.6), 100.6);
    REQUIRE(all_of<FinishRequest>(out).size() == 1);
    const FinishRequest f = all_of<FinishRequest>(out)[0];
    CHECK(f.result.tokens == std::vector<int32_t>{11, 12, 13, 14});
    CHECK(f.result.text == "<11><12><13><14>.");
    CHECK(f.result.pool == "cheap");
    CHECK_FALSE(f.result.upgraded);
    CHECK(f.record.prior_pools.empty());
    // The held tokens reached the caller at the check: TTFT is then, not at their generation.
    CHECK(f.result.metrics.ttft_ms == Approx(400.0));
    CHECK(routing.n_calls == 1);
    CHECK(all_of<RequestDone>(out).size() == 1);
    CHECK(fsm.done());
}

TEST_CASE("a cascade that fails cancels the cheap run, charges its work in prior_pools and answers from the upgrade run",
          "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    routing.upgrade = true;
    RequestFsm fsm(setup(), vocab, routing);
    fsm.on_route(cascade(2), 100.0);
    fsm.on_tokens(RunRole::PRIMARY, {11}, {}, 100.1);
    RequestActions out = fsm.on_tokens(RunRole::PRIMARY, {12}, {}, 100.2);
    CHECK(all_of<StreamText>(out).empty());  // the cheap tokens never reach the caller
    REQUIRE(all_of<CancelRun>(out).size() == 1);
    CHECK(all_of<CancelRun>(out)[0].engine_id == run_engine_id(7, RunRole::PRIMARY));
    REQUIRE(all_of<SubmitRun>(out).size() == 1);
    CHECK(all_of<SubmitRun>(out)[0].role == RunRole::UPGRADE);
    CHECK(all_of<SubmitRun>(out)[0].pool == 1);
    // A token in flight from the cancelled run, then its end (cancelled, with its prompt work).
    CHECK(all_of<StreamText>(fsm.on_tokens(RunRole::PRIMARY, {13}, {}, 100.25)).empty());
    CHECK(all_of<FinishRequest>(fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::CANCELLED, 10, 4, 100.3), 100.3)).empty());
    out = fsm.on_tokens(RunRole::UPGRADE, {21, 22}, {}, 100.4);
    CHECK(streamed_ids(out) == std::vector<int32_t>{21, 22});
    fsm.on_tokens(RunRole::UPGRADE, {23}, {}, 100.5);
    out = fsm.on_run_end(RunRole::UPGRADE, end_with(FinishReason::LENGTH, 10, 0, 100.6), 100.6);
    REQUIRE(all_of<FinishRequest>(out).size() == 1);
    const FinishRequest f = all_of<FinishRequest>(out)[0];
    CHECK(f.result.tokens == std::vector<int32_t>{21, 22, 23});
    CHECK(f.result.pool == "strong");
    CHECK(f.result.upgraded);
    CHECK(f.result.finish == FinishReason::LENGTH);
    REQUIRE(f.record.prior_pools.size() == 1);
    CHECK(f.record.prior_pools[0].pool == "cheap");
    CHECK(f.record.prior_pools[0].n_prompt_tokens == 10);
    CHECK(f.record.prior_pools[0].n_cached_prompt_tokens == 4);
    CHECK(f.record.prior_pools[0].n_output_tokens == 2);  // what it had made when it was judged
    const double cost = priced({0.5, 0.25, 1.5}, 10, 0, 3) + priced({0.1, 0.05, 0.3}, 10, 4, 2);
    CHECK(f.result.metrics.cost == Approx(cost));
    CHECK(fsm.done());
}

TEST_CASE("a request's cost equals an independent computation from its pool's prices", "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestFsm fsm(setup(), vocab, routing);
    RouteDecision r;
    r.pool = 1;
    fsm.on_route(r, 100.0);
    for (int i = 0; i < 5; i++) fsm.on_tokens(RunRole::PRIMARY, {30 + i}, {}, 100.1 + i * 0.01);
    RequestActions out = fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::STOP, 40, 32, 100.2), 100.2);
    const FinishRequest f = all_of<FinishRequest>(out).at(0);
    CHECK(f.result.metrics.cost == Approx(priced({0.5, 0.25, 1.5}, 40, 32, 5)));
    CHECK(f.record.n_cached_prompt_tokens == 32);
    CHECK(f.record.itl_s.size() == 4);
    CHECK(f.result.metrics.tpot_ms == Approx(10.0));
}

TEST_CASE("the shadow's agreement is the common prefix over the longer output, and the shadow never streams",
          "[request_fsm]") {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 50; trial++) {
        FakeVocab vocab;
        FakeRouting routing;
        RequestFsm fsm(setup(), vocab, routing);
        RouteDecision r;
        r.bucket = "qa";
        r.pool = 0;
        r.shadow_pool = 1;
        RequestActions out = fsm.on_route(r, 100.0);
        REQUIRE(all_of<SubmitRun>(out).size() == 2);
        CHECK(all_of<SubmitRun>(out)[1].role == RunRole::SHADOW);
        CHECK(all_of<SubmitRun>(out)[1].run.session.empty());
        // Two outputs over a 3-token alphabet, so they often share a prefix.
        std::vector<int32_t> a(1 + rng() % 8), s(1 + rng() % 8);
        for (auto& x : a) x = 1 + (int32_t)(rng() % 3);
        for (auto& x : s) x = 1 + (int32_t)(rng() % 3);
        RequestActions all;
        for (int32_t x : s) append(all, fsm.on_tokens(RunRole::SHADOW, {x}, {}, 100.1));
        for (int32_t x : a) append(all, fsm.on_tokens(RunRole::PRIMARY, {x}, {}, 100.1));
        const bool shadow_first = trial % 2;
        if (shadow_first) append(all, fsm.on_run_end(RunRole::SHADOW, end_with(FinishReason::STOP, 3, 0, 100.2), 100.2));
        append(all, fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::STOP, 3, 0, 100.3), 100.3));
        if (!shadow_first) {
            CHECK(all_of<RecordQuality>(all).empty());  // not before the shadow ended
            append(all, fsm.on_run_end(RunRole::SHADOW, end_with(FinishReason::STOP, 3, 0, 100.4), 100.4));
        }
        CHECK(streamed_ids(all) == a);
        const size_t common = (size_t)(std::mismatch(a.begin(), a.end(), s.begin(), s.end()).first - a.begin());
        REQUIRE(all_of<RecordQuality>(all).size() == 1);
        const RecordQuality q = all_of<RecordQuality>(all)[0];
        CHECK(q.bucket == "qa");
        CHECK(q.pool == "cheap");
        CHECK(q.agreement == Approx((double)common / (double)std::max(a.size(), s.size())));
        CHECK(q.exact == (a == s));
        CHECK(all_of<RequestDone>(all).size() == 1);
    }
}

TEST_CASE("a cancel before the route finishes the request as cancelled without submitting a run", "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestFsm fsm(setup(), vocab, routing);
    CHECK(fsm.on_cancel().empty());
    const RequestActions out = fsm.on_route(cascade(2), 100.5);
    CHECK(all_of<SubmitRun>(out).empty());
    REQUIRE(all_of<FinishRequest>(out).size() == 1);
    CHECK(all_of<FinishRequest>(out)[0].result.finish == FinishReason::CANCELLED);
    CHECK(all_of<FinishRequest>(out)[0].record.bucket == "qa");
    CHECK(all_of<FinishRequest>(out)[0].result.metrics.cost == 0);
    CHECK(std::holds_alternative<RequestDone>(out.back()));
    CHECK(fsm.on_cancel().empty());
}

TEST_CASE("a prompt that cannot be encoded fails its run with a clear error, the shadow still runs", "[request_fsm]") {
    FakeVocab vocab;
    vocab.prompts[0] = {};
    FakeRouting routing;
    RequestFsm fsm(setup(), vocab, routing);
    RouteDecision r;
    r.shadow_pool = 1;
    RequestActions out = fsm.on_route(r, 100.0);
    REQUIRE(all_of<SubmitRun>(out).size() == 1);
    CHECK(all_of<SubmitRun>(out)[0].role == RunRole::SHADOW);
    REQUIRE(all_of<FinishRequest>(out).size() == 1);
    CHECK(all_of<FinishRequest>(out)[0].result.finish == FinishReason::ERROR);
    CHECK(all_of<FinishRequest>(out)[0].result.error.find("empty prompt") != std::string::npos);
    CHECK(all_of<RequestDone>(out).empty());  // the shadow is still running
    out = fsm.on_run_end(RunRole::SHADOW, end_with(FinishReason::STOP, 3, 0, 100.1), 100.1);
    CHECK(all_of<RecordQuality>(out).empty());  // nothing to compare with a failed answer
    CHECK(all_of<RequestDone>(out).size() == 1);
}

TEST_CASE("a prompt that fills its pool's context fails there, naming both lengths, with its length in the result",
          "[request_fsm]") {
    FakeVocab vocab;
    vocab.prompts[1] = {1, 2, 3, 4};  // the strong pool's own prompt is longer (another rendering)
    FakeRouting routing;
    RequestSetup st = setup();
    st.pools[0].n_ctx = 4;
    st.pools[1].n_ctx = 4;
    st.max_tokens = 1;
    {
        RequestFsm fsm(st, vocab, routing);
        RouteDecision r;
        r.pool = 0;  // 3 tokens + max_tokens 1 <= 4: runs
        const RequestActions out = fsm.on_route(r, 100.0);
        REQUIRE(all_of<SubmitRun>(out).size() == 1);
        CHECK(all_of<FinishRequest>(out).empty());
    }
    {
        RequestSetup two = st;
        two.max_tokens = 2;  // 3 + 2 > 4: refused, naming the three numbers and the fix
        RequestFsm fsm(two, vocab, routing);
        RouteDecision r;
        r.pool = 0;
        const RequestActions out = fsm.on_route(r, 100.0);
        CHECK(all_of<SubmitRun>(out).empty());
        REQUIRE(all_of<FinishRequest>(out).size() == 1);
        CHECK(all_of<FinishRequest>(out)[0].result.error ==
              "the prompt (3 tokens) and max_tokens (2) together exceed the context of 4 tokens of pool 'cheap': lower max_tokens "
              "to at most 1 or shorten the prompt");
    }
    {
        RequestSetup rest = st;
        rest.max_tokens = -1;  // the rest of the context: 4 - 3
        RequestFsm fsm(rest, vocab, routing);
        RouteDecision r;
        r.pool = 0;
        const RequestActions out = fsm.on_route(r, 100.0);
        REQUIRE(all_of<SubmitRun>(out).size() == 1);
        CHECK(all_of<SubmitRun>(out)[0].run.max_tokens == 1);
    }
    RequestFsm fsm(st, vocab, routing);
    RouteDecision r;
    r.pool = 1;  // 4 tokens >= 4: refused before any run
    const RequestActions out = fsm.on_route(r, 100.0);
    CHECK(all_of<SubmitRun>(out).empty());
    REQUIRE(all_of<FinishRequest>(out).size() == 1);
    const GenerationResult g = all_of<FinishRequest>(out)[0].result;
    CHECK(g.finish == FinishReason::ERROR);
    CHECK(g.error == "the prompt is 4 tokens, over the context of 4 tokens of pool 'strong': shorten it");
    CHECK(g.pool == "strong");
    CHECK(g.metrics.prompt_tokens == 4);
    CHECK(all_of<RequestDone>(out).size() == 1);
}

TEST_CASE("streamed text names the answer run's pool", "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestFsm fsm(setup(), vocab, routing);
    RouteDecision r;
    r.pool = 1;
    fsm.on_route(r, 100.0);
    const RequestActions out = fsm.on_tokens(RunRole::PRIMARY, {11}, {-0.1f}, 100.1);
    REQUIRE(all_of<StreamText>(out).size() == 1);
    CHECK(all_of<StreamText>(out)[0].pool == 1);
    const RequestActions end = fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::STOP, 3, 0, 100.2), 100.2);
    for (const StreamText& t : all_of<StreamText>(end)) CHECK(t.pool == 1);  // the decoder's flush
}

TEST_CASE("a request finishes exactly once and is done last, whatever the order of its events", "[request_fsm]") {
    std::mt19937 rng(2024);
    for (int trial = 0; trial < 2000; trial++) {
        FakeVocab vocab;
        FakeRouting routing;
        routing.upgrade = rng() % 2;
        RequestFsm fsm(setup(), vocab, routing);
        RouteDecision route;
        route.pool = 0;
        if (rng() % 2) route = cascade(1 + (int)(rng() % 3));
        if (rng() % 2) route.shadow_pool = 1;
        const bool route_fails = rng() % 10 == 0;

        // A fake engine: each submitted run makes up to n tokens (ids 100 * role + k), then ends;
        // a cancelled run ends "cancelled" at a time of the engine's choosing.
        struct EngineRun {
            int n_left = 0, k = 0;
            bool cancelled = false, ended = false;
        };
        std::map<RunRole, EngineRun> runs;
        RequestActions log;
        bool routed = false, caller_cancelled = false;
        int n_finish = 0, n_done = 0;
        size_t done_at = 0;
        auto take = [&](RequestActions&& a) {
            for (auto& x : a) {
                if (auto* s = std::get_if<SubmitRun>(&x)) runs[s->role] = EngineRun{1 + (int)(rng() % 6)};
                if (auto* c = std::get_if<CancelRun>(&x)) runs[c->role].cancelled = true;
                if (std::holds_alternative<FinishRequest>(x)) n_finish++;
                if (std::holds_alternative<RequestDone>(x)) {
                    n_done++;
                    done_at = log.size() + 1;
                }
                log.push_back(std::move(x));
            }
        };
        for (int step = 0; step < 200; step++) {
            std::vector<RunRole> live;
            for (auto& [role, r] : runs)
                if (!r.ended) live.push_back(role);
            const int pick = (int)(rng() % 10);
            if (!routed && (pick < 3 || live.empty())) {
                routed = true;
                take(route_fails ? fsm.on_route_failed("no router", 100.0) : fsm.on_route(route, 100.0));
            } else if (pick == 3 && !caller_cancelled) {
                caller_cancelled = true;
                take(fsm.on_cancel());
            } else if (pick == 4 && !runs.empty()) {
                // A second end of a run that already ended (ignored), or one more token of a live run.
                auto it = std::next(runs.begin(), (long)(rng() % runs.size()));
                if (it->second.ended) take(fsm.on_run_end(it->first, end_with(FinishReason::STOP, 3, 0, 100.5), 100.5));
                else take(fsm.on_tokens(it->first, {100 * (int32_t)it->first + it->second.k++}, {}, 100.5));
            } else if (!live.empty()) {
                const RunRole role = live[rng() % live.size()];
                EngineRun& r = runs[role];
                if (r.n_left > 0 && !r.cancelled) {
                    r.n_left--;
                    take(fsm.on_tokens(role, {100 * (int32_t)role + r.k++}, {}, 100.1));
                } else {
                    r.ended = true;
                    take(fsm.on_run_end(role, end_with(r.cancelled ? FinishReason::CANCELLED : FinishReason::STOP, 3, 0, 100.2),
                                        100.2));
                }
            } else if (routed) {
                break;
            }
        }
        INFO("trial " << trial);
        REQUIRE(routed);
        for (auto& [role, r] : runs) CHECK(r.ended);
        CHECK(n_finish == 1);
        CHECK(n_done == 1);
        CHECK(done_at == log.size());  // nothing after RequestDone
        CHECK(fsm.done());
        // The caller saw exactly the answer's tokens, as the result says, and never a shadow's.
        const std::vector<int32_t> ids = streamed_ids(log);
        const FinishRequest f = all_of<FinishRequest>(log).at(0);
        CHECK(ids == f.result.tokens);
        CHECK(std::none_of(ids.begin(), ids.end(), [](int32_t x) { return x >= 200 && x < 300; }));
        CHECK((int64_t)f.result.tokens.size() == f.record.n_output_tokens);
        CHECK(f.result.upgraded == !f.record.prior_pools.empty());
        CHECK(f.result.metrics.cost == Approx(request_cost(f.record, [] {
                                           MetricsConfig m;
                                           m.prices["cheap"] = {0.1, 0.05, 0.3};
                                           m.prices["strong"] = {0.5, 0.25, 1.5};
                                           return m;
                                       }())));
        // Every cancel names a submitted run.
        for (const CancelRun& c : all_of<CancelRun>(log)) CHECK(runs.count(c.role) == 1);
    }
}

TEST_CASE("end-to-end latency is never below TTFT, even when the executor's finish stamp predates the last token's receipt",
          "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestFsm fsm(setup(), vocab, routing);
    RouteDecision r;
    r.pool = 0;
    fsm.on_route(r, 100.0);
    fsm.on_tokens(RunRole::PRIMARY, {30}, {}, 100.50);  // the actor stamps the first token at 100.50 s
    // The executor stamped its finish at 100.40 s, before the actor received that token.
    RequestActions out = fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::LENGTH, 3, 0, 100.40), 100.55);
    const FinishRequest f = all_of<FinishRequest>(out).at(0);
    CHECK(f.result.metrics.ttft_ms == Approx(500.0));
    CHECK(f.result.metrics.e2e_ms == Approx(550.0));
    CHECK(f.record.t_finish_s >= *f.record.t_first_token_s);
}

TEST_CASE("the deadline timer finishes a routed request TIMEOUT at once, cancels its run, and is done when the run ends",
          "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestSetup s = setup();
    s.deadline_s = 100.5;
    RequestFsm fsm(s, vocab, routing);
    RouteDecision r;
    r.bucket = "qa";
    r.pool = 1;
    REQUIRE(all_of<SubmitRun>(fsm.on_route(r, 100.0)).size() == 1);
    RequestActions out = fsm.on_deadline(100.6);
    REQUIRE(all_of<CancelRun>(out).size() == 1);
    CHECK(all_of<CancelRun>(out)[0].pool == 1);
    REQUIRE(all_of<FinishRequest>(out).size() == 1);
    const GenerationResult g = all_of<FinishRequest>(out)[0].result;
    CHECK(g.finish == FinishReason::TIMEOUT);
    INFO(g.error);
    CHECK(g.error.find("timed out after 500 ms (limits.request_timeout_ms)") != std::string::npos);
    CHECK(all_of<RequestDone>(out).empty());  // the run is still in the engine
    CHECK(fsm.finished());
    // The stuck run's late end neither answers again nor streams: it only completes the request.
    out = fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::CANCELLED, 3, 0, 100.7), 100.7);
    CHECK(all_of<FinishRequest>(out).empty());
    REQUIRE(out.size() >= 1);
    CHECK(std::holds_alternative<RequestDone>(out.back()));
    CHECK(fsm.on_deadline(100.8).empty());
}

TEST_CASE("the deadline timer finishes a request still being routed, and a late route starts no run", "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestSetup s = setup();
    s.deadline_s = 101.0;
    RequestFsm fsm(s, vocab, routing);
    RequestActions out = fsm.on_deadline(101.1);
    CHECK(all_of<CancelRun>(out).empty());
    REQUIRE(all_of<FinishRequest>(out).size() == 1);
    CHECK(all_of<FinishRequest>(out)[0].result.finish == FinishReason::TIMEOUT);
    CHECK(all_of<FinishRequest>(out)[0].result.error.find("while it was being routed") != std::string::npos);
    CHECK(std::holds_alternative<RequestDone>(out.back()));
    CHECK(fsm.on_route(cascade(2), 101.2).empty());
}

TEST_CASE("the deadline timer does nothing to a request already answered", "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestSetup s = setup();
    s.deadline_s = 101.0;
    RequestFsm fsm(s, vocab, routing);
    RouteDecision r;
    fsm.on_route(r, 100.0);
    const RequestActions out = fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::STOP, 3, 0, 100.2), 100.2);
    REQUIRE(all_of<FinishRequest>(out).size() == 1);
    CHECK(fsm.on_deadline(101.1).empty());
}

TEST_CASE("the record carries the answering run's speculation figures per draft position", "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestFsm fsm(setup(), vocab, routing);
    RouteDecision r;
    r.pool = 1;
    fsm.on_route(r, 100.0);
    fsm.on_tokens(RunRole::PRIMARY, {30, 31, 32}, {}, 100.1);
    EngineEvent e = end_with(FinishReason::STOP, 4, 0, 100.2);
    e.n_drafts = 2;
    e.n_draft_tokens = 5;
    e.n_accepted_tokens = 3;
    e.n_rollbacks = 1;
    e.n_draft_tokens_at = {2, 2, 1};
    e.n_accepted_at = {2, 1, 0};
    e.draft_s = 0.01;
    e.verify_s = 0.04;
    const FinishRequest f = all_of<FinishRequest>(fsm.on_run_end(RunRole::PRIMARY, e, 100.2)).at(0);
    CHECK(f.record.n_drafts == 2);
    CHECK(f.record.n_draft_tokens == 5);
    CHECK(f.record.n_accepted_tokens == 3);
    CHECK(f.record.n_rollbacks == 1);
    CHECK(f.record.n_draft_tokens_at[1] == 2);
    CHECK(f.record.n_draft_tokens_at[2] == 1);
    CHECK(f.record.n_draft_tokens_at[3] == 0);
    CHECK(f.record.n_accepted_at[0] == 2);
    CHECK(f.record.n_accepted_at[1] == 1);
    CHECK(f.record.draft_s == Approx(0.01));
    CHECK(f.record.verify_s == Approx(0.04));
}

TEST_CASE("a run lost with its worker goes on on the retry pool from its prompt and the tokens streamed", "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestFsm core(setup(), vocab, routing);
    RouteDecision r;
    r.bucket = "qa";
    r.pool = 0;
    RequestActions a = core.on_route(r, 100.0);
    REQUIRE(all_of<SubmitRun>(a).size() == 1);
    RequestActions streamed;
    append(streamed, core.on_tokens(RunRole::PRIMARY, {40, 41, 42}, {-1, -1, -1}, 100.2));
    EngineEvent lost;
    lost.finish = FinishReason::ERROR;
    lost.error = "the worker h:1 of pool 'cheap' was lost";
    RequestActions b = core.on_run_lost(RunRole::PRIMARY, lost, 1, 100.3);
    const auto subs = all_of<SubmitRun>(b);
    REQUIRE(subs.size() == 1);
    CHECK(subs[0].pool == 1);
    CHECK(subs[0].run.prompt == std::vector<int32_t>{1, 2, 3, 40, 41, 42});  // prompt, then what was produced
    CHECK(subs[0].run.max_tokens == 16 - 3);
    CHECK(subs[0].run.id == run_engine_id(7, RunRole::PRIMARY));
    CHECK(all_of<FinishRequest>(b).empty());
    // The new run's tokens follow on; nothing is streamed twice.
    append(streamed, core.on_tokens(RunRole::PRIMARY, {43, 44}, {-1, -1}, 100.4));
    RequestActions c = core.on_run_end(RunRole::PRIMARY, end_with(FinishReason::LENGTH, 6 + 0, 0, 100.5), 100.5);
    append(streamed, RequestActions(c));
    CHECK(streamed_ids(streamed) == std::vector<int32_t>{40, 41, 42, 43, 44});
    const auto fin = all_of<FinishRequest>(c);
    REQUIRE(fin.size() == 1);
    CHECK(fin[0].result.finish == FinishReason::LENGTH);
    CHECK(fin[0].result.tokens == std::vector<int32_t>{40, 41, 42, 43, 44});
    CHECK(fin[0].result.metrics.prompt_tokens == 3);  // the carried tokens are output, not prompt
    CHECK(fin[0].result.pool == "strong");
}

TEST_CASE("a lost run without a retry pool, or a lost shadow, ends with the loss's error, once", "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RequestFsm core(setup(), vocab, routing);
    RouteDecision r;
    r.bucket = "qa";
    r.pool = 0;
    r.shadow_pool = 1;
    core.on_route(r, 100.0);
    EngineEvent lost;
    lost.finish = FinishReason::ERROR;
    lost.error = "the worker h:2 of pool 'strong' was lost";
    RequestActions s = core.on_run_lost(RunRole::SHADOW, lost, 0, 100.1);  // a shadow is never retried
    CHECK(all_of<SubmitRun>(s).empty());
    CHECK(all_of<FinishRequest>(s).empty());
    lost.error = "the worker h:1 of pool 'cheap' was lost; no other pool";
    RequestActions p = core.on_run_lost(RunRole::PRIMARY, lost, -1, 100.2);
    const auto fin = all_of<FinishRequest>(p);
    REQUIRE(fin.size() == 1);
    CHECK(fin[0].result.finish == FinishReason::ERROR);
    CHECK(fin[0].result.error == lost.error);
    CHECK(all_of<RequestDone>(p).size() == 1);
    CHECK(core.on_run_lost(RunRole::PRIMARY, lost, 1, 100.3).empty());  // over: nothing more
}

TEST_CASE("a run nobody reads token by token is submitted batched, and its tokens keep the times they were made",
          "[request_fsm]") {
    FakeVocab vocab;
    FakeRouting routing;
    RouteDecision plain;
    plain.pool = 0;
    auto submitted = [&](RequestSetup s, const RouteDecision& r) {
        RequestFsm fsm(std::move(s), vocab, routing);
        return all_of<SubmitRun>(fsm.on_route(r, 100.0)).at(0).run.batch_tokens;
    };
    RequestSetup s = setup();
    s.watched = false;
    CHECK(submitted(s, plain));
    CHECK_FALSE(submitted(setup(), plain));  // a token callback: every step
    RequestSetup with_stop = s;
    with_stop.stop = {"\n"};
    CHECK_FALSE(submitted(with_stop, plain));  // stop strings are matched as tokens come
    CHECK_FALSE(submitted(s, cascade(3)));     // the cascade checks the first tokens

    // Merged events: four tokens made at 100.2, 100.3, 100.35 and 100.5, received at 100.51 and later.
    RequestFsm fsm(s, vocab, routing);
    fsm.on_route(plain, 100.0);
    fsm.on_tokens(RunRole::PRIMARY, {11}, {}, 100.21, {}, {100.2});
    fsm.on_tokens(RunRole::PRIMARY, {12, 13, 14}, {}, 100.51, {}, {100.3, 100.35, 100.5});
    const FinishRequest f =
        all_of<FinishRequest>(fsm.on_run_end(RunRole::PRIMARY, end_with(FinishReason::LENGTH, 3, 0, 100.5), 100.52)).at(0);
    CHECK(f.result.tokens == std::vector<int32_t>{11, 12, 13, 14});
    CHECK(f.result.metrics.ttft_ms == Approx(200.0));
    CHECK(f.result.metrics.tpot_ms == Approx((100.5 - 100.2) * 1e3 / 3));
    REQUIRE(f.record.itl_s.size() == 3);
    CHECK(f.record.itl_s[0] == Approx(0.1));
    CHECK(f.record.itl_s[1] == Approx(0.05));
    CHECK(f.record.itl_s[2] == Approx(0.15));
}
