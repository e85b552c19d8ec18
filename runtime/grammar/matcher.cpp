// The pushdown automaton over code points fed with bytes (GrammarMatcher), the vocabulary's byte
// trie (TokenVocabulary) and the token masks walked over it with a per-state cache (TokenMasker).
#include <algorithm>
#include <array>
#include <deque>
#include <cstring>

#include "grammar/grammar.h"
#include "model/tokenizer.h"
#include "util/utf8.h"

namespace steward {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
    // The start state: every alternative of the root rule expanded down to its first character.
    work_.clear();
    work_left_ = k_max_expand_work;
    for (uint32_t s : grammar_->alternatives(grammar_->root())) expand(s, state_);
    if (overflowed_) state_.clear();
}

GrammarMatcher GrammarMatcher::fork() const {
    return GrammarMatcher(grammar_, state_);
}

// Appends the stack work_ + [top] (top == UINT32_MAX: the empty, accepting stack) unless present.
void GrammarMatcher::emit(uint32_t top, StackSet& out) const {
    const size_t len = top == UINT32_MAX ? 0 : work_.size() + 1;
    for (size_t i = 0; i + 1 < out.offs.size(); ++i) {
        const uint32_t b = out.offs[i], e = out.offs[i + 1];
        if (e - b != len) continue;
        if (len == 0) return;
        if (out.data[e - 1] == top && std::equal(work_.begin(), work_.end(), out.data.begin() + b)) return;
    }
    if (len) {
        out.data.insert(out.data.end(), work_.begin(), work_.end());
        out.data.push_back(top);
    }
    out.offs.push_back((uint32_t)out.data.size());
}

// Expands grammar position `pos` (under the continuation stack work_) until every resulting stack
// has a CHARS element on top. Left recursion is rejected at compile time, so this terminates.
void GrammarMatcher::expand(uint32_t pos, StackSet& out) const {
    if (overflowed_) return;
    if (work_left_ == 0 || depth_ >= k_max_expand_depth) {
        overflowed_ = true;
        return;
    }
    work_left_--;
    struct Depth {
        uint32_t& d;
        explicit Depth(uint32_t& d) : d(++d) {}
        ~Depth() { d--; }
    } depth(depth_);
    const auto& el = grammar_->elements();
    const GrammarElement g = el[pos];
    switch (g.op) {
        case GrammarOp::CHARS: emit(pos, out); return;
        case GrammarOp::ALT_END:
        case GrammarOp::RULE_END: {
            if (work_.empty()) {
                emit(UINT32_MAX, out);
                return;
            }
            const uint32_t cont = work_.back();
            work_.pop_back();
            expand(cont, out);
            work_.push_back(cont);
            return;
        }
        case GrammarOp::RULE: {
            // Tail call: nothing follows the reference in this alternative, so the rule returns
            // straight to our own continuation (keeps x* and right recursion from growing stacks).
            const bool push = el[pos + 1].op != GrammarOp::ALT_END;
            if (push) work_.push_back(pos + 1);
            for (uint32_t s : grammar_->alternatives(g.value)) expand(s, out);
            if (push) work_.pop_back();
            return;
        }
    }
}

bool GrammarMatcher::advance_cp(const StackSet& in, uint32_t cp, StackSet& out) const {
    out.clear();
    work_left_ = k_max_expand_work;
    overflowed_ = false;
    const auto& el = grammar_->elements();
    const auto& cls = grammar_->char_classes();
    for (size_t i = 0; i + 1 < in.offs.size(); ++i) {
        const uint32_t b = in.offs[i], e = in.offs[i + 1];
        if (b == e) continue;
        const uint32_t top = in.data[e - 1];
        if (cp != UINT32_MAX && !cls[el[top].value].contains(cp)) continue;
        work_.assign(in.data.begin() + b, in.data.begin() + e - 1);
        expand(top + 1, out);
    }
    if (overflowed_) {  // refused: the step's expansion is past its bound
        out.clear();
        return false;
    }
    return !out.empty();
}

