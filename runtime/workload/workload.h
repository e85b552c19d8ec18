// Workload files (JSONL, one request a line; docs/workloads.md): parse, write, and generate the
// standard mixed workload of the six buckets (and the optional rag bucket), seeded and deterministic
// across platforms.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <steward/expected.h>

namespace steward {

// The file format, stable across versions (unknown fields are ignored, so it can grow):
//
// Header lines (before any request line) define shared segments and documents:
//   {"segment": "doc-2", "text": "..."}
//   {"document": "doc-3", "text": "...", "version": 1}   name: 1-256 of [A-Za-z0-9._:-]; version >= 1
// Request lines:
//   arrival_ms      number in [0, 1e9], required  offset from the start of the run (1e9 ms: ~11.6 days)
//   tenant          string, default "default"
//   bucket          string, optional        a hint; the classifier may decide otherwise
//   session, turn   string, integer >= 1    agent sessions; turns of a session are numbered 1, 2, ...
//                                           A later turn's prompt is the new content only: the runner
//                                           appends it to the session's conversation (previous
//                                           prompts and outputs), and sends it no earlier than
//                                           arrival_ms nor before the previous turn finished and
//                                           paused for its tool_pause_ms. A session is scoped by its
//                                           tenant (two tenants' "s1" are two conversations); its
//                                           turns come in file order, 1, 2, 3, ..., none missing.
//   exactly one of prompt, prompt_ids, segments, tool_call:
//   prompt          string
//   prompt_ids      array of integers in [0, 2^31)
//   segments        an object or array of objects {"shared": "<segment>", "text": "..."} (either or
//                   both; shared comes first): the prompt is their concatenation, as-is
//   tool_call       instead of a prompt, on a later turn of a session (turn >= 2): an object
//                   {"tool": "get_weather", "arguments": {...}, "result": "...", "ttl_s": 600}. The
//                   turn's new content is `result`, the result of this idempotent call, which the client
//                   ran during the previous turn's tool pause. ttl_s in (0, 1e9], default 600: how long
//                   the runner may reuse the result for the same (tenant, tool, arguments).
//   documents       array of 1-16 names of documents defined in header lines, each once: the runner
//                   inlines them into the prompt (one block, docs/workloads.md). Not with prompt_ids.
//   documents_at    integer >= 0, default 0: where the documents stand when inlined as listed (reuse
//                   off): 0 right after the leading parts that name a shared segment; k >= 1 before
//                   segments entry k (k clamped to the number of entries: at the end). For a prompt
//                   (text): 0 before the text, >= 1 after it. With reuse on (steward run's default)
//                   they go at 0, sorted by name, whatever documents_at says.
//   max_tokens      integer >= 1, required
//   temperature     number >= 0, default 0 (greedy)
//   top_p           number in (0, 1], default 1
//   seed            integer >= 0, optional
//   tools           bool, default false
//   response_format "json" or "text" (the default)
//   tool_pause_ms   number in [0, 1e9], default 0  agent: the pause (the tool) after this turn finishes
//   public_prefix   string, optional        names the declared-public shared segment the prompt
//                                           opens with; must be the first segments entry
// Blank lines are skipped.

struct WorkloadSegment {
    std::string name;
    std::string text;
    bool operator==(const WorkloadSegment&) const = default;
};

// One piece of a segmented prompt: the shared segment's text (if named) followed by `text`.
struct PromptPart {
    std::string shared;  // a segment name, or empty
    std::string text;
    bool operator==(const PromptPart&) const = default;
};

enum class PromptKind { TEXT, IDS, SEGMENTS };

// A document a request may reference by name (inlined into its prompt as a block).
struct WorkloadDocument {
    std::string name;
    std::string text;
    int64_t version = 1;
    bool operator==(const WorkloadDocument&) const = default;
};

// The idempotent tool call whose result is a later agent turn's new content (the turn's prompt,
// WorkloadRequest::prompt, holds the result).
struct WorkloadToolCall {
    std::string tool;
    std::string arguments = "{}";  // the arguments object's canonical JSON: keys sorted at every depth, no whitespace
    double ttl_s = 600;            // (0, 1e9]: how long the result may be reused
    bool operator==(const WorkloadToolCall&) const = default;
};

struct WorkloadRequest {
    double arrival_ms = 0.0;
    std::string tenant = "default";
    std::string bucket;   // hint; empty when none
    std::string session;  // empty when not an agent session
    int turn = 0;         // 1-based within the session; 0 when no session
    PromptKind prompt_kind = PromptKind::TEXT;
    std::string prompt;                // PromptKind::TEXT
    std::vector<int32_t> prompt_ids;   // PromptKind::IDS
    std::vector<PromptPart> segments;  // PromptKind::SEGMENTS
    int max_tokens = 16;
    double temperature = 0.0;
    double top_p = 1.0;
    std::optional<uint64_t> seed;
    bool tools = false;
    bool response_json = false;  // response_format "json"
    double tool_pause_ms = 0.0;
    std::string public_prefix;  // empty when none
    std::vector<std::string> documents;  // names of defined documents, each once; empty when none
    int documents_at = 0;                // where they stand when inlined as listed (see the format)
    std::optional<WorkloadToolCall> tool_call;  // set: a TEXT prompt holding the call's result
    bool operator==(const WorkloadRequest&) const = default;
};

// Where a request's documents go when its prompt is rendered as text.
enum class DocumentPlacement {
    CANONICAL,  // sorted by name, right after the leading parts that name a shared segment (reuse on)
    AS_LISTED,  // in the request's order, at documents_at (reuse off)
};

// A prompt rendered as text with its documents: [doc_begin, doc_end) is the documents' block
// (empty, doc_begin == doc_end, when the request has none).
struct PlacedPrompt {
    std::string text;
    size_t doc_begin = 0, doc_end = 0;
};

struct Workload {
    std::vector<WorkloadSegment> segments;    // in file order; names unique
    std::vector<WorkloadDocument> documents;  // in file order; names unique
    std::vector<WorkloadRequest> requests;    // in file order
    bool operator==(const Workload&) const = default;

