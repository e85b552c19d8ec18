// Workload JSONL: parse (validating at the edge), write (round-trips), and the seeded generator of
// the standard mixed workload (see workload.h for the format and the shapes).
#include "workload/workload.h"

#include "util/strings.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

#include "config/limits.h"

namespace steward {

using nlohmann::json;

const WorkloadSegment* Workload::find_segment(std::string_view name) const {
    for (const WorkloadSegment& s : segments)
        if (s.name == name) return &s;
    return nullptr;
}

const WorkloadDocument* Workload::find_document(std::string_view name) const {
    for (const WorkloadDocument& d : documents)
        if (d.name == name) return &d;
    return nullptr;
}

std::string workload_documents_block(const Workload& w, const std::vector<std::string>& names) {
    // The format of runtime/serve's documents_block (docs/reuse.md), so that a replay through the
    // runner and a chat through the server put the same text in the prompt.
    std::string s;
    for (const std::string& name : names) {
        const WorkloadDocument* d = w.find_document(name);
        if (!d) throw std::out_of_range("workload document '" + name + "' is not defined");
        if (!s.empty()) s += "\n";
        s += "<document id=\"" + d->name + "\" version=\"" + std::to_string(d->version) + "\">\n" + d->text + "\n</document>";
    }
    return s;
}

PlacedPrompt Workload::place_prompt(const WorkloadRequest& r, DocumentPlacement where) const {
    PlacedPrompt out;
    if (r.prompt_kind == PromptKind::IDS) return out;
    std::vector<std::string> names = r.documents;
    if (where == DocumentPlacement::CANONICAL) {
        std::sort(names.begin(), names.end());
        names.erase(std::unique(names.begin(), names.end()), names.end());
    }
    const std::string block = names.empty() ? std::string() : workload_documents_block(*this, names);
    auto insert_block = [&](std::string& s) {
        if (block.empty()) return;
        if (!s.empty() && s.back() != '\n') s += '\n';
        out.doc_begin = s.size();
        s += block;
        s += '\n';
        out.doc_end = s.size();
    };
    std::string& s = out.text;
    if (r.prompt_kind == PromptKind::TEXT) {
        const bool after = where == DocumentPlacement::AS_LISTED && r.documents_at >= 1;
        if (!after) insert_block(s);
        s += r.prompt;
        if (after) insert_block(s);
        if (block.empty()) out.doc_begin = out.doc_end = s.size();
        return out;
    }
    // SEGMENTS: before which entry the block goes. 0 (and CANONICAL): after the leading entries
    // that name a shared segment.
    const size_t n = r.segments.size();
    size_t lead = 0;
    while (lead < n && !r.segments[lead].shared.empty()) ++lead;
    size_t at = lead;
    if (where == DocumentPlacement::AS_LISTED && r.documents_at >= 1) at = std::min<size_t>((size_t)r.documents_at, n);
    for (size_t i = 0; i <= n; ++i) {
        if (i == at) insert_block(s);
        if (i == n) break;
        const PromptPart& p = r.segments[i];
        if (!p.shared.empty()) {
            const WorkloadSegment* seg = find_segment(p.shared);
            if (!seg) throw std::out_of_range("workload segment '" + p.shared + "' is not defined");
            s += seg->text;
        }
        s += p.text;
    }
    if (block.empty()) out.doc_begin = out.doc_end = s.size();
    return out;
}

std::string Workload::prompt_text(const WorkloadRequest& r) const {
    return place_prompt(r, DocumentPlacement::CANONICAL).text;
}

// ---------------------------------------------------------------------------------------------
// Parsing

namespace {

// A value as the error message shows it: its JSON, cut short.
std::string shown(const json& v) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
}

// Checks the fields of one line; the first failure is kept and names the line.
class LineChecker {
public:
    LineChecker(const json& j, int line) : j_(j), line_(line) {}

    bool failed() const { return err_.has_value(); }
    Error error() const { return *err_; }

    void fail(const std::string& msg) {
        if (!err_) err_ = Error{"workload line " + std::to_string(line_) + ": " + msg};
    }
    bool has(const char* key) const { return j_.contains(key); }

    // A string field; `required` fails when missing, `non_empty` when "".
    std::optional<std::string> string(const char* key, bool required, bool non_empty, const char* what) {
        if (!has(key)) {
            if (required) fail(std::string(key) + " is missing; add " + what);
            return std::nullopt;
        }
        const json& v = j_.at(key);
        if (!v.is_string() || (non_empty && v.get_ref<const std::string&>().empty())) {
            fail(std::string(key) + " is " + shown(v) + "; it must be " +
                 (non_empty ? "a non-empty string: " : "a string: ") + what);
            return std::nullopt;
        }
        return v.get<std::string>();
    }

    // A finite number in [lo, hi] (lo_open: (lo, hi]).
    std::optional<double> number(const char* key, bool required, double lo, double hi, bool lo_open, const char* what) {
        if (!has(key)) {
            if (required) fail(std::string(key) + " is missing; add " + what);
            return std::nullopt;
        }
        const json& v = j_.at(key);
        double x = v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
        if (!v.is_number() || !std::isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi) {
            fail(std::string(key) + " is " + shown(v) + "; it must be " + what);
            return std::nullopt;
        }
        return x;
    }

    // An integer in [lo, hi].
    std::optional<int64_t> integer(const char* key, bool required, int64_t lo, int64_t hi, const char* what) {
        if (!has(key)) {
            if (required) fail(std::string(key) + " is missing; add " + what);
            return std::nullopt;
        }
        const json& v = j_.at(key);
        bool ok = v.is_number_integer();
        int64_t x = 0;
        if (ok && v.is_number_unsigned()) {
            uint64_t u = v.get<uint64_t>();
            ok = u <= (uint64_t)hi;
            x = (int64_t)std::min<uint64_t>(u, (uint64_t)std::numeric_limits<int64_t>::max());
        } else if (ok) {
            x = v.get<int64_t>();
        }
        if (!ok || x < lo || x > hi) {
            fail(std::string(key) + " is " + shown(v) + "; it must be " + what);
            return std::nullopt;
        }
        return x;
    }

    std::optional<bool> boolean(const char* key, const char* what) {
        if (!has(key)) return std::nullopt;
        const json& v = j_.at(key);
        if (!v.is_boolean()) {
            fail(std::string(key) + " is " + shown(v) + "; it must be true or false: " + what);
            return std::nullopt;
        }
        return v.get<bool>();
    }