bool GrammarMatcher::advance_byte(const StackSet& in, uint8_t byte, StackSet& out) const {
    uint32_t v;
    uint8_t left, len;
    if (in.n_partial_left == 0) {
        const int n = utf8::sequence_length(byte);
        if (n == 1) return advance_cp(in, byte, out);
        if (n == 0) {  // no well-formed character starts with this byte
            out.clear();
            return false;
        }
        len = (uint8_t)n;
        v = utf8::lead_bits(byte, n);
        left = len - 1;
    } else {
        if (!utf8::is_continuation(byte)) {
            out.clear();
            return false;
        }
        if (in.partial_any) {
            if (in.n_partial_left == 1) return advance_cp(in, UINT32_MAX, out);
            out = in;
            --out.n_partial_left;
            return true;
        }
        v = (in.partial_cp << 6) | (byte & 0x3F);
        len = in.partial_len;
        left = in.n_partial_left - 1;
    }
    const uint32_t min_cp = utf8::min_code_point(len);
    if (left == 0) {
        if (v < min_cp || !utf8::is_scalar_value(v)) {  // overlong, past U+10FFFF or a surrogate
            out.clear();
            return false;
        }
        return advance_cp(in, v, out);
    }
    // Inside a character: keep the stacks whose class meets some code point with this prefix.
    const uint32_t ulo = v << (6 * left), uhi = ulo | ((1u << (6 * left)) - 1);
    const uint32_t lo = std::max(ulo, min_cp), hi = std::min(uhi, utf8::k_max_code_point);
    out.clear();
    if (lo > hi) return false;
    bool any = ulo == lo && uhi == hi && (hi < utf8::k_first_surrogate || lo > utf8::k_last_surrogate);
    const auto& el = grammar_->elements();
    const auto& cls = grammar_->char_classes();
    for (size_t i = 0; i + 1 < in.offs.size(); ++i) {
        const uint32_t b = in.offs[i], e = in.offs[i + 1];
        if (b == e) continue;
        const CharClass& c = cls[el[in.data[e - 1]].value];
        if (!c.intersects(lo, hi)) continue;
        any = any && c.contains_all(lo, hi);
        out.data.insert(out.data.end(), in.data.begin() + b, in.data.begin() + e);
        out.offs.push_back((uint32_t)out.data.size());
    }
    if (out.empty()) return false;
    out.partial_any = any;
    out.partial_cp = any ? 0 : v;
    out.n_partial_left = left;
    out.partial_len = len;
    return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
    StackSet cur = state_, next;
    for (char c : bytes) {
        if (!advance_byte(cur, (uint8_t)c, next)) return false;
        std::swap(cur, next);
    }
    history_.push_back(std::move(state_));
    state_ = std::move(cur);
    return true;
}

bool GrammarMatcher::can_accept_bytes(std::string_view bytes) const {
    StackSet cur = state_, next;
    for (char c : bytes) {
        if (!advance_byte(cur, (uint8_t)c, next)) return false;
        std::swap(cur, next);
    }
    return true;
}

void GrammarMatcher::rollback(size_t n) {
    n = std::min(n, history_.size());
    if (n == 0) return;
    state_ = std::move(history_[history_.size() - n]);
    history_.resize(history_.size() - n);
}

bool GrammarMatcher::is_accepting() const {
    if (state_.n_partial_left) return false;
    for (size_t i = 0; i + 1 < state_.offs.size(); ++i)
        if (state_.offs[i] == state_.offs[i + 1]) return true;
    return false;
}

std::string state_key(const StackSet& s) {
    std::vector<std::pair<uint32_t, uint32_t>> stacks;
    for (size_t i = 0; i + 1 < s.offs.size(); ++i) stacks.push_back({s.offs[i], s.offs[i + 1]});
    auto less = [&](auto a, auto b) {
        return std::lexicographical_compare(s.data.begin() + a.first, s.data.begin() + a.second,
                                            s.data.begin() + b.first, s.data.begin() + b.second);
    };
    if (!std::is_sorted(stacks.begin(), stacks.end(), less)) std::sort(stacks.begin(), stacks.end(), less);
    std::string key;
    key.reserve(8 + 4 * (s.data.size() + stacks.size()));
    auto put = [&](uint32_t v) { key.append(reinterpret_cast<const char*>(&v), 4); };
    put(s.partial_cp);
    put(uint32_t(s.n_partial_left) | uint32_t(s.partial_len) << 8 | uint32_t(s.partial_any) << 16);
    for (auto [b, e] : stacks) {
        put(e - b);
        for (uint32_t i = b; i < e; ++i) put(s.data[i]);
    }
    return key;
}

// ---- vocabulary

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eog_ids)
    : bytes_(std::move(token_bytes)), eog_ids_(std::move(eog_ids)) {
    std::sort(eog_ids_.begin(), eog_ids_.end());
    eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
    std::vector<int32_t> order;
    for (int32_t id = 0; id < n_vocab(); ++id)
        if (!bytes_[id].empty() && !is_eog(id)) order.push_back(id);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
    // Pre-order insertion of the sorted strings: a string's prefixes come before it, so each
    // node's tokens are appended while it is the deepest node of the current path.
    std::vector<uint32_t> path;  // node index per depth - 1
    const std::string* prev = nullptr;
    for (int32_t id : order) {
        const std::string& s = bytes_[id];
        max_len_ = std::max(max_len_, s.size());
        size_t common = 0;
        if (prev)
            while (common < s.size() && common < prev->size() && common < path.size() && (*prev)[common] == s[common])
                ++common;
        while (path.size() > common) {
            trie_[path.back()].subtree_end = (uint32_t)trie_.size();
            path.pop_back();
        }
        for (size_t d = common; d < s.size(); ++d) {
            path.push_back((uint32_t)trie_.size());
            const auto t = (uint32_t)trie_tokens_.size();
            trie_.push_back({(uint8_t)s[d], (uint32_t)(d + 1), 0, t, t});
        }
        trie_tokens_.push_back(id);
        trie_[path.back()].tokens_end = (uint32_t)trie_tokens_.size();
        prev = &s;
    }
    while (!path.empty()) {
        trie_[path.back()].subtree_end = (uint32_t)trie_.size();
        path.pop_back();
    }
}

