// A request's output constraint (structured output): which front end and its text, compiled once
// per distinct text through a process-wide cache, so a repeated schema or grammar is not recompiled.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <steward/expected.h>
#include <steward/request.h>

#include "grammar/grammar.h"

namespace steward {

// NONE: unconstrained. The values travel between actors as int32_t.
enum class ConstraintKind : int32_t { NONE = 0, GBNF = 1, JSON_SCHEMA = 2, JSON_OBJECT = 3 };

struct OutputConstraint {
    ConstraintKind kind = ConstraintKind::NONE;
    std::string text;  // the GBNF or the JSON Schema text (empty for NONE and JSON_OBJECT)
    bool active() const { return kind != ConstraintKind::NONE; }
};

// The request's constraint from its fields (grammar, json_schema, json_object). More than one set
// is an error naming them. Pure.
Expected<OutputConstraint> constraint_of(const GenerationRequest& req);

// The compiled grammar of a constraint (null for NONE). Errors are the front end's: "grammar:L:C:
// ..." or "schema /json/pointer: ...", with the fix. Results, errors included, are cached by (kind, text); thread-safe.
Expected<std::shared_ptr<const CompiledGrammar>> compile_constraint(ConstraintKind kind, const std::string& text);
inline Expected<std::shared_ptr<const CompiledGrammar>> compile_constraint(const OutputConstraint& c) {
    return compile_constraint(c.kind, c.text);
}

struct GrammarCacheStats {
    int64_t n_compiles = 0;  // misses: texts compiled (successfully or not)
    int64_t n_hits = 0;
    double compile_s = 0;    // total time compiling
    size_t n_entries = 0;
};
GrammarCacheStats grammar_cache_stats();

}  // namespace steward