    const json& at(const char* key) const { return j_.at(key); }

private:
    const json& j_;
    int line_;
    std::optional<Error> err_;
};

std::optional<PromptPart> parse_part(const json& v, const Workload& w, LineChecker& c, size_t index) {
    std::string where = "segments[" + std::to_string(index) + "]";
    if (!v.is_object()) {
        c.fail(where + " is " + shown(v) +
               "; each entry must be an object {\"shared\": \"<segment>\", \"text\": \"...\"}");
        return std::nullopt;
    }
    PromptPart p;
    if (v.contains("shared")) {
        const json& s = v.at("shared");
        if (!s.is_string() || s.get_ref<const std::string&>().empty()) {
            c.fail(where + ".shared is " + shown(s) + "; it must be the name of a segment defined in a header line");
            return std::nullopt;
        }
        p.shared = s.get<std::string>();
        if (!w.find_segment(p.shared)) {
            c.fail(where + ".shared names segment \"" + p.shared +
                   "\", which is not defined; add a header line {\"segment\": \"" + p.shared +
                   "\", \"text\": \"...\"} at the top of the file or fix the name");
            return std::nullopt;
        }
    }
    if (v.contains("text")) {
        const json& t = v.at("text");
        if (!t.is_string()) {
            c.fail(where + ".text is " + shown(t) + "; it must be a string");
            return std::nullopt;
        }
        p.text = t.get<std::string>();
    }
    if (!v.contains("shared") && !v.contains("text")) {
        c.fail(where + " has neither shared nor text; give a shared segment name, a text, or both");
        return std::nullopt;
    }
    return p;
}

constexpr size_t k_max_request_documents = 16;

// A document's name: 1-256 characters of [A-Za-z0-9._:-] (the ids of docs/reuse.md).
bool valid_document_name(const std::string& s) {
    if (s.empty() || s.size() > 256) return false;
    return std::all_of(s.begin(), s.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
               ch == '_' || ch == ':' || ch == '-';
    });
}

// tool_call: {"tool": "...", "arguments": {...}, "result": "...", "ttl_s": 600}; the result becomes
// the request's TEXT prompt (the turn's content).
void parse_tool_call(const json& v, LineChecker& c, WorkloadRequest& r) {
    if (!v.is_object()) {
        c.fail("tool_call is " + shown(v) +
               "; it must be an object {\"tool\": \"<name>\", \"arguments\": {...}, \"result\": \"...\", \"ttl_s\": 600}");
        return;
    }
    WorkloadToolCall tc;
    if (!v.contains("tool")) {
        c.fail("tool_call.tool is missing; add the tool's name, e.g. \"tool\": \"get_weather\"");
        return;
    }
    if (!v.at("tool").is_string() || v.at("tool").get_ref<const std::string&>().empty()) {
        c.fail("tool_call.tool is " + shown(v.at("tool")) + "; it must be the tool's name, a non-empty string");
        return;
    }
    tc.tool = v.at("tool").get<std::string>();
    if (v.contains("arguments")) {
        if (!v.at("arguments").is_object()) {
            c.fail("tool_call.arguments is " + shown(v.at("arguments")) +
                   "; it must be a JSON object of the call's arguments, e.g. {\"city\": \"Paris\"}");
            return;
        }
        tc.arguments = v.at("arguments").dump();  // nlohmann::json's objects sort their keys: canonical
    }
    if (!v.contains("result")) {
        c.fail("tool_call.result is missing; add the tool's result: it is the turn's new content");
        return;
    }
    if (!v.at("result").is_string()) {
        c.fail("tool_call.result is " + shown(v.at("result")) + "; it must be a string: the tool's result, the turn's new content");
        return;
    }
    if (v.contains("ttl_s")) {
        const json& t = v.at("ttl_s");
        const double x = t.is_number() ? t.get<double>() : std::numeric_limits<double>::quiet_NaN();
        if (!t.is_number() || !std::isfinite(x) || x <= 0 || x > 1e9) {
            c.fail("tool_call.ttl_s is " + shown(t) + "; it must be a number in (0, 1e9]: the seconds the result may be reused");
            return;
        }
        tc.ttl_s = x;
    }
    r.prompt_kind = PromptKind::TEXT;
    r.prompt = v.at("result").get<std::string>();
    r.tool_call = std::move(tc);
}

