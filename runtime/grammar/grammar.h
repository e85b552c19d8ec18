// Grammar-constrained decoding: a context-free grammar (GBNF text, or compiled from a JSON Schema,
// plain JSON or a regular expression) run as a pushdown automaton over code points, fed bytes, and
// the allowed-token mask over a model's vocabulary at each step (byte trie walk + per-state cache).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <steward/expected.h>

namespace steward {

class Tokenizer;

// ---- compiled grammar

// The largest count a repetition {m,n} may name (GBNF and the regex front end alike).
constexpr uint64_t k_max_repetition = 100000;
// One element of a rule's flat body. Every alternative ends with ALT_END; a rule's alternatives
// follow each other and the rule ends with RULE_END. CHARS matches one code point against
// char_classes[value]; RULE enters rule `value`.
enum class GrammarOp : uint8_t { CHARS, RULE, ALT_END, RULE_END };
struct GrammarElement {
    GrammarOp op;
    uint32_t value;
};
// A set of code points: sorted, disjoint, inclusive ranges; `negated` matches the complement.
struct CharClass {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    bool negated = false;
    bool contains(uint32_t cp) const;
    bool intersects(uint32_t lo, uint32_t hi) const;    // any code point of [lo, hi] in the set
    bool contains_all(uint32_t lo, uint32_t hi) const;  // every code point of [lo, hi] in the set
};

// An immutable compiled grammar: compile once, share (shared_ptr<const>) across requests and
// threads. Repetitions are rewritten into helper rules; left recursion (which a top-down
// automaton cannot run) is rejected at compile time.
class CompiledGrammar {
public:
    // GBNF as llama.cpp users write it: `name ::= alternatives`, | ( ) * + ? {m} {m,} {m,n},
    // "literals" (escapes \n \r \t \" \\ \[ \] \xHH \uHHHH \UHHHHHHHH), [classes] with ranges and
    // [^negation], `.` (any code point), # comments. Errors: "grammar:L:C: <what was expected>
    // <the fix>"; an undefined rule or a missing root names the rule.
    static Expected<std::shared_ptr<const CompiledGrammar>> from_gbnf(std::string_view text,
                                                                      std::string_view root = "root");
    // JSON Schema (see json_schema_to_gbnf) / any JSON object (response_format json_object) /
    // a regular expression over the whole output (see regex_to_gbnf).
    // The text form keeps the schema's property order (nlohmann::json sorts object keys).
    static Expected<std::shared_ptr<const CompiledGrammar>> from_json_schema(const nlohmann::json& schema);
    static Expected<std::shared_ptr<const CompiledGrammar>> from_json_schema(std::string_view schema_text);
    static std::shared_ptr<const CompiledGrammar> json_object();
    static Expected<std::shared_ptr<const CompiledGrammar>> from_regex(std::string_view pattern);

    const std::vector<GrammarElement>& elements() const { return elements_; }
    const std::vector<CharClass>& char_classes() const { return char_classes_; }
    // rule id -> index in elements() of its first alternative's first element.
    const std::vector<uint32_t>& rule_starts() const { return rule_starts_; }
    // rule id -> where each of its alternatives starts in elements().
    const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rule_alts_[rule]; }
    const std::vector<std::string>& rule_names() const { return rule_names_; }
    uint32_t root() const { return root_; }

private:
    friend struct GrammarBuilder;
    std::vector<GrammarElement> elements_;
    std::vector<CharClass> char_classes_;
    std::vector<uint32_t> rule_starts_;
    std::vector<std::vector<uint32_t>> rule_alts_;
    std::vector<std::string> rule_names_;
    uint32_t root_ = 0;
};

