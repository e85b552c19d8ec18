// TokenBatcher (sched/token_batcher.h) against a plain record of what the engine produced: random
// steps over tracked and untracked runs (one or several tokens an event, logprobs and top
// alternatives, ends at random) deliver every run's tokens once, in order, each with its own
// logprob, alternatives and step time; a tracked run's first tokens and its end go in their own
// step, nothing is held past the limits, and untracked runs pass untouched.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "sched/token_batcher.h"

using namespace steward;

namespace {

float logprob_of(int32_t tok) { return -0.001f * (float)tok; }
std::vector<TokenLogprob> top_of(int32_t tok) { return {{tok, logprob_of(tok)}, {tok + 1, -9.0f}}; }

struct Made {  // what the engine produced for one run: per token, the step time
    std::vector<int32_t> tokens;
    std::vector<double> t;
    bool ended = false;
    double t_end = -1;
    double t_first = -1;
};
struct Got {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<TokenLogprob>> top;
    std::vector<double> t;          // token_t_s as delivered
    std::vector<double> delivered;  // the step each token came out in
    int n_events = 0;
    bool ended = false;
    double t_end = -1;
    double t_first_delivered = -1;
    bool after_end = false;
};

}  // namespace

TEST_CASE("batched runs get every token once, in order, with its own logprob and step time, within the limits",
          "[token_batcher]") {
    for (uint64_t seed = 1; seed <= 40; seed++) {
        std::mt19937_64 rng(seed);
        TokenBatcher::Limits lim;
        lim.max_tokens = 1 + (int)(rng() % 8);
        lim.max_age_s = 0.004 + 0.001 * (double)(rng() % 20);
        TokenBatcher b(lim);
        const int n_runs = 6;
        std::set<uint64_t> tracked;
        for (uint64_t id = 1; id <= n_runs; id++)
            if (rng() % 3) b.add(id), tracked.insert(id);
        std::map<uint64_t, Made> made;
        std::map<uint64_t, Got> got;
        int32_t next_tok = 100;
        double t = 10.0;
        const double max_gap = 0.003;
        for (int step = 0; step < 120; step++) {
            t += 0.0005 + max_gap * (double)(rng() % 1000) / 1000.0 * 0.8;
            std::vector<EngineEvent> events;
            for (uint64_t id = 1; id <= n_runs; id++) {
                Made& m = made[id];
                if (m.ended || rng() % 4 == 0) continue;  // not in this step
                EngineEvent e;
                e.id = id;
                const int k = (int)(rng() % 4 == 0 ? rng() % 3 : 1);  // 0, 1 or 2 tokens (speculation)
                for (int i = 0; i < k; i++) {
                    e.tokens.push_back(next_tok);
                    e.logprobs.push_back(logprob_of(next_tok));
                    e.top_logprobs.push_back(top_of(next_tok));
                    m.tokens.push_back(next_tok++);
                    m.t.push_back(t);
                    if (m.t_first < 0) m.t_first = t;
                }
                if (step > 10 && rng() % 25 == 0) {
                    e.finished = true;
                    e.finish = FinishReason::LENGTH;
                    e.n_prompt_tokens = (int32_t)id;
                    m.ended = true;
                    m.t_end = t;
                }
                e.t_s = t;
                events.push_back(std::move(e));
            }
            const std::vector<EngineEvent> in = events;
            b.apply(events, t);
            for (const EngineEvent& e : events) {
                Got& g = got[e.id];
                if (g.ended) g.after_end = true;
                g.n_events++;
                if (!tracked.count(e.id)) {
                    // Untracked: the very event that went in, this step, without token times.
                    bool found = false;
                    for (const EngineEvent& x : in)
                        if (x.id == e.id && x.tokens == e.tokens && x.finished == e.finished) found = true;
                    CHECK(found);
                    CHECK(e.token_t_s.empty());
                } else {
                    REQUIRE(e.token_t_s.size() == e.tokens.size());
                    REQUIRE(e.logprobs.size() == e.tokens.size());
                    REQUIRE(e.top_logprobs.size() == e.tokens.size());
                    // Held back: at most the limit's tokens before this step's own (up to 2).
                    if (!e.finished) CHECK((int)e.tokens.size() <= lim.max_tokens - 1 + 2);
                }
                for (size_t i = 0; i < e.tokens.size(); i++) {
                    g.tokens.push_back(e.tokens[i]);
                    g.logprobs.push_back(e.logprobs[i]);
                    g.top.push_back(e.top_logprobs[i]);
                    g.t.push_back(e.token_t_s.empty() ? t : e.token_t_s[i]);
                    g.delivered.push_back(t);
                    if (g.t_first_delivered < 0) g.t_first_delivered = t;
                }
                if (e.finished) {
                    g.ended = true;
                    g.t_end = t;
                    CHECK(e.n_prompt_tokens == (int32_t)e.id);  // the end's own figures
                }
            }
        }
        for (uint64_t id = 1; id <= n_runs; id++) {
            INFO("seed " << seed << " run " << id << (tracked.count(id) ? " (tracked)" : ""));
            const Made& m = made[id];
            const Got& g = got[id];
            CHECK_FALSE(g.after_end);
            CHECK(g.ended == m.ended);
            if (m.ended) CHECK(g.t_end == m.t_end);  // the end goes in its own step
            if (!m.ended) {
                // Still running: its delivered tokens are a prefix of what it made.
                REQUIRE(g.tokens.size() <= m.tokens.size());
                CHECK(std::equal(g.tokens.begin(), g.tokens.end(), m.tokens.begin()));
            } else {
                CHECK(g.tokens == m.tokens);
            }
            for (size_t i = 0; i < g.tokens.size(); i++) {
                CHECK(g.logprobs[i] == logprob_of(g.tokens[i]));
                const std::vector<TokenLogprob> want = top_of(g.tokens[i]);
                REQUIRE(g.top[i].size() == want.size());
                for (size_t j = 0; j < want.size(); j++)
                    CHECK((g.top[i][j].id == want[j].id && g.top[i][j].logprob == want[j].logprob));
                CHECK(g.t[i] == m.t[i]);  // the step that made it
                if (tracked.count(id)) CHECK(g.delivered[i] - m.t[i] < lim.max_age_s + max_gap);
            }
            if (m.t_first >= 0 && !g.tokens.empty()) CHECK(g.t_first_delivered == m.t_first);  // TTFT not delayed
        }
    }
}

TEST_CASE("a batched run of one token a step costs one message per max_tokens tokens", "[token_batcher]") {
    TokenBatcher::Limits lim;
    lim.max_tokens = 16;
    lim.max_age_s = 1.0;  // the count decides here
    TokenBatcher b(lim);
    b.add(5);
    int n_messages = 0, n_tokens = 0;
    for (int step = 0; step < 160; step++) {
        std::vector<EngineEvent> ev(1);
        ev[0].id = 5;
        ev[0].tokens = {step};
        ev[0].finished = step == 159;
        b.apply(ev, 1.0 + step * 0.001);
        n_messages += (int)ev.size();
        for (const EngineEvent& e : ev) n_tokens += (int)e.tokens.size();
    }
    CHECK(n_tokens == 160);
    // Token 0 alone, 9 full batches of 16 (tokens 1-144), then the end with tokens 145-159.
    CHECK(n_messages == 11);
    CHECK(b.n_tracked() == 0);  // the end forgot it
}