std::optional<WorkloadRequest> parse_request(const json& j, const Workload& w, int line, Error& err) {
    LineChecker c(j, line);
    WorkloadRequest r;
    // Bounded so that the runner's arrival time (microseconds in an int64) cannot overflow into
    // "now": 1e9 ms is ~11.6 days.
    if (auto v = c.number("arrival_ms", true, 0.0, k_max_ms, false,
                          "a number in [0, 1e9]: the arrival offset in ms from the start of the run"))
        r.arrival_ms = *v;
    if (auto v = c.string("tenant", false, true, "the tenant's name")) r.tenant = *v;
    if (auto v = c.string("bucket", false, false, "the bucket hint, e.g. \"short_qa\"")) r.bucket = *v;
    if (auto v = c.string("session", false, true, "the agent session's id")) r.session = *v;
    if (auto v = c.integer("turn", false, 1, std::numeric_limits<int>::max(),
                           "an integer >= 1: the turn within the session"))
        r.turn = (int)*v;
    if (!c.failed() && c.has("turn") && r.session.empty())
        c.fail("turn is given without a session; add \"session\": \"<id>\" or drop turn");
    if (!c.failed() && !r.session.empty() && !c.has("turn"))
        c.fail("session \"" + r.session + "\" has no turn; add \"turn\": 1 (then 2, 3, ... for later turns)");

    int n_prompts = (int)c.has("prompt") + (int)c.has("prompt_ids") + (int)c.has("segments");
    if (!c.failed() && c.has("tool_call")) {
        if (n_prompts > 0)
            c.fail("tool_call is given with a prompt; a tool call's result is the turn's content: drop prompt, "
                   "prompt_ids and segments, or drop tool_call");
        else if (r.session.empty() || r.turn < 2)
            c.fail("tool_call is on a request that is not a later turn of a session; a tool call's result is the new "
                   "content of turn 2, 3, ... of a session: add \"session\" and \"turn\" >= 2, or drop tool_call");
        else
            parse_tool_call(c.at("tool_call"), c, r);
    } else if (!c.failed() && n_prompts == 0) {
        c.fail(
            "prompt is missing; give one of prompt (text), prompt_ids (token ids) or segments "
            "(a shared segment plus text), or tool_call (a later agent turn)");
    }
    if (!c.failed() && n_prompts > 1)
        c.fail("more than one of prompt, prompt_ids, segments is given; keep exactly one");
    if (!c.failed() && c.has("prompt")) {
        r.prompt_kind = PromptKind::TEXT;
        if (auto v = c.string("prompt", true, false, "the prompt text")) r.prompt = *v;
    }
    if (!c.failed() && c.has("prompt_ids")) {
        r.prompt_kind = PromptKind::IDS;
        const json& ids = c.at("prompt_ids");
        if (!ids.is_array()) {
            c.fail("prompt_ids is " + shown(ids) + "; it must be an array of token ids (integers >= 0)");
        } else {
            for (size_t i = 0; i < ids.size() && !c.failed(); ++i) {
                const json& v = ids[i];
                bool ok = v.is_number_integer() &&
                          (v.is_number_unsigned()
                               ? v.get<uint64_t>() <= (uint64_t)std::numeric_limits<int32_t>::max()
                               : v.get<int64_t>() >= 0 && v.get<int64_t>() <= std::numeric_limits<int32_t>::max());
                if (!ok)
                    c.fail("prompt_ids[" + std::to_string(i) + "] is " + shown(v) +
                           "; it must be a token id, an integer in [0, 2^31)");
                else
                    r.prompt_ids.push_back((int32_t)v.get<int64_t>());
            }
        }
    }
    if (!c.failed() && c.has("segments")) {
        r.prompt_kind = PromptKind::SEGMENTS;
        const json& segs = c.at("segments");
        if (segs.is_object()) {
            if (auto p = parse_part(segs, w, c, 0)) r.segments.push_back(*p);
        } else if (segs.is_array() && !segs.empty()) {
            for (size_t i = 0; i < segs.size() && !c.failed(); ++i)
                if (auto p = parse_part(segs[i], w, c, i)) r.segments.push_back(*p);
        } else {
            c.fail("segments is " + shown(segs) +
                   "; it must be an object {\"shared\": \"<segment>\", \"text\": \"...\"} "
                   "or a non-empty array of them");
        }
    }

    if (!c.failed() && c.has("documents")) {
        const json& d = c.at("documents");
        if (!d.is_array() || d.empty() || d.size() > k_max_request_documents) {
            c.fail("documents is " + shown(d) +
                   "; it must be an array of 1 to 16 names of documents defined in header lines "
                   "{\"document\": \"<name>\", \"text\": \"...\"}");
        } else if (r.prompt_kind == PromptKind::IDS) {
            c.fail("documents is given with prompt_ids; documents are inlined as text: give prompt or segments, or "
                   "drop documents");
        } else {
            for (size_t i = 0; i < d.size() && !c.failed(); ++i) {
                const std::string where = "documents[" + std::to_string(i) + "]";
                if (!d[i].is_string() || d[i].get_ref<const std::string&>().empty()) {
                    c.fail(where + " is " + shown(d[i]) + "; it must be the name of a document defined in a header line");
                    break;
                }
                const std::string name = d[i].get<std::string>();
                if (!w.find_document(name))
                    c.fail(where + " names document \"" + name + "\", which is not defined; add a header line "
                           "{\"document\": \"" + name + "\", \"text\": \"...\"} at the top of the file or fix the name");
                else if (std::find(r.documents.begin(), r.documents.end(), name) != r.documents.end())
                    c.fail("documents lists \"" + name + "\" twice; list each document once");
                else
                    r.documents.push_back(name);
            }
        }
    }
    if (auto v = c.integer("documents_at", false, 0, std::numeric_limits<int>::max(),
                           "an integer >= 0: the segments entry the documents stand before (0: right after the "
                           "leading shared segments)")) {
        r.documents_at = (int)*v;
        if (!c.failed() && !c.has("documents"))
            c.fail("documents_at is given without documents; add documents or drop documents_at");
    }
    if (auto v = c.integer("max_tokens", true, 1, std::numeric_limits<int>::max(),
                           "an integer >= 1: the most tokens to generate"))
        r.max_tokens = (int)*v;
    if (auto v = c.number("temperature", false, 0.0, 1e6, false, "a number >= 0 (0 is greedy)")) r.temperature = *v;
    if (auto v = c.number("top_p", false, 0.0, 1.0, true, "a number in (0, 1] (1 is off)")) r.top_p = *v;
    if (c.has("seed")) {
        const json& v = c.at("seed");
        if (v.is_number_unsigned())
            r.seed = v.get<uint64_t>();
        else
            c.fail("seed is " + shown(v) + "; it must be an integer >= 0");
    }
    if (auto v = c.boolean("tools", "whether the request offers tools")) r.tools = *v;
    if (c.has("response_format")) {
        const json& v = c.at("response_format");
        if (v == "json")
            r.response_json = true;
        else if (v != "text")
            c.fail("response_format is " + shown(v) + "; it must be \"json\" or \"text\" (or left out)");
    }
    if (auto v = c.number("tool_pause_ms", false, 0.0, k_max_ms, false,
                          "a number in [0, 1e9]: the pause in ms after this turn before the next"))
        r.tool_pause_ms = *v;
    if (auto v = c.string("public_prefix", false, true,
                          "the name of the declared-public shared segment the prompt opens with")) {
        r.public_prefix = *v;
        if (!w.find_segment(r.public_prefix))
            c.fail("public_prefix names segment \"" + r.public_prefix +
                   "\", which is not defined; define it in a header line at the top of the file or fix the name");
        else if (r.prompt_kind != PromptKind::SEGMENTS || r.segments.empty() || r.segments[0].shared != r.public_prefix)
            c.fail("public_prefix is \"" + r.public_prefix +
                   "\" but the prompt does not open with it; make segments[0].shared \"" + r.public_prefix +
                   "\" or drop public_prefix");
    }
    if (c.failed()) {
        err = c.error();
        return std::nullopt;
    }
    return r;
}

}  // namespace

