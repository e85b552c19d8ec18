// Suffix decoding (see suffix.h).
#include "spec/suffix.h"

#include <algorithm>
#include <cstring>

namespace steward {

uint64_t SuffixCorpus::window_hash(const int32_t* tokens, int32_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

SuffixCorpus::SuffixCorpus(SuffixLimits limits, int32_t min_match) : limits_(limits), min_match_(std::max(min_match, 1)) {}

void SuffixCorpus::evict_oldest(Entry& e) {
    n_tokens_ -= (int64_t)e.texts.back().tokens.size();
    e.n_tokens -= (int64_t)e.texts.back().tokens.size();
    e.texts.pop_back();
    n_evicted_++;
}

void SuffixCorpus::add(const SuffixKey& key, std::span<const int32_t> output) {
    if (limits_.max_text > 0 && output.size() > (size_t)limits_.max_text) output = output.last((size_t)limits_.max_text);
    const int32_t n = (int32_t)output.size();
    if (n < min_match_ + 1 || limits_.tokens_per_key <= 0 || limits_.tokens_total <= 0) return;
    Entry& e = keys_[key];
    e.used = ++clock_;
    Text t;
    t.window = min_match_;
    t.tokens.assign(output.begin(), output.end());
    for (int32_t p = min_match_; p < n; p++) t.at[window_hash(t.tokens.data() + p - min_match_, min_match_)].push_back(p);
    e.texts.push_front(std::move(t));
    e.n_tokens += n;
    n_tokens_ += n;
    while (e.n_tokens > limits_.tokens_per_key && !e.texts.empty()) evict_oldest(e);
    // The global cap: the oldest outputs of the least recently used keys go first.
    while (n_tokens_ > limits_.tokens_total) {
        auto lru = keys_.end();
        for (auto it = keys_.begin(); it != keys_.end(); ++it)
            if (!it->second.texts.empty() && (lru == keys_.end() || it->second.used < lru->second.used)) lru = it;
        if (lru == keys_.end()) break;
        evict_oldest(lru->second);
    }
    for (auto it = keys_.begin(); it != keys_.end();) it = it->second.texts.empty() ? keys_.erase(it) : std::next(it);
}

void SuffixCorpus::drop_tenant(int32_t tenant) {
    for (auto it = keys_.begin(); it != keys_.end();) {
        if (it->first.tenant != tenant) {
            ++it;
            continue;
        }
        n_tokens_ -= it->second.n_tokens;
        it = keys_.erase(it);
    }
}

const std::deque<SuffixCorpus::Text>* SuffixCorpus::texts(const SuffixKey& key) {
    auto it = keys_.find(key);
    if (it == keys_.end() || it->second.texts.empty()) return nullptr;
    it->second.used = ++clock_;
    return &it->second.texts;
}

int64_t SuffixCorpus::n_tokens(const SuffixKey& key) const {
    auto it = keys_.find(key);
    return it == keys_.end() ? 0 : it->second.n_tokens;
}

std::string SuffixCorpus::check_invariants() const {
    int64_t total = 0;
    for (const auto& [key, e] : keys_) {
        if (e.texts.empty()) return "a key without texts is kept";
        int64_t n = 0;
        for (const Text& t : e.texts) {
            n += (int64_t)t.tokens.size();
            if (limits_.max_text > 0 && t.tokens.size() > (size_t)limits_.max_text) return "a text over max_text";
            size_t n_pos = 0;
            for (const auto& [h, ps] : t.at) {
                n_pos += ps.size();
                for (int32_t p : ps)
                    if (p < min_match_ || p >= (int32_t)t.tokens.size() || window_hash(t.tokens.data() + p - min_match_, min_match_) != h)
                        return "an index position out of its text or under another window";
            }
            if (n_pos != t.tokens.size() - (size_t)min_match_) return "an index missing positions";
        }
        if (n != e.n_tokens) return "a key's token count differs from its texts'";
        if (n > limits_.tokens_per_key) return "a key over tokens_per_key";
        total += n;
    }
    if (total != n_tokens_) return "the total token count differs from the keys'";
    if (total > limits_.tokens_total) return "the corpus over tokens_total";
    return "";
}

namespace {

struct Occurrence {
    const int32_t* t;
    int32_t n;  // tokens of its text
    int32_t p;  // the position after the match: the first token that follows it
};

// The occurrences of the context's longest matching tail (at least min_match, compared up to
// max_match): the context's own first (latest position first), then each text of the corpus, newest
// first; at most max_occurrences. *best: the match length (0: none).
std::vector<Occurrence> find_occurrences(std::span<const int32_t> context, const std::deque<SuffixCorpus::Text>* corpus,
                                         const SuffixParams& params, int32_t* best_out) {
    std::vector<Occurrence> occ;
    *best_out = 0;
    const int32_t len = (int32_t)context.size();
    const int32_t m = std::max(params.min_match, 1);
    if (params.k <= 0 || len < m || params.max_occurrences <= 0) return occ;
    const int32_t* ctx = context.data();
    const int32_t* tail = ctx + (len - m);
    int32_t best = 0;
    auto consider = [&](const int32_t* t, int32_t n, int32_t p) {
        // t[p - m, p) equals the tail's last m tokens; extend the match backwards.
        const int32_t lim = std::min({std::max(params.max_match, m), p, len});
        int32_t l = m;
        while (l < lim && t[p - l - 1] == ctx[len - l - 1]) ++l;
        if (l > best) {
            best = l;
            occ.clear();
        }
        if (l == best && (int32_t)occ.size() < params.max_occurrences) occ.push_back({t, n, p});
    };
    // The context itself, latest position first (p < len: a token follows, and it is not the tail).
    for (int32_t p = len - 1; p >= m; --p)
        if (std::memcmp(ctx + p - m, tail, (size_t)m * sizeof(int32_t)) == 0) consider(ctx, len, p);
    // The tenant and bucket's outputs, newest first, each through its window index.
    if (corpus) {
        const uint64_t h = SuffixCorpus::window_hash(tail, m);
        for (const SuffixCorpus::Text& text : *corpus) {
            const int32_t* t = text.tokens.data();
            const int32_t n = (int32_t)text.tokens.size();
            if (text.window != m) {  // indexed for another window: scanned
                for (int32_t p = n - 1; p >= m; --p)
                    if (std::memcmp(t + p - m, tail, (size_t)m * sizeof(int32_t)) == 0) consider(t, n, p);
                continue;
            }
            auto it = text.at.find(h);
            if (it == text.at.end()) continue;
            for (auto p = it->second.rbegin(); p != it->second.rend(); ++p)
                if (std::memcmp(t + *p - m, tail, (size_t)m * sizeof(int32_t)) == 0) consider(t, n, *p);
        }
    }
    *best_out = best;
    return occ;
}

// The occurrences with a token at offset j after their match, grouped by that token in order of
// first occurrence (each group keeps the occurrences' order); *total: how many have one.
std::vector<std::pair<int32_t, std::vector<Occurrence>>> next_tokens(const std::vector<Occurrence>& occ, int32_t j,
                                                                     int32_t* total) {
    std::vector<std::pair<int32_t, std::vector<Occurrence>>> groups;
    *total = 0;
    for (const Occurrence& o : occ) {
        if (o.p + j >= o.n) continue;
        const int32_t tok = o.t[o.p + j];
        ++*total;
        auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == tok; });
        if (g == groups.end()) groups.push_back({tok, {o}});
        else g->second.push_back(o);
    }
    return groups;
}

}  // namespace