    const WorkloadSegment* find_segment(std::string_view name) const;    // nullptr if not defined
    const WorkloadDocument* find_document(std::string_view name) const;  // nullptr if not defined
    // The prompt as text: TEXT as is, SEGMENTS concatenated (segment text, then part text); empty
    // for IDS. The documents go where `where` says, as one block: each document as
    // <document id="NAME" version="V">\nTEXT\n</document>, joined by "\n", the block followed by
    // "\n" (and preceded by one when the text before it does not end in one). Throws
    // std::out_of_range for a segment or document not defined (parse_workload rules that out).
    PlacedPrompt place_prompt(const WorkloadRequest& r, DocumentPlacement where) const;
    // place_prompt(r, CANONICAL).text: what a reuse-aware server renders.
    std::string prompt_text(const WorkloadRequest& r) const;
};

// The documents' block (the format of place_prompt) of the named documents in the order given.
std::string workload_documents_block(const Workload& w, const std::vector<std::string>& names);

// Parses a whole JSONL file's contents. Errors name the line (1-based), the field, the value and the
// fix, e.g. "workload line 7: max_tokens is -3; it must be an integer >= 1". Thread-safe (pure).
Expected<Workload> parse_workload(std::string_view jsonl);
// Reads and parses a file (a regular file of at most 1 GiB: a FIFO or device is refused without
// blocking); errors also name the path.
Expected<Workload> read_workload_file(const std::string& path);
// JSONL that parse_workload reads back equal: segment lines first, then document lines, then one
// line per request with its fields in the order of the format above; defaults are left out.
// Thread-safe (pure).
std::string write_workload(const Workload& w);
// Writes write_workload's text to a file; an Error names the path when it cannot.
std::optional<Error> write_workload_file(const Workload& w, const std::string& path);

// The conversations of agent sessions as the runner replays them: a later turn's prompt is the
// session's previous prompts and outputs plus its new content. Sessions are keyed by (tenant,
// session id), so two tenants using one id never see each other's text. Not synchronised.
class SessionConversations {
public:
    // Appends a turn's new content (space-separated) and returns the whole prompt to send.
    const std::string& open_turn(const std::string& tenant, const std::string& session, const std::string& text);
    // Appends the turn's generated text.
    void close_turn(const std::string& tenant, const std::string& session, const std::string& output);
    size_t n_sessions() const { return text_.size(); }

private:
    std::map<std::pair<std::string, std::string>, std::string> text_;
};

// The standard mixed workload (docs/workloads.md), sized at scale 1 for a 2-core machine and small
// synthetic models (a run of a few minutes); scale multiplies every length in words (~1 token per
// word with the synthetic SPM tokenizer). Shapes at scale 1, words:
//   short_qa    public system 64 + tenant system 64 + question 16-48; out 16-32; greedy or T 0.2
//   long_doc    public system 64 + one of 3 shared documents 512-768 + question 32; out 16-32; T 0.2
//   long_output public system 64 + tenant system 64 + instruction 64; out 128-256; T 0.3
//   agent       public system 64 + tenant tool schema 192, then 3-4 turns: a task 32, and tool results
//               32-96 with a pause of 50-300 ms (unscaled) after each turn but the last; out 16-32; greedy
//   high_temp   public system 64 + tenant system 64 + prompt 64; out 48-96; T 1.0-1.3, top_p 0.95
//   structured  public system 64 + one of 2 shared schemas 128 + prompt 64; out 48-96; greedy, json
//   rag         (weight 0 in the standard mix) public system 64 + tenant system 64 + 2-3 documents of
//               a shared set of 12 (doc-0..doc-11, 192-320 each, header lines written only when the
//               bucket is used) drawn without replacement with Zipf popularity P(doc-k) ∝ 1/(k+1)^1.1
//               + question 16-32; documents_at uniform in {0, 1, 2, 3}; out 16-32; greedy
// With agent_tools, every agent turn after the first is a tool_call: one of get_weather (6 cities),
// read_file (8 paths), search (10 queries), the tool drawn 50/30/20% and its argument with Zipf
// popularity (1/k^1.1), so calls repeat across a tenant's sessions; the result (32-96 words) is a
// function of (seed, tool, arguments) alone, so a repeated call has the same result.
// Arrivals are Poisson at `rate` (with burst: bursts of 4-12 requests 1/(20·rate) apart on average,
// spaced so the mean rate stays `rate`). Every request line takes the next arrival: a later agent
// turn takes the first arrival after its previous turn's arrival + pause + an allowance for the turn
// itself, so arrival gaps over all lines follow the process. The first draws cover each bucket once.
// 3-4 tenants (skewed: 40/30/20/10%); one declared-public system prompt ("sys-public") opens every
// prompt; 20% of short_qa, long_output and high_temp prompts carry a volatile line (request id and
// timestamp) right after it, which breaks caching of what follows. Every request carries its bucket as
// the hint and a seed. Deterministic for a seed on every platform (only raw mt19937_64 output is used).
struct WorkloadGenParams {
    int n_requests = 200;  // request lines in all (agent turns count one each)
    double rate = 2.0;     // requests per second
    double scale = 1.0;    // multiplies lengths
    uint64_t seed = 0;
    bool burst = false;
    int n_tenants = 4;  // 3 or 4 (clamped to [1, 4])
    // The volatile line (request id and timestamp) of short_qa, long_output and high_temp prompts:
    // the share of them that carry it, and where: right after the public system prompt (early,
    // the standard workload's), or at the very end of the prompt (late: nothing shared follows it).
    double volatile_share = 0.2;
    bool volatile_late = false;
    // Agent sessions' tool pauses (between a turn and the next): 0, the standard 50-300 ms; else each
    // uniform in [0.5, 1.5] x this many milliseconds (long pauses: sessions whose KV outlives the pool).
    double tool_pause_ms = 0;
    // Turns of an agent session: 0, the standard 3 or 4; else this many (long sessions), in [1, 64].
    int agent_turns = 0;
    // The bucket mix: relative weights by bucket name (short_qa, long_doc, long_output, agent,
    // high_temp, structured, rag); a bucket not named keeps its standard weight, 0 leaves it out.
    // Empty: the standard mix (33/15/12/7/13/20%, rag 0).
    std::map<std::string, double> mix;
    // Agent turns after the first carry repeated idempotent tool calls (tool_call) instead of
    // free-form tool results. false: the standard workload, unchanged.
    bool agent_tools = false;
    // The share of new agent sessions that repeat an earlier session of the same tenant, as agent
    // traffic repeats itself: the same task (half of them with one word edited), then the same tool
    // calls and results turn by turn, with the same output lengths. 0: the standard workload,
    // unchanged. In [0, 1].
    double agent_repeat = 0;
};
// "short_qa=2,agent=0" into WorkloadGenParams::mix; the error names the entry and the fix.
Expected<std::map<std::string, double>> parse_workload_mix(const std::string& spec);
Workload generate_workload(const WorkloadGenParams& p);
// The generator's limits: n_requests in [1, 1,000,000], rate finite in (0, 100,000] req/s, scale
// finite in (0, 64], volatile_share in [0, 1], tool_pause_ms in [0, 3,600,000], mix weights finite, >= 0, of the seven buckets, not all
// zero. The error names the flag (--requests, --rate, --scale, --volatile-share, --mix) and the range.
Expected<bool> check_workload_gen(const WorkloadGenParams& p);

// The ~200 common English words the generator builds text from.
const std::vector<std::string>& workload_words();
// Whitespace-separated words in s (the generator's length measure).
int count_words(std::string_view s);

}  // namespace steward