Expected<Workload> parse_workload(std::string_view jsonl) {
    Workload w;
    std::set<std::string, std::less<>> names;
    std::map<std::pair<std::string, std::string>, int> last_turn;  // (tenant, session) -> last turn seen
    int line_no = 0;
    size_t pos = 0;
    while (pos < jsonl.size()) {
        size_t end = jsonl.find('\n', pos);
        if (end == std::string_view::npos) end = jsonl.size();
        std::string_view line = jsonl.substr(pos, end - pos);
        pos = end + 1;
        ++line_no;
        auto prefix = [&] { return "workload line " + std::to_string(line_no) + ": "; };
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;

        json j;
        try {
            j = json::parse(line);
        } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past double (1e999)
            std::string what = e.what();
            size_t cut = what.find("] ");
            if (cut != std::string::npos) what = what.substr(cut + 2);
            // nlohmann counts lines within the one line it was given; only the column helps.
            size_t at = what.find("at line 1, column");
            if (at != std::string::npos) what.replace(at, 17, "at column");
            return make_error(prefix(), "not valid JSON (", what,
                              "); each line must be one JSON object, e.g. {\"arrival_ms\": 0, \"prompt\": \"hi\", "
                              "\"max_tokens\": 16}");
        }
        if (!j.is_object())
            return make_error(prefix(), "is ", shown(j), ", not a JSON object; each line must be one object");

        if (j.contains("segment")) {
            LineChecker c(j, line_no);
            auto name = c.string("segment", true, true, "the segment's name");
            auto text = c.string("text", true, false, "the segment's text");
            if (!c.failed() && !w.requests.empty())
                c.fail("segment \"" + *name +
                       "\" comes after the first request line; move segment lines to the top of the file");
            if (!c.failed() && names.count(*name))
                c.fail("segment \"" + *name + "\" is defined twice; give each segment a unique name");
            if (c.failed()) return c.error();
            names.insert(*name);
            w.segments.push_back({*name, *text});
            continue;
        }
        if (j.contains("document")) {
            LineChecker c(j, line_no);
            auto name = c.string("document", true, true, "the document's name");
            if (!c.failed() && !valid_document_name(*name))
                c.fail("document is " + shown(j.at("document")) +
                       "; a document's name is 1-256 characters of letters, digits and . _ : -");
            auto text = c.string("text", true, true, "the document's text");
            auto version = c.integer("version", false, 1, std::numeric_limits<int64_t>::max(),
                                     "an integer >= 1: the document's version (default 1)");
            if (!c.failed() && !w.requests.empty())
                c.fail("document \"" + *name +
                       "\" comes after the first request line; move document lines to the top of the file");
            if (!c.failed() && w.find_document(*name))
                c.fail("document \"" + *name + "\" is defined twice; give each document a unique name");
            if (c.failed()) return c.error();
            w.documents.push_back({*name, *text, version.value_or(1)});
            continue;
        }
        Error err;
        auto r = parse_request(j, w, line_no, err);
        if (!r) return err;
        if (!r->session.empty()) {
            // Sessions are scoped by tenant (two tenants' "s1" are two conversations); within one,
            // turns come in file order as 1, 2, 3, ... with none missing.
            int& last = last_turn[{r->tenant, r->session}];
            if (r->turn != last + 1)
                return make_error(prefix(), "turn ", std::to_string(r->turn), " of session \"", r->session, "\" (tenant \"",
                                  r->tenant, "\") comes after ",
                                  last ? "turn " + std::to_string(last) : std::string("no earlier turn"), "; number a session's turns 1, 2, 3, ... in file order (turn ",
                                  std::to_string(last + 1), " is missing or out of order)");
            last = r->turn;
        }
        w.requests.push_back(std::move(*r));
    }
    return w;
}

const std::string& SessionConversations::open_turn(const std::string& tenant, const std::string& session,
                                                   const std::string& text) {
    std::string& c = text_[{tenant, session}];
    c += (c.empty() ? "" : " ") + text;
    return c;
}

void SessionConversations::close_turn(const std::string& tenant, const std::string& session, const std::string& output) {
    text_[{tenant, session}] += output;
}

Expected<Workload> read_workload_file(const std::string& path) {
    auto text = read_regular_file(path, k_max_workload_bytes, "workload file");  // a FIFO never blocks
    if (!text) return text.error();
    auto w = parse_workload(*text);
    if (!w) return make_error(path, ": ", w.error().message);
    return w;
}

// ---------------------------------------------------------------------------------------------
// Writing

std::string write_workload(const Workload& w) {
    using ojson = nlohmann::ordered_json;
    std::string out;
    for (const WorkloadSegment& s : w.segments) {
        ojson j;
        j["segment"] = s.name;
        j["text"] = s.text;
        out += j.dump() + "\n";
    }
    for (const WorkloadDocument& d : w.documents) {
        ojson j;
        j["document"] = d.name;
        j["text"] = d.text;
        if (d.version != 1) j["version"] = d.version;
        out += j.dump() + "\n";
    }
    for (const WorkloadRequest& r : w.requests) {
        ojson j;
        j["arrival_ms"] = r.arrival_ms;
        j["tenant"] = r.tenant;
        if (!r.bucket.empty()) j["bucket"] = r.bucket;
        if (!r.session.empty()) {
            j["session"] = r.session;
            j["turn"] = r.turn;
        }
        switch (r.prompt_kind) {
            case PromptKind::TEXT:
                if (r.tool_call) {
                    ojson tc;
                    tc["tool"] = r.tool_call->tool;
                    tc["arguments"] = ojson::parse(r.tool_call->arguments);
                    tc["result"] = r.prompt;
                    if (r.tool_call->ttl_s != 600.0) tc["ttl_s"] = r.tool_call->ttl_s;
                    j["tool_call"] = tc;
                } else {
                    j["prompt"] = r.prompt;
                }
                break;
            case PromptKind::IDS: j["prompt_ids"] = r.prompt_ids; break;
            case PromptKind::SEGMENTS: {
                ojson parts = ojson::array();
                for (const PromptPart& p : r.segments) {
                    ojson part = ojson::object();
                    if (!p.shared.empty()) part["shared"] = p.shared;
                    if (!p.text.empty() || p.shared.empty()) part["text"] = p.text;
                    parts.push_back(part);
                }
                j["segments"] = parts;
                break;
            }
        }
        if (!r.documents.empty()) {
            j["documents"] = r.documents;
            if (r.documents_at != 0) j["documents_at"] = r.documents_at;
        }
        j["max_tokens"] = r.max_tokens;
        if (r.temperature != 0.0) j["temperature"] = r.temperature;
        if (r.top_p != 1.0) j["top_p"] = r.top_p;
        if (r.seed) j["seed"] = *r.seed;
        if (r.tools) j["tools"] = true;
        if (r.response_json) j["response_format"] = "json";
        if (r.tool_pause_ms != 0.0) j["tool_pause_ms"] = r.tool_pause_ms;
        if (!r.public_prefix.empty()) j["public_prefix"] = r.public_prefix;
        out += j.dump() + "\n";
    }
    return out;
}