// Front ends as GBNF text (compile it with from_gbnf; the text also helps a user see what the
// schema became). Schema errors name the JSON pointer of the offending part and the fix.
// JSON Schema: type (object/array/string/number/integer/boolean/null, or a list of them),
// properties + required (declared order), additionalProperties (absent or false: none; true or a
// schema: extra keys that are none of the declared names), enum, const, items, minItems/maxItems,
// minLength/maxLength, anyOf/oneOf (oneOf is generated as anyOf: its branches should be disjoint),
// format date/time/date-time/uuid (other formats: plain string), $ref to #/$defs/... and
// #/definitions/..., {} or true (any JSON value).
// Properties are generated in declared order from the text form, in key order from nlohmann::json.
Expected<std::string> json_schema_to_gbnf(const nlohmann::json& schema);
Expected<std::string> json_schema_to_gbnf(std::string_view schema_text);
std::string json_object_gbnf();
// A schema's rules for embedding in a larger grammar: every rule name starts with `prefix`
// ([a-zA-Z0-9-], not "json-", "space" or "root"), `root` names the schema's rule, and the shared
// primitives they use (json-*, space) are left out: add json_schema_primitives_gbnf() once.
struct SchemaRules {
    std::string root;
    std::string rules;
};
Expected<SchemaRules> json_schema_to_gbnf_rules(std::string_view schema_text, const std::string& prefix);
std::string json_schema_primitives_gbnf();
// A GBNF literal matching exactly these bytes (quotes, backslashes and controls escaped).
std::string gbnf_string_literal(std::string_view bytes);
// A practical regex subset: literals and escapes (\d \w \s \D \W \S \. \n \t \\ ...), [classes],
// `.` (any but newline), * + ? {m} {m,} {m,n} (lazy `?` suffixes are ignored), ( ) (?: ), |,
// with ^ and $ accepted at the ends only (the match is always the whole output).
Expected<std::string> regex_to_gbnf(std::string_view pattern);
// The same subset as the content of a JSON string (JSON Schema `pattern`): a GBNF expression over
// the characters between the quotes, which are all ones a JSON string writes unescaped (classes
// lose '"', '\\' and the controls; a literal that needs an escape is an error naming its column).
// ECMA-262 search semantics are left to the caller: anchored_start / anchored_end say whether the
// pattern began with '^' / ended with '$'; an unanchored side may have any characters around it.
// An anchored pattern with a top-level '|' is refused (write ^(?:a|b)$).
struct JsonStringPattern {
    std::string gbnf;
    bool anchored_start = false;
    bool anchored_end = false;
};
Expected<JsonStringPattern> regex_to_json_string_gbnf(std::string_view pattern);

// ---- per-request matcher
// The automaton state: a set of stacks of grammar positions (the top is always a CHARS element;
// an empty stack means "the grammar may end here") plus a partial UTF-8 character when bytes fed
// so far end inside one. A plain value (a few small vectors).
struct StackSet {
    std::vector<uint32_t> data;   // the stacks' positions, bottom first, one stack after the other
    std::vector<uint32_t> offs{0};  // stack i is data[offs[i] .. offs[i+1])
    uint32_t partial_cp = 0;      // bits of the pending UTF-8 character
    uint8_t n_partial_left = 0;   // its continuation bytes still expected (0: none pending)
    uint8_t partial_len = 0;      // its total length in bytes
    // Every completion of the pending character is valid UTF-8 and matched by every stack, so
    // its bits no longer matter (partial_cp is then 0): the prefixes of, say, all CJK characters
    // inside a string are one state, not hundreds.
    bool partial_any = false;
    size_t size() const { return offs.size() - 1; }
    bool empty() const { return size() == 0; }
    void clear() {
        data.clear();
        offs.assign(1, 0);
        partial_cp = 0;
        n_partial_left = partial_len = 0;
        partial_any = false;
    }
    bool operator==(const StackSet&) const = default;
};

// One request's automaton. Not thread-safe, const members included (they share a scratch stack):
// one thread at a time. A copy carries the whole history (O(tokens fed)); fork() is the cheap
// clone for trying things. Holds the grammar alive (shared_ptr).
class GrammarMatcher {
public:
    explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
    // The same state with an empty history: a few small vectors copied.
    GrammarMatcher fork() const;

    // Feeds bytes (any split: a token may span grammar elements and end inside a UTF-8
    // character). Returns false, leaving the state unchanged, when the grammar rejects them.
    // Each successful call is one history step (see rollback).
    bool accept_bytes(std::string_view bytes);
    // Whether accept_bytes(bytes) would succeed; the state is unchanged either way.
    bool can_accept_bytes(std::string_view bytes) const;
    // Undoes the last n successful accept_bytes calls in O(n) (speculation's rejected drafts).
    // n above n_history() is clamped.
    void rollback(size_t n);
    size_t n_history() const { return history_.size(); }
    // The output may end here: a stack is empty and no UTF-8 character is pending.
    bool is_accepting() const;
    // No continuation at all (only after a grammar that can never end; the engine should never
    // see it because accept_bytes refuses what would lead here).
    bool is_dead() const { return state_.empty(); }