SuffixDraft suffix_propose(std::span<const int32_t> context, const std::deque<SuffixCorpus::Text>* corpus,
                           const SuffixParams& params) {
    SuffixDraft d;
    d.prob = 1.0;
    int32_t best = 0;
    std::vector<Occurrence> occ = find_occurrences(context, corpus, params, &best);
    if (occ.empty()) return d;
    d.match_len = best;
    d.n_occurrences = (int32_t)occ.size();
    for (int32_t j = 0; j < params.k; j++) {
        int32_t total = 0;
        auto groups = next_tokens(occ, j, &total);
        if (total == 0) break;
        auto top = groups.begin();  // the most frequent (ties: the first found)
        for (auto g = groups.begin(); g != groups.end(); ++g)
            if (g->second.size() > top->second.size()) top = g;
        const double prob = d.prob * (double)top->second.size() / (double)total;
        if (prob < params.min_prob) break;
        d.prob = prob;
        d.tokens.push_back(top->first);
        occ = std::move(top->second);
    }
    return d;
}

SuffixTree suffix_propose_tree(std::span<const int32_t> context, const std::deque<SuffixCorpus::Text>* corpus,
                               const SuffixParams& params, int32_t max_depth) {
    SuffixTree tree;
    int32_t best = 0;
    std::vector<Occurrence> root = find_occurrences(context, corpus, params, &best);
    if (root.empty() || max_depth <= 0) return tree;
    tree.match_len = best;
    tree.n_occurrences = (int32_t)root.size();
    // A candidate child: its parent node, token, depth, probability, the occurrences that continue
    // with it, and the order it was found in (ties).
    struct Candidate {
        double prob;
        int64_t order;
        int32_t parent, token, depth;
        std::vector<Occurrence> occ;
    };
    std::vector<Candidate> open;
    int64_t found = 0;
    // The children of a node (depth d, its occurrences and probability): one candidate per distinct
    // next token, most frequent first (ties: the most recent occurrence's token first).
    auto expand = [&](int32_t node, int32_t depth, double prob, const std::vector<Occurrence>& occ) {
        if (depth >= max_depth) return;
        int32_t total = 0;
        auto groups = next_tokens(occ, depth, &total);
        std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
        for (auto& [tok, g] : groups) {
            const double p = prob * (double)g.size() / (double)total;
            if (p < params.min_prob) continue;
            open.push_back({p, found++, node, tok, depth + 1, std::move(g)});
        }
    };
    expand(0, 0, 1.0, root);
    while ((int32_t)tree.tokens.size() < params.k && !open.empty()) {
        auto top = std::min_element(open.begin(), open.end(), [](const Candidate& a, const Candidate& b) {
            return a.prob > b.prob || (a.prob == b.prob && a.order < b.order);
        });
        Candidate c = std::move(*top);
        open.erase(top);
        tree.tokens.push_back(c.token);
        tree.parents.push_back(c.parent);
        tree.probs.push_back(c.prob);
        expand((int32_t)tree.tokens.size(), c.depth, c.prob, c.occ);
    }
    return tree;
}

}  // namespace steward