std::optional<Error> write_workload_file(const Workload& w, const std::string& path) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f)
        return make_error("cannot write workload file '", path, "': ", std::strerror(errno),
                          "; check the folder exists and is writable");
    f << write_workload(w);
    f.close();
    if (!f) return make_error("writing workload file '", path, "' failed; check the free space");
    return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Generating

const std::vector<std::string>& workload_words() {
    static const std::vector<std::string> words = {
        // The synthetic tokenizer's whole words first (runtime/model/synth.cpp), then common ones.
        "the",    "of",      "and",    "to",       "in",     "is",     "was",    "that",    "for",    "on",     "with",
        "as",     "it",      "by",     "at",       "from",   "his",    "her",    "an",      "were",   "are",    "which",
        "this",   "be",      "or",     "had",      "not",    "one",    "but",    "they",    "first",  "new",    "after",
        "who",    "their",   "has",    "two",      "been",   "also",   "its",    "there",   "into",   "time",   "would",
        "when",   "more",    "other",  "all",      "during", "some",   "can",    "will",    "model",  "token",  "cache",
        "data",   "request", "answer", "question", "story",  "once",   "upon",   "little",  "said",   "day",    "happy",
        "friend", "play",    "went",   "saw",      "big",    "very",   "dog",    "cat",     "tree",   "house",  "sun",
        "water",  "light",   "world",  "people",   "work",   "system", "memory", "block",   "value",  "agent",  "tool",
        "call",   "result",  "json",   "name",     "type",   "list",   "number", "string",  "true",   "false",  "null",
        "a",      "you",     "he",     "she",      "we",     "have",   "do",     "say",     "get",    "make",   "go",
        "know",   "take",    "see",    "come",     "think",  "look",   "want",   "give",    "use",    "find",   "tell",
        "ask",    "seem",    "feel",   "try",      "leave",  "keep",   "let",    "begin",   "help",   "show",   "hear",
        "run",    "move",    "live",   "believe",  "bring",  "write",  "read",   "learn",   "change", "follow", "stop",
        "open",   "walk",    "win",    "grow",     "good",   "old",    "great",  "high",    "small",  "large",  "long",
        "young",  "right",   "early",  "last",     "own",    "same",   "able",   "year",    "way",    "man",    "woman",
        "child",  "life",    "hand",   "part",     "place",  "case",   "week",   "company", "point",  "home",   "room",
        "school", "state",   "city",   "night",    "book",   "word",   "door",   "car",     "food",   "road",   "river",
        "table",  "paper",   "music",  "game",     "idea",   "plan",   "level",  "group",   "money",  "story",  "fact",
        "line",   "end",     "side",   "kind",     "head",   "eye",    "face",   "mind",    "power",  "town",   "now",
        "then",   "here",    "only",   "just",     "well",   "still",  "never",  "always",  "often",  "again",  "soon",
        "how",    "what",    "where",  "why",      "each",   "every",  "many",   "much",    "few",    "most",   "any",
        "such"};
    return words;
}

int count_words(std::string_view s) {
    int n = 0;
    bool in_word = false;
    for (char ch : s) {
        bool space = ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r';
        if (!space && !in_word) ++n;
        in_word = !space;
    }
    return n;
}