    const StackSet& state() const { return state_; }
    // One step's expansion went past its work bound (k_max_expand_work calls or k_max_expand_depth
    // nesting): a grammar whose nested optional parts multiply (((x{0,100}){0,100}){0,100}). The
    // start state is then empty and such a step is refused; compile_constraint refuses the grammar.
    bool overflowed() const { return overflowed_; }
    static constexpr uint32_t k_max_expand_work = 1u << 18;
    static constexpr uint32_t k_max_expand_depth = 2048;
    const CompiledGrammar& grammar() const { return *grammar_; }
    // Low-level step used by the mask walk: `out` = `in` after one byte; false (out empty) when
    // rejected. `out` must not alias `in`.
    bool advance_byte(const StackSet& in, uint8_t byte, StackSet& out) const;

private:
    GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, StackSet state)
        : grammar_(std::move(grammar)), state_(std::move(state)) {}
    std::shared_ptr<const CompiledGrammar> grammar_;
    StackSet state_;
    std::vector<StackSet> history_;  // the state before each successful accept_bytes
    mutable std::vector<uint32_t> work_;  // scratch stack for expansion
    mutable uint32_t work_left_ = 0, depth_ = 0;  // one step's expansion budget (see overflowed)
    mutable bool overflowed_ = false;

    // cp == UINT32_MAX: the pending character of a partial_any state (every stack matches it).
    bool advance_cp(const StackSet& in, uint32_t cp, StackSet& out) const;
    void expand(uint32_t pos, StackSet& out) const;
    void emit(uint32_t top, StackSet& out) const;
};

// ---- vocabulary
// A model's vocabulary as bytes, built once per model: token id -> the bytes it stands for, and
// a byte trie over them (pre-order: a subtree is one contiguous range, so a rejected prefix skips
// its subtree in one jump). Tokens with no bytes (control tokens) are never allowed, except the
// end-of-generation ids, which are allowed exactly when the grammar is accepting.
class TokenVocabulary {
public:
    TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eog_ids);
    // Each id's bytes from Tokenizer::token_to_bytes (byte-fallback <0xHH> and GPT-2 byte-level
    // pieces mapped back to raw bytes); the end-of-generation ids from Tokenizer::is_eog.
    static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tok);

    int32_t n_vocab() const { return (int32_t)bytes_.size(); }
    const std::string& bytes(int32_t id) const { return bytes_[id]; }
    const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
    bool is_eog(int32_t id) const;

    struct TrieNode {
        uint8_t byte;           // the edge into this node
        uint32_t depth;         // the prefix length: 1 for children of the root
        uint32_t subtree_end;   // index one past this node's subtree
        uint32_t tokens_begin;  // token ids ending here: trie_tokens()[tokens_begin, tokens_end)
        uint32_t tokens_end;
    };
    const std::vector<TrieNode>& trie() const { return trie_; }       // pre-order, root excluded
    const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }
    size_t max_token_len() const { return max_len_; }

private:
    std::vector<std::string> bytes_;
    std::vector<int32_t> eog_ids_;  // sorted
    std::vector<TrieNode> trie_;
    std::vector<int32_t> trie_tokens_;
    size_t max_len_ = 0;
};

// ---- token masks
// The allowed-token bitmask for a matcher state: bit id of mask[id / 64]. One TokenMasker per
// (grammar, vocabulary) pair, shared by every request using that grammar on that model: it keeps
// a cache of masks keyed by the automaton state. Thread-safe (the cache is locked; walks run
// outside the lock).
struct MaskResult {
    int32_t n_allowed = 0;   // tokens set in the mask, EOG included
    bool eog_allowed = false;
    bool cache_hit = false;
    // Nothing may follow: the engine must end the request with an error rather than sample.
    bool dead() const { return n_allowed == 0; }
};

class TokenMasker {
public:
    TokenMasker(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocab,
                size_t max_cached = 4096);
    // mask.size() must be >= (n_vocab + 63) / 64 words; they are overwritten.
    MaskResult fill_mask(const GrammarMatcher& m, std::span<uint64_t> mask) const;
    size_t n_words() const { return ((size_t)vocab_->n_vocab() + 63) / 64; }
    // Advances by a sampled token: EOG ids are accepted when accepting (the state stays, one
    // history step is still recorded so that rollback(n) always undoes n tokens), other ids feed
    // their bytes. False (state unchanged, no step) when the token is not allowed.
    bool accept_token(GrammarMatcher& m, int32_t id) const;
    size_t n_cached() const;
    const TokenVocabulary& vocab() const { return *vocab_; }

private:
    std::shared_ptr<const CompiledGrammar> grammar_;
    std::shared_ptr<const TokenVocabulary> vocab_;
    size_t max_cached_;
    // ASCII byte -> the smallest ASCII byte in exactly the same character classes: from a state
    // with no pending UTF-8, both lead to the same state, so the walk computes one of them.
    std::array<uint8_t, 128> ascii_rep_{};
    mutable std::mutex mu_;
    mutable std::unordered_map<std::string, std::pair<std::vector<uint64_t>, MaskResult>> cache_;

    MaskResult walk(const GrammarMatcher& m, std::span<uint64_t> mask) const;
};

// The cache key of a state (its stacks and pending UTF-8 bytes, canonical).
std::string state_key(const StackSet& s);

}  // namespace steward