bool TokenVocabulary::is_eog(int32_t id) const { return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id); }

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tok) {
    std::vector<std::string> bytes((size_t)tok.n_vocab());
    std::vector<int32_t> eog;
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
        bytes[id] = tok.token_to_bytes(id);
        if (tok.is_eog(id)) eog.push_back(id);
    }
    return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(eog));
}

// ---- masks

TokenMasker::TokenMasker(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocab,
                         size_t max_cached)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), max_cached_(max_cached) {
    const auto& cls = grammar_->char_classes();
    std::vector<std::vector<bool>> sig(128, std::vector<bool>(cls.size()));
    for (uint32_t b = 0; b < 128; ++b) {
        for (size_t c = 0; c < cls.size(); ++c) sig[b][c] = cls[c].contains(b);
        ascii_rep_[b] = (uint8_t)b;
        for (uint32_t a = 0; a < b; ++a)
            if (sig[a] == sig[b]) {
                ascii_rep_[b] = (uint8_t)a;
                break;
            }
    }
}

MaskResult TokenMasker::walk(const GrammarMatcher& m, std::span<uint64_t> mask) const {
    MaskResult r;
    std::fill(mask.begin(), mask.begin() + (long)n_words(), 0);
    const auto& trie = vocab_->trie();
    const auto& toks = vocab_->trie_tokens();
    // The states this walk reaches, interned, with their byte transitions filled in lazily: many
    // trie nodes share a state (inside a string, every character leads back to the same one), so
    // most nodes cost one table lookup instead of an automaton step.
    std::deque<StackSet> states;
    std::unordered_map<std::string, int32_t> ids;
    std::vector<std::array<int32_t, 256>> trans;  // -1: not computed yet, -2: rejected
    auto intern = [&](const StackSet& st) {
        auto [it, fresh] = ids.emplace(state_key(st), (int32_t)states.size());
        if (fresh) {
            states.push_back(st);
            trans.emplace_back();
            trans.back().fill(-1);
        }
        return it->second;
    };
    std::vector<int32_t> level(vocab_->max_token_len() + 1);  // level[d]: state after d bytes of the path
    level[0] = intern(m.state());
    StackSet next;
    for (size_t i = 0; i < trie.size();) {
        const auto& node = trie[i];
        const int32_t from = level[node.depth - 1];
        int32_t to = trans[from][node.byte];
        if (to == -1) {
            const uint8_t rep =
                node.byte < 0x80 && states[from].n_partial_left == 0 ? ascii_rep_[node.byte] : node.byte;
            to = trans[from][rep];
            if (to == -1) {
                to = m.advance_byte(states[from], rep, next) ? intern(next) : -2;
                trans[from][rep] = to;
            }
            trans[from][node.byte] = to;
        }
        if (to == -2) {
            i = node.subtree_end;  // no token under this prefix can be accepted
            continue;
        }
        level[node.depth] = to;
        for (uint32_t t = node.tokens_begin; t < node.tokens_end; ++t) {
            const int32_t id = toks[t];
            mask[(size_t)id >> 6] |= uint64_t(1) << (id & 63);
            ++r.n_allowed;
        }
        ++i;
    }
    if (m.is_accepting()) {
        r.eog_allowed = !vocab_->eog_ids().empty();
        for (int32_t id : vocab_->eog_ids()) {
            mask[(size_t)id >> 6] |= uint64_t(1) << (id & 63);
            ++r.n_allowed;
        }
    }
    return r;
}

MaskResult TokenMasker::fill_mask(const GrammarMatcher& m, std::span<uint64_t> mask) const {
    const std::string key = state_key(m.state());
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = cache_.find(key);
        if (it != cache_.end()) {
            std::copy(it->second.first.begin(), it->second.first.end(), mask.begin());
            MaskResult r = it->second.second;
            r.cache_hit = true;
            return r;
        }
    }
    const MaskResult r = walk(m, mask);
    std::lock_guard<std::mutex> lock(mu_);
    // A full cache starts over: states of a finished request are rarely seen again, and the
    // states that recur (inside strings, between values) come back within a few tokens.
    if (cache_.size() >= max_cached_) cache_.clear();
    cache_.emplace(key, std::make_pair(std::vector<uint64_t>(mask.begin(), mask.begin() + (long)n_words()), r));
    return r;
}

bool TokenMasker::accept_token(GrammarMatcher& m, int32_t id) const {
    if (id < 0 || id >= vocab_->n_vocab()) return false;
    if (vocab_->is_eog(id)) return m.is_accepting() && m.accept_bytes({});
    const std::string& b = vocab_->bytes(id);
    if (b.empty()) return false;
    return m.accept_bytes(b);
}

size_t TokenMasker::n_cached() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.size();
}

}  // namespace steward