namespace {

// Only raw mt19937_64 output is used: std distributions differ between standard libraries.
class GenRng {
public:
    explicit GenRng(uint64_t seed) : rng_(seed) {}
    uint64_t next() { return rng_(); }
    double uniform() { return (double)(rng_() >> 11) * 0x1.0p-53; }  // [0, 1)
    int range(int lo, int hi) {                                      // [lo, hi]
        return lo + (int)std::min<double>(std::floor(uniform() * (double)(hi - lo + 1)), hi - lo);
    }
    double exponential(double mean) { return -mean * std::log1p(-uniform()); }
    size_t pick(const std::vector<double>& weights) {
        double total = 0.0;
        for (double w : weights) total += w;
        double x = uniform() * total;
        size_t last = weights.size() - 1;  // the last with a positive weight (rounding lands there)
        for (size_t i = 0; i < weights.size(); ++i) {
            if (weights[i] > 0) last = i;
            if (x < weights[i]) return i;
            x -= weights[i];
        }
        return last;
    }
    std::string words(int n) {
        const auto& list = workload_words();
        std::string s;
        for (int i = 0; i < n; ++i) {
            if (i) s += ' ';
            s += list[(size_t)range(0, (int)list.size() - 1)];
        }
        return s;
    }

private:
    std::mt19937_64 rng_;
};

enum Bucket { SHORT_QA, LONG_DOC, LONG_OUTPUT, AGENT, HIGH_TEMP, STRUCTURED, RAG, N_BUCKETS };
constexpr const char* k_bucket_names[N_BUCKETS] = {"short_qa", "long_doc",   "long_output", "agent",
                                                   "high_temp", "structured", "rag"};
// Share of new draws (agent sessions then add 2-3 more lines each: ~20% of lines are agent turns).
// rag is last and at 0: a zero weight never takes a draw, so the standard workload stays as it was.
const std::vector<double> k_bucket_weights = {0.33, 0.15, 0.12, 0.07, 0.13, 0.20, 0.0};
const std::vector<double> k_tenant_weights = {0.4, 0.3, 0.2, 0.1};
constexpr const char* k_tenants[4] = {"tenant-a", "tenant-b", "tenant-c", "tenant-d"};
constexpr int n_docs = 3;
constexpr int n_schemas = 2;
// The rag bucket's shared document set (header lines doc-0..doc-11) and its popularity law: the
// document of rank k (doc-(k-1)) is drawn with probability ∝ 1/k^s, without replacement per request.
constexpr int k_rag_documents = 12;
constexpr double k_rag_zipf_s = 1.1;
// The agent tools' calls (agent_tools): per tool its argument name and values, the tools drawn by
// weight, the values with Zipf popularity (exponent k_tool_zipf_s).
struct ToolSpec {
    const char* tool;
    const char* arg;
    std::vector<const char*> values;
};
const std::vector<ToolSpec> k_tools = {
    {"get_weather", "city", {"Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth"}},
    {"read_file",
     "path",
     {"src/main.cpp", "src/util.h", "README.md", "docs/api.md", "config.toml", "tests/test_main.cpp", "Makefile",
      "src/server.cpp"}},
    {"search",
     "query",
     {"cache eviction policy", "kv block size", "speculative decoding", "prefix cache hit rate", "tool result reuse",
      "tenant quota", "json schema output", "agent session memory", "document retrieval", "request routing"}},
};
const std::vector<double> k_tool_weights = {0.5, 0.3, 0.2};
constexpr double k_tool_zipf_s = 1.1;

// 1/k^s for k = 1..n.
std::vector<double> zipf_weights(int n, double s) {
    std::vector<double> w((size_t)n);
    for (int k = 1; k <= n; ++k) w[(size_t)k - 1] = 1.0 / std::pow((double)k, s);
    return w;
}

uint64_t fnv1a(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}
// How long the generator assumes an agent turn runs before its pause starts (the runner waits for
// the real finish anyway; this only spreads turns out over the arrival process).
constexpr double k_agent_turn_allowance_ms = 500.0;

double round_us(double ms) {
    return std::round(ms * 1000.0) / 1000.0;
}

std::vector<double> arrivals_ms(const WorkloadGenParams& p, GenRng& rng) {
    std::vector<double> t((size_t)std::max(0, p.n_requests));
    double rate = p.rate > 0 ? p.rate : 1.0;
    double now = 0.0;
    if (!p.burst) {
        for (double& x : t) x = (now += rng.exponential(1000.0 / rate));
    } else {
        // Bursts of k requests 1/(20·rate) apart on average; the gap before a burst makes the mean
        // gap over the burst exactly 1/rate: k/rate = inter + (k - 1)·intra.
        double intra = 1000.0 / (20.0 * rate);
        size_t i = 0;
        while (i < t.size()) {
            int k = rng.range(4, 12);
            double inter = k * 1000.0 / rate - (k - 1) * intra;
            for (int j = 0; j < k && i < t.size(); ++j, ++i) t[i] = (now += rng.exponential(j == 0 ? inter : intra));
        }
    }
    for (double& x : t) x = round_us(x);
    return t;
}

int scaled(int words, double scale) {
    return std::max(1, (int)std::lround(words * scale));
}

std::string schema_text(GenRng& rng, int n_words) {
    // JSON-like lines of two words each: "field": type
    static const char* types[] = {"string", "number", "true", "false", "null", "list"};
    std::string s = "{";
    for (int i = 0; i + 1 < n_words; i += 2) {
        s += "\"" + rng.words(1) + "\": " + types[rng.range(0, 5)];
        s += i + 3 < n_words ? ", " : "";
    }
    if (n_words % 2) s += " end";
    return s + "}";
}

struct PendingTurn {
    std::string session;
    std::string tenant;
    int turn = 0;  // the next turn to emit
    int n_turns = 0;
    double ready_ms = 0.0;
    int repeats = -1;  // agent_repeat: the index of the session this one repeats (-1: none)
    int index = -1;    // this session's index in the generator's record of sessions
};

// What a generated agent session was, turn by turn (agent_repeat replays it).
struct SessionRecord {
    std::string tenant;
    std::vector<std::string> prompts;  // turn 1: the task line; later turns: the tool result
    std::vector<std::optional<WorkloadToolCall>> calls;
    std::vector<int> max_tokens;
};

}  // namespace

namespace {

// The bucket weights of p: the standard mix with the ones p.mix names replaced (the checks of
// check_workload_gen's --mix).
Expected<std::vector<double>> bucket_weights(const WorkloadGenParams& p) {
    std::vector<double> w = k_bucket_weights;
    for (const auto& [name_, v] : p.mix) {
        const std::string& name = name_;  // a lambda may not capture a structured binding (Clang 14)
        const auto* it = std::find_if(std::begin(k_bucket_names), std::end(k_bucket_names),
                                      [&](const char* n) { return name == n; });
        if (it == std::end(k_bucket_names))
            return make_error("--mix names bucket '", name, "'; give short_qa, long_doc, long_output, agent, high_temp, structured or rag");
        if (!std::isfinite(v) || v < 0) return make_error("--mix ", name, "=", v, "; a weight is a number >= 0");
        w[(size_t)(it - std::begin(k_bucket_names))] = v;
    }
    if (std::all_of(w.begin(), w.end(), [](double x) { return x == 0; }))
        return make_error("--mix leaves every bucket at weight 0; give at least one a positive weight");
    return w;
}

}  // namespace

Expected<bool> check_workload_gen(const WorkloadGenParams& p) {
    if (p.n_requests < 1 || p.n_requests > 1000000)
        return make_error("--requests is ", p.n_requests, "; give 1 to 1000000 requests");
    if (!std::isfinite(p.rate) || p.rate <= 0 || p.rate > 100000)
        return make_error("--rate is ", p.rate, "; give a rate in (0, 100000] requests per second");
    if (!std::isfinite(p.scale) || p.scale <= 0 || p.scale > 64)
        return make_error("--scale is ", p.scale, "; give a scale in (0, 64] (it multiplies prompt and output lengths)");
    if (auto w = bucket_weights(p); !w) return w.error();
    if (!std::isfinite(p.agent_repeat) || p.agent_repeat < 0 || p.agent_repeat > 1)
        return make_error("--agent-repeat is ", p.agent_repeat, "; give a share in [0, 1] of agent sessions that repeat an earlier one");
    if (p.agent_turns < 0 || p.agent_turns > 64)
        return make_error("--agent-turns is ", p.agent_turns, "; give 0 (the standard 3 or 4) or 1 to 64 turns per agent session");
    if (!std::isfinite(p.tool_pause_ms) || p.tool_pause_ms < 0 || p.tool_pause_ms > 3600e3)
        return make_error("--tool-pause-ms is ", p.tool_pause_ms, "; give 0 (the standard 50-300 ms) up to 3600000 ms");
    if (!std::isfinite(p.volatile_share) || p.volatile_share < 0 || p.volatile_share > 1)
        return make_error("--volatile-share is ", p.volatile_share, "; give a share in [0, 1] of the prompts that carry the volatile line");
    return true;
}

