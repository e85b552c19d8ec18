// The process-wide grammar cache: (kind, text) -> compiled grammar or error, bounded (the oldest
// entries go first past k_max_entries).
#include "grammar/constraint.h"

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

namespace steward {

namespace {

constexpr size_t k_max_entries = 256;
constexpr size_t k_max_text = 1 << 20;  // 1 MiB of schema or grammar text
// Alternatives the matcher may hold at once: each token mask walks every parse stack over the
// vocabulary's trie, on the pool's step path, so a huge flat alternation would stall every request
// batched with it. Bounded per rule (any alternation, wherever it sits) and at the output's start
// (where nested rules multiply). JSON Schema enums are factored into a trie of common prefixes
// (json_schema.cpp) and stay far below this.
constexpr size_t k_max_alternatives = 4096;

struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::string error;  // non-empty: the compile failed
};

struct Cache {
    std::mutex mu;
    std::map<std::pair<int32_t, std::string>, Entry> entries;
    std::deque<std::pair<int32_t, std::string>> order;  // insertion order, for eviction
    GrammarCacheStats stats;
};

Cache& cache() {
    static Cache* c = new Cache();  // never destroyed: used from any thread until exit
    return *c;
}

const char* field_name(ConstraintKind k) {
    switch (k) {
    case ConstraintKind::GBNF: return "grammar";
    case ConstraintKind::JSON_SCHEMA: return "json_schema";
    case ConstraintKind::JSON_OBJECT: return "json_object";
    default: return "constraint";
    }
}

// The budget's refusal for a compiled grammar, naming the rule, the count and the fix; none within it.
std::optional<std::string> over_budget(ConstraintKind kind, const std::shared_ptr<const CompiledGrammar>& grammar) {
    const CompiledGrammar& g = *grammar;
    const std::string fix = " are accepted (every step walks each one over the vocabulary): factor common prefixes out "
                            "of long alternations, e.g. \"ab\" (\"c\" | \"d\") instead of \"abc\" | \"abd\"";
    for (uint32_t r = 0; r < (uint32_t)g.rule_names().size(); r++)
        if (g.alternatives(r).size() > k_max_alternatives)
            return std::string(field_name(kind)) + ": rule '" + g.rule_names()[r] + "' has " +
                   std::to_string(g.alternatives(r).size()) + " alternatives; at most " +
                   std::to_string(k_max_alternatives) + fix;
    const GrammarMatcher start(grammar);
    if (start.overflowed())
        return std::string(field_name(kind)) + ": its optional and repeated parts nest so that the output's start expands past " +
               std::to_string(GrammarMatcher::k_max_expand_work) + " parse paths (or " +
               std::to_string(GrammarMatcher::k_max_expand_depth) + " levels); flatten nested repetitions such as "
               "((x{0,100}){0,100}) into one (x{0,10000}), and make long runs of optional properties required or fewer";
    const size_t n_start = start.state().size();
    if (n_start > k_max_alternatives)
        return std::string(field_name(kind)) + ": the output's start matches " + std::to_string(n_start) +
               " alternatives at once; at most " + std::to_string(k_max_alternatives) + fix;
    return std::nullopt;
}

}  // namespace

Expected<OutputConstraint> constraint_of(const GenerationRequest& req) {
    OutputConstraint c;
    int n = 0;
    if (!req.grammar.empty()) {
        c = {ConstraintKind::GBNF, req.grammar};
        n++;
    }
    if (!req.json_schema.empty()) {
        c = {ConstraintKind::JSON_SCHEMA, req.json_schema};
        n++;
    }
    if (req.json_object) {
        c = {ConstraintKind::JSON_OBJECT, ""};
        n++;
    }
    if (n > 1)
        return make_error("grammar, json_schema and json_object each constrain the output; set at most one of them");
    return c;
}

Expected<std::shared_ptr<const CompiledGrammar>> compile_constraint(ConstraintKind kind, const std::string& text) {
    if (kind == ConstraintKind::NONE) return std::shared_ptr<const CompiledGrammar>();
    if (kind == ConstraintKind::JSON_OBJECT) return CompiledGrammar::json_object();
    if (kind != ConstraintKind::GBNF && kind != ConstraintKind::JSON_SCHEMA)
        return make_error("unknown output constraint kind ", std::to_string((int)kind));
    if (text.size() > k_max_text)
        return make_error(field_name(kind), " is ", std::to_string(text.size()), " bytes; at most ",
                          std::to_string(k_max_text), " are accepted");
    Cache& c = cache();
    std::pair<int32_t, std::string> key{(int32_t)kind, text};
    {
        std::lock_guard<std::mutex> lk(c.mu);
        if (auto it = c.entries.find(key); it != c.entries.end()) {
            c.stats.n_hits++;
            if (!it->second.error.empty()) return make_error(it->second.error);
            return it->second.grammar;
        }
    }
    // Compiled outside the lock: two threads may compile the same new text once each (harmless).
    const auto t0 = std::chrono::steady_clock::now();
    auto g = kind == ConstraintKind::GBNF ? CompiledGrammar::from_gbnf(text) : CompiledGrammar::from_json_schema(std::string_view(text));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Entry e;
    if (g) {
        if (auto over = over_budget(kind, *g)) e.error = *over;
        else e.grammar = *g;
    } else {
        e.error = g.error().message;  // it names itself: "grammar:L:C: ..." or "schema /pointer: ..."
    }
    std::lock_guard<std::mutex> lk(c.mu);
    c.stats.n_compiles++;
    c.stats.compile_s += dt;
    if (!c.entries.count(key)) {
        c.order.push_back(key);
        c.entries.emplace(key, e);
        while (c.entries.size() > k_max_entries) {
            c.entries.erase(c.order.front());
            c.order.pop_front();
        }
    }
    if (!e.error.empty()) return make_error(e.error);
    return e.grammar;
}

GrammarCacheStats grammar_cache_stats() {
    Cache& c = cache();
    std::lock_guard<std::mutex> lk(c.mu);
    GrammarCacheStats s = c.stats;
    s.n_entries = c.entries.size();
    return s;
}

}  // namespace steward
