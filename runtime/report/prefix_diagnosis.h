// Prefix-miss diagnosis: where a bucket's prompts leave the longest prefix an earlier prompt shares
// with them (what a prefix cache could have served), and which of those departures are volatile
// text (a timestamp, a request id) that the prompts go back to agreeing after: those cost the
// cached tokens that follow them, and moving the volatile text after the shared part restores them.
// Plain C++ over token ids; the caller tokenizes (steward run does, with the pool's tokenizer).
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace steward {

// One prompt, in arrival order. Prompts are compared only within the same scope (e.g. pool and
// tenant: what one prefix cache can share).
struct DiagnosisPrompt {
    std::string bucket;
    std::string scope;
    std::vector<int32_t> ids;
};

struct PrefixDiagnosisOptions {
    int max_tokens = 4096;    // tokens of each prompt looked at
    int max_prompts = 20000;  // prompts looked at (the first ones)
    int max_skip = 64;        // a volatile span is at most this many tokens in either prompt,
    int max_both = 8;         // ... and at most this many in one of them (an insertion, or a short
                              // substitution like an id's digits; two different questions followed
                              // by a common tail are content, not volatile text)
    int min_resync = 8;       // ... followed by at least this many tokens that agree again
    int min_group = 2;        // a position is reported when this many prompts depart there volatilely
    double min_share = 0.05;  // ... and at least this share of the bucket's prompts
};

// Departures at one token position of a bucket where the prompts resynchronise with the earlier
// prompt they matched: the volatile spans.
struct VolatileSpot {
    int position = 0;        // token index where the shared prefix ends
    int count = 0;           // prompts departing there volatilely
    int64_t tokens_lost = 0; // tokens after the span that agree with the earlier prompt again (the
                             // prefix cache's loss: cached had the span not been there), summed
    std::string example;     // one span's text
    std::vector<std::pair<std::string, int>> top_tokens;  // the most frequent tokens in the spans
    std::string advice;      // one line
};

struct BucketPrefixDiagnosis {
    std::string bucket;
    int n_prompts = 0;
    int n_first = 0;         // prompts with no earlier prompt in their scope
    // Where the longest shared prefix ends, as counts per range of token positions:
    // [0,16) [16,64) [64,256) [256,1024) [1024, inf), and "whole prompt" (all of it shared).
    std::vector<int> position_hist = std::vector<int>(6, 0);
    double mean_shared = 0;  // mean shared-prefix length (tokens) over prompts with an earlier one
    int n_volatile = 0;      // prompts whose departure is volatile (any position)
    int64_t tokens_lost = 0; // VolatileSpot::tokens_lost over every volatile departure
    std::vector<VolatileSpot> spots;  // reported positions, most tokens lost first
};

// The range labels of position_hist.
const std::vector<std::string>& prefix_position_ranges();

// Per bucket in first-appearance order. detok(scope, ids) turns a scope's ids into text (examples
// and top tokens); may be empty.
using DiagnosisDetok = std::function<std::string(const std::string& scope, const std::vector<int32_t>& ids)>;
std::vector<BucketPrefixDiagnosis> diagnose_prefix_misses(const std::vector<DiagnosisPrompt>& prompts,
                                                          const DiagnosisDetok& detok,
                                                          const PrefixDiagnosisOptions& opt = {});

// The report's "prefix_diagnosis" array (one object per bucket; html_report draws it) and the
// table steward run prints (with the advice lines under it).
nlohmann::json prefix_diagnosis_json(const std::vector<BucketPrefixDiagnosis>& d);
std::string prefix_diagnosis_table(const std::vector<BucketPrefixDiagnosis>& d);

}  // namespace steward