Workload generate_workload(const WorkloadGenParams& p) {
    GenRng rng(p.seed);
    Workload w;
    const double scale = p.scale > 0 ? p.scale : 1.0;
    const int n_tenants = std::clamp(p.n_tenants, 1, 4);
    std::vector<double> tenant_weights(k_tenant_weights.begin(), k_tenant_weights.begin() + n_tenants);

    // Shared segments, each ending in a newline so the parts of a prompt stay apart.
    w.segments.push_back({"sys-public", rng.words(scaled(64, scale)) + "\n"});
    for (int t = 0; t < n_tenants; ++t)
        w.segments.push_back({std::string("sys-") + k_tenants[t], rng.words(scaled(64, scale)) + "\n"});
    for (int t = 0; t < n_tenants; ++t)
        w.segments.push_back({std::string("tools-") + k_tenants[t], schema_text(rng, scaled(192, scale)) + "\n"});
    for (int d = 0; d < n_docs; ++d)
        w.segments.push_back({"doc-" + std::to_string(d), rng.words(scaled(rng.range(512, 768), scale)) + "\n"});
    for (int s = 0; s < n_schemas; ++s)
        w.segments.push_back({"schema-" + std::to_string(s), schema_text(rng, scaled(128, scale)) + "\n"});

    const std::vector<double> t_ms = arrivals_ms(p, rng);
    const int n = (int)t_ms.size();
    std::vector<PendingTurn> pending;  // one entry per open agent session: its next turn
    int owed = 0;                      // agent turns still to emit over all open sessions
    int n_sessions = 0;
    std::vector<SessionRecord> sessions;  // every agent session so far (agent_repeat)
    // Repetition's own draws, so that its decisions do not move the other draws.
    GenRng reprng(p.seed ^ 0x6167656e742d7270ull);  // "agent-rp"
    // The mix (the standard one when p was not checked); the first draws cover each bucket with a
    // positive weight once.
    const auto checked = bucket_weights(p);
    const std::vector<double> weights_of_mix = checked ? checked.value() : k_bucket_weights;
    std::vector<int> cover;
    for (int b : {SHORT_QA, LONG_DOC, LONG_OUTPUT, AGENT, HIGH_TEMP, STRUCTURED, RAG})
        if (weights_of_mix[(size_t)b] > 0) cover.push_back(b);
    // The rag bucket's documents, from a stream of their own (the other draws stay as they are).
    if (weights_of_mix[RAG] > 0) {
        GenRng drng(p.seed ^ 0x7261672d646f6373ull);  // "rag-docs"
        for (int d = 0; d < k_rag_documents; ++d)
            w.documents.push_back({"doc-" + std::to_string(d), drng.words(scaled(drng.range(192, 320), scale)), 1});
    }
    const std::vector<double> rag_popularity = zipf_weights(k_rag_documents, k_rag_zipf_s);
    // A tool call's result: a function of (seed, tool, arguments) alone, so a repeated call gets the
    // same result wherever it comes.
    auto tool_result = [&](const WorkloadToolCall& tc) {
        GenRng trng(p.seed ^ fnv1a(tc.tool + '\x1f' + tc.arguments));
        return "tool result: " + trng.words(scaled(trng.range(32, 96), scale) - 2) + "\n";
    };
    for (size_t i = cover.size(); i > 1; --i) std::swap(cover[i - 1], cover[(size_t)rng.range(0, (int)i - 1)]);
    size_t n_covered = 0;

    auto tool_pause = [&]() {
        if (p.tool_pause_ms <= 0) return (double)rng.range(50, 300);
        return p.tool_pause_ms * (0.5 + rng.range(0, 1000) / 1000.0);
    };
    auto volatile_line = [&](int i, double at_ms) {
        long long s = (long long)(at_ms / 1000.0);
        char buf[96];
        std::snprintf(buf, sizeof buf, "request %06d at 2025-01-01T%02lld:%02lld:%02lld.%03dZ\n", i, (s / 3600) % 24,
                      (s / 60) % 60, s % 60, (int)std::fmod(at_ms, 1000.0));
        return std::string(buf);
    };

    for (int i = 0; i < n; ++i) {
        const double now = t_ms[(size_t)i];
        WorkloadRequest r;
        r.arrival_ms = now;
        r.seed = rng.next() >> 32;

        // A pending agent turn takes this arrival when it is ready, or when the arrivals left are
        // only enough for the turns owed.
        auto next = std::min_element(pending.begin(), pending.end(), [](const PendingTurn& a, const PendingTurn& b) {
            return a.ready_ms < b.ready_ms;
        });
        if (next != pending.end() && (next->ready_ms <= now || owed >= n - i)) {
            r.bucket = "agent";
            r.tenant = next->tenant;
            r.session = next->session;
            r.turn = next->turn;
            r.prompt_kind = PromptKind::TEXT;
            const SessionRecord* src = next->repeats >= 0 ? &sessions[(size_t)next->repeats] : nullptr;
            const size_t at = (size_t)next->turn - 1;
            if (src && at < src->prompts.size()) {  // the repeated session's turn: the same call and result
                r.prompt = src->prompts[at];
                r.tool_call = src->calls[at];
                r.max_tokens = src->max_tokens[at];
            } else if (p.agent_tools) {  // a repeated idempotent call: tool by weight, argument by Zipf popularity
                const ToolSpec& t = k_tools[rng.pick(k_tool_weights)];
                const size_t a = rng.pick(zipf_weights((int)t.values.size(), k_tool_zipf_s));
                WorkloadToolCall tc;
                tc.tool = t.tool;
                tc.arguments = nlohmann::json{{t.arg, t.values[a]}}.dump();
                r.prompt = tool_result(tc);
                r.tool_call = std::move(tc);
            } else {
                r.prompt = "tool result: " + rng.words(scaled(rng.range(32, 96), scale) - 2) + "\n";
            }
            if (!src || at >= src->prompts.size()) r.max_tokens = scaled(rng.range(16, 32), scale);
            r.tools = true;
            if (next->index >= 0) {
                SessionRecord& rec = sessions[(size_t)next->index];
                rec.prompts.push_back(r.prompt);
                rec.calls.push_back(r.tool_call);
                rec.max_tokens.push_back(r.max_tokens);
            }
            --owed;
            if (next->turn < next->n_turns) {
                r.tool_pause_ms = tool_pause();
                next->ready_ms = now + r.tool_pause_ms + k_agent_turn_allowance_ms;
                ++next->turn;
            } else {
                pending.erase(next);
            }
            w.requests.push_back(std::move(r));
            continue;
        }

        int bucket = n_covered < cover.size() ? cover[n_covered++] : (int)rng.pick(weights_of_mix);
        int n_turns = bucket == AGENT ? rng.range(3, 4) : 0;
        if (bucket == AGENT && p.agent_turns > 0) n_turns = p.agent_turns;
        if (bucket == AGENT && owed + n_turns > n - i) n_turns = p.agent_turns > 0 ? std::max(1, n - i - owed) : 3;
        if (bucket == AGENT && owed + n_turns > n - i) {
            std::vector<double> weights = weights_of_mix;
            weights[AGENT] = 0.0;
            bucket = (int)rng.pick(weights);
        }
        r.bucket = k_bucket_names[bucket];
        r.tenant = k_tenants[rng.pick(tenant_weights)];
        r.public_prefix = "sys-public";
        r.prompt_kind = PromptKind::SEGMENTS;
        const std::string sys_tenant = "sys-" + r.tenant;
        bool is_volatile = (bucket == SHORT_QA || bucket == LONG_OUTPUT || bucket == HIGH_TEMP) && rng.uniform() < p.volatile_share;
        PromptPart head{"sys-public", is_volatile && !p.volatile_late ? volatile_line(i, now) : std::string()};
        switch (bucket) {
            case SHORT_QA:
                r.segments = {head, {sys_tenant, "question: " + rng.words(scaled(rng.range(16, 48), scale) - 1) + "?"}};
                r.max_tokens = scaled(rng.range(16, 32), scale);
                r.temperature = rng.uniform() < 0.3 ? 0.2 : 0.0;
                break;
            case LONG_DOC:
                r.segments = {head,
                              {"doc-" + std::to_string(rng.range(0, n_docs - 1)),
                               "question: " + rng.words(scaled(32, scale) - 1) + "?"}};
                r.max_tokens = scaled(rng.range(16, 32), scale);
                r.temperature = 0.2;
                break;
            case LONG_OUTPUT:
                r.segments = {head, {sys_tenant, "write a long list: " + rng.words(scaled(64, scale) - 4)}};
                r.max_tokens = scaled(rng.range(128, 256), scale);
                r.temperature = 0.3;
                break;
            case AGENT: {
                std::string session = "s-" + std::to_string(n_sessions++);
                r.session = session;
                r.turn = 1;
                r.tools = true;
                std::string task = "task: " + rng.words(scaled(32, scale) - 1) + "\n";
                r.max_tokens = scaled(rng.range(16, 32), scale);
                int repeats = -1;
                if (p.agent_repeat > 0 && reprng.uniform() < p.agent_repeat) {
                    // An earlier session of this tenant (one of its last 8), its task again, half the
                    // time with one word edited.
                    std::vector<int> own;
                    for (int k = (int)sessions.size() - 1; k >= 0 && own.size() < 8; --k)
                        if (sessions[(size_t)k].tenant == r.tenant) own.push_back(k);
                    if (!own.empty()) {
                        repeats = own[(size_t)reprng.range(0, (int)own.size() - 1)];
                        const SessionRecord& src = sessions[(size_t)repeats];
                        task = src.prompts[0];
                        r.max_tokens = src.max_tokens[0];
                        if (reprng.uniform() < 0.5) {
                            std::vector<size_t> spaces;
                            for (size_t c = 0; c < task.size(); ++c)
                                if (task[c] == ' ') spaces.push_back(c);
                            if (!spaces.empty()) {
                                const size_t from = spaces[(size_t)reprng.range(0, (int)spaces.size() - 1)] + 1;
                                size_t to = task.find_first_of(" \n", from);
                                if (to == std::string::npos) to = task.size();
                                task.replace(from, to - from, reprng.words(1));
                            }
                        }
                    }
                }
                r.segments = {head, {"tools-" + r.tenant, task}};
                r.tool_pause_ms = tool_pause();
                if (p.agent_repeat > 0) {
                    sessions.push_back({r.tenant, {task}, {std::nullopt}, {r.max_tokens}});
                }
                pending.push_back({session, r.tenant, 2, n_turns, now + r.tool_pause_ms + k_agent_turn_allowance_ms, repeats,
                                   p.agent_repeat > 0 ? (int)sessions.size() - 1 : -1});
                owed += n_turns - 1;
                break;
            }
            case HIGH_TEMP:
                r.segments = {head, {sys_tenant, "tell a story: " + rng.words(scaled(64, scale) - 3)}};
                r.max_tokens = scaled(rng.range(48, 96), scale);
                r.temperature = 1.0 + rng.range(0, 30) / 100.0;
                r.top_p = 0.95;
                break;
            case STRUCTURED:
                r.segments = {head,
                              {"schema-" + std::to_string(rng.range(0, n_schemas - 1)),
                               "fill the schema for: " + rng.words(scaled(64, scale) - 4)}};
                r.max_tokens = scaled(rng.range(48, 96), scale);
                r.response_json = true;
                break;
            case RAG: {
                // 2-3 of the shared documents, by popularity, without replacement.
                std::vector<double> left = rag_popularity;
                const int k = rng.range(2, 3);
                for (int j = 0; j < k; ++j) {
                    const size_t d = rng.pick(left);
                    left[d] = 0.0;
                    r.documents.push_back("doc-" + std::to_string(d));
                }
                r.segments = {head, {sys_tenant, ""}, {"", "question: " + rng.words(scaled(rng.range(16, 32), scale) - 1) + "?"}};
                r.max_tokens = scaled(rng.range(16, 32), scale);
                // Inlined as listed (reuse off): right after the system prompts (0), between them (1),
                // before the question (2) or after it (3).
                r.documents_at = rng.range(0, 3);
                break;
            }
        }
        if (is_volatile && p.volatile_late) r.segments.back().text += "\n" + volatile_line(i, now);
        w.requests.push_back(std::move(r));
    }
    return w;
}

Expected<std::map<std::string, double>> parse_workload_mix(const std::string& spec) {
    std::map<std::string, double> mix;
    for (const std::string& item : split_list(spec)) {
        const size_t eq = item.find('=');
        double v = 0;
        size_t used = 0;
        try {
            if (eq != std::string::npos) v = std::stod(item.substr(eq + 1), &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (eq == std::string::npos || eq == 0 || used == 0 || used != item.size() - eq - 1)
            return make_error("--mix entry '", item, "' is not BUCKET=WEIGHT (e.g. --mix short_qa=2,agent=0)");
        mix[item.substr(0, eq)] = v;
    }
    return mix;
}

}  // namespace steward
