// Prefix-miss diagnosis (prefix_diagnosis.h). Per scope, a trie of the earlier prompts' tokens gives
// each prompt's longest shared prefix and one earlier prompt that has it; at the departure, a search
// for the first point where the two agree again (within max_skip tokens on either side, for at least
// min_resync tokens) tells volatile text (they agree again: a timestamp, an id, then the same text)
// from content that simply differs (a new question).
#include "report/prefix_diagnosis.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>

namespace steward {

namespace {

struct Trie {
    struct Node {
        std::unordered_map<int32_t, int> next;
        int prompt = -1;  // the first prompt through this node
    };
    std::vector<Node> nodes{1};

    // Longest prefix of ids already in the trie: its length and a prompt that has it (-1: none).
    std::pair<int, int> match(const std::vector<int32_t>& ids, int n) const {
        int at = 0, len = 0;
        for (; len < n; len++) {
            auto it = nodes[at].next.find(ids[len]);
            if (it == nodes[at].next.end()) break;
            at = it->second;
        }
        return {len, len > 0 ? nodes[at].prompt : nodes[0].prompt};
    }
    void insert(const std::vector<int32_t>& ids, int n, int prompt) {
        int at = 0;
        if (nodes[0].prompt < 0) nodes[0].prompt = prompt;
        for (int i = 0; i < n; i++) {
            auto it = nodes[at].next.find(ids[i]);
            if (it == nodes[at].next.end()) {
                nodes.push_back({});
                nodes.back().prompt = prompt;
                it = nodes[at].next.emplace(ids[i], (int)nodes.size() - 1).first;
            }
            at = it->second;
        }
    }
};

struct Resync {
    int skip_a = 0;  // volatile tokens in the new prompt: [p, p + skip_a)
    int skip_b = 0;  // ... and in the earlier one: [p, p + skip_b)
    int run = 0;     // tokens that agree again after them
};

// The first (smallest skip in the new prompt a, then in b) point after a[pa] / b[pb] (where they
// differ) at which a and b agree again for at least min_resync tokens; run 0 when there is none.
Resync find_resync(const std::vector<int32_t>& a, int na, const std::vector<int32_t>& b, int nb, int pa,
                   const PrefixDiagnosisOptions& o, int pb) {
    for (int da = 0; da <= o.max_skip && pa + da + o.min_resync <= na; da++)
        for (int db = 0; db <= o.max_skip && pb + db + o.min_resync <= nb; db++) {
            if ((da == 0 && db == 0) || std::min(da, db) > o.max_both) continue;  // where they differ; content
            int run = 0;
            while (pa + da + run < na && pb + db + run < nb && a[pa + da + run] == b[pb + db + run]) run++;
            if (run >= o.min_resync) return {da, db, run};
        }
    return {};
}

int range_of(int pos) {
    if (pos < 16) return 0;
    if (pos < 64) return 1;
    if (pos < 256) return 2;
    if (pos < 1024) return 3;
    return 4;
}

struct SpotAcc {
    int count = 0;
    int64_t lost = 0;
    std::string example;
    std::map<std::string, int> tokens;
};

}  // namespace

const std::vector<std::string>& prefix_position_ranges() {
    static const std::vector<std::string> r{"0-15", "16-63", "64-255", "256-1023", "1024+", "whole"};
    return r;
}

std::vector<BucketPrefixDiagnosis> diagnose_prefix_misses(const std::vector<DiagnosisPrompt>& prompts,
                                                          const DiagnosisDetok& detok,
                                                          const PrefixDiagnosisOptions& opt) {
    std::vector<BucketPrefixDiagnosis> out;
    std::map<std::string, size_t> index;            // bucket -> out
    std::map<std::string, Trie> tries;              // scope -> earlier prompts
    std::vector<std::map<int, SpotAcc>> spots;      // per out entry: position -> accumulated
    std::vector<int64_t> shared_sum;
    std::vector<int> shared_n;
    const size_t n_prompts = std::min(prompts.size(), (size_t)std::max(0, opt.max_prompts));
    for (size_t i = 0; i < n_prompts; i++) {
        const DiagnosisPrompt& pr = prompts[i];
        auto [bit, fresh] = index.try_emplace(pr.bucket, out.size());
        if (fresh) {
            out.emplace_back();
            out.back().bucket = pr.bucket;
            spots.emplace_back();
            shared_sum.push_back(0);
            shared_n.push_back(0);
        }
        const size_t bi = bit->second;
        BucketPrefixDiagnosis& d = out[bi];
        d.n_prompts++;
        const int n = std::min((int)pr.ids.size(), std::max(0, opt.max_tokens));
        Trie& trie = tries[pr.scope];
        const auto [len, other] = trie.match(pr.ids, n);
        if (other < 0) {
            d.n_first++;
        } else {
            shared_sum[bi] += len;
            shared_n[bi]++;
            if (len >= n) {
                d.position_hist[5]++;
            } else {
                d.position_hist[range_of(len)]++;
                const DiagnosisPrompt& earlier = prompts[(size_t)other];
                const int nb = std::min((int)earlier.ids.size(), std::max(0, opt.max_tokens));
                // Chain: after a resync the two may part again (an id, then a timestamp on the same
                // line); each further resync adds its agreeing run, and the volatile text is every
                // skipped span from the first departure to the last resync.
                int pa = len, pb = len;
                int64_t lost = 0;
                std::vector<int32_t> span;  // the skipped tokens (the new prompt's, else the earlier one's)
                int end_a = len;            // the example runs from len to here in the new prompt
                for (int hops = 0; hops < 16 && pa < n && pb < nb; hops++) {
                    const Resync r = find_resync(pr.ids, n, earlier.ids, nb, pa, opt, pb);
                    if (r.run == 0) break;
                    if (r.skip_a > 0) span.insert(span.end(), pr.ids.begin() + pa, pr.ids.begin() + pa + r.skip_a);
                    else span.insert(span.end(), earlier.ids.begin() + pb, earlier.ids.begin() + pb + r.skip_b);
                    end_a = pa + r.skip_a;
                    lost += r.run;
                    pa += r.skip_a + r.run;
                    pb += r.skip_b + r.run;
                }
                if (lost > 0) {
                    d.n_volatile++;
                    d.tokens_lost += lost;
                    SpotAcc& s = spots[bi][len];
                    s.count++;
                    s.lost += lost;
                    if (s.example.empty() && detok)
                        s.example = detok(pr.scope, end_a > len ? std::vector<int32_t>(pr.ids.begin() + len, pr.ids.begin() + end_a)
                                                                : span);
                    if (detok)
                        for (int32_t id : span) s.tokens[detok(pr.scope, {id})]++;
                }
            }
        }
        trie.insert(pr.ids, n, (int)i);
    }
    for (size_t bi = 0; bi < out.size(); bi++) {
        BucketPrefixDiagnosis& d = out[bi];
        d.mean_shared = shared_n[bi] > 0 ? (double)shared_sum[bi] / shared_n[bi] : 0.0;
        // Departures a few tokens apart are one volatile line (matched against a prompt with the
        // line, a prompt departs inside it; against one without, where it starts): clusters of
        // positions within kCluster tokens of the cluster's first, reported at that first position.
        constexpr int kCluster = 16;
        std::vector<std::pair<int, SpotAcc>> clusters;
        for (auto& [pos, acc] : spots[bi]) {
            if (clusters.empty() || pos - clusters.back().first > kCluster) {
                clusters.push_back({pos, std::move(acc)});
                continue;
            }
            SpotAcc& c = clusters.back().second;
            if (acc.count > c.count) c.example = acc.example;
            c.count += acc.count;
            c.lost += acc.lost;
            for (const auto& [tok, k] : acc.tokens) c.tokens[tok] += k;
        }
        for (auto& [pos, s] : clusters) {
            if (s.count < opt.min_group || s.count < opt.min_share * d.n_prompts) continue;
            VolatileSpot v;
            v.position = pos;
            v.count = s.count;
            v.tokens_lost = s.lost;
            v.example = s.example;
            v.top_tokens.assign(s.tokens.begin(), s.tokens.end());
            std::stable_sort(v.top_tokens.begin(), v.top_tokens.end(),
                             [](const auto& x, const auto& y) { return x.second > y.second; });
            if (v.top_tokens.size() > 5) v.top_tokens.resize(5);
            std::string ex = v.example.size() > 48 ? v.example.substr(0, 48) + "..." : v.example;
            for (char& c : ex)
                if (c == '\n' || c == '\r' || c == '\t') c = ' ';
            v.advice = "volatile text at token ~" + std::to_string(pos) + " of " + std::to_string(s.count) + " of " +
                       std::to_string(d.n_prompts) + " prompts in bucket " + d.bucket + " (e.g. \"" + ex +
                       "\"); the ~" + std::to_string(s.lost / s.count) +
                       " tokens after it match an earlier prompt again but are not cached: move it after the shared part";
            d.spots.push_back(std::move(v));
        }
        std::stable_sort(d.spots.begin(), d.spots.end(),
                         [](const VolatileSpot& x, const VolatileSpot& y) { return x.tokens_lost > y.tokens_lost; });
    }
    return out;
}

nlohmann::json prefix_diagnosis_json(const std::vector<BucketPrefixDiagnosis>& d) {
    nlohmann::json out = nlohmann::json::array();
    for (const BucketPrefixDiagnosis& b : d) {
        nlohmann::json hist = nlohmann::json::object();
        for (size_t i = 0; i < b.position_hist.size(); i++) hist[prefix_position_ranges()[i]] = b.position_hist[i];
        nlohmann::json spots = nlohmann::json::array();
        for (const VolatileSpot& v : b.spots) {
            nlohmann::json top = nlohmann::json::array();
            for (const auto& [text, n] : v.top_tokens) top.push_back({{"token", text}, {"count", n}});
            spots.push_back({{"position", v.position}, {"prompts", v.count}, {"tokens_lost", v.tokens_lost},
                             {"example", v.example}, {"top_tokens", top}, {"advice", v.advice}});
        }
        out.push_back({{"bucket", b.bucket}, {"prompts", b.n_prompts}, {"first_in_scope", b.n_first},
                       {"mean_shared_tokens", b.mean_shared}, {"departure_positions", hist},
                       {"volatile_prompts", b.n_volatile}, {"volatile_tokens_lost", b.tokens_lost}, {"spots", spots}});
    }
    return out;
}

std::string prefix_diagnosis_table(const std::vector<BucketPrefixDiagnosis>& d) {
    std::string t;
    char line[256];
    std::snprintf(line, sizeof line, "%-12s %7s %5s %6s", "bucket", "prompts", "first", "shared");
    t += line;
    for (const std::string& r : prefix_position_ranges()) {
        std::snprintf(line, sizeof line, " %8s", r.c_str());
        t += line;
    }
    std::snprintf(line, sizeof line, " %8s %11s\n", "volatile", "tokens_lost");
    t += line;
    std::vector<std::string> advice;
    for (const BucketPrefixDiagnosis& b : d) {
        std::snprintf(line, sizeof line, "%-12s %7d %5d %6.0f", b.bucket.c_str(), b.n_prompts, b.n_first, b.mean_shared);
        t += line;
        for (int n : b.position_hist) {
            std::snprintf(line, sizeof line, " %8d", n);
            t += line;
        }
        std::snprintf(line, sizeof line, " %8d %11lld\n", b.n_volatile, (long long)b.tokens_lost);
        t += line;
        for (const VolatileSpot& v : b.spots) advice.push_back(v.advice);
    }
    for (const std::string& a : advice) t += "advice: " + a + "\n";
    if (advice.empty()) t += "advice: none (no volatile text breaks a shared prefix in enough prompts to report)\n";
    return t;
}

}  // namespace steward
