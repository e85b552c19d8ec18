// Tool calls in a model's output: format detection, the streaming parser and the whole-text parse.
// The streaming parser is a state machine over held-back bytes; parse_tool_calls is written
// separately over the complete text (string searches) and is what the parser is tested against.
#include "serve/tool_calls.h"

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace steward {

namespace {

constexpr std::string_view k_hermes_open = "<tool_call>";
constexpr std::string_view k_hermes_close = "</tool_call>";
constexpr std::string_view k_mistral_marker = "[TOOL_CALLS]";
constexpr std::string_view k_python_tag = "<|python_tag|>";
constexpr std::string_view k_call_head = ".call(";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_ident(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_alnum(char c) { return is_ident(c) && c != '_'; }

size_t skip_ws(std::string_view s, size_t i) {
    while (i < s.size() && is_ws(s[i])) ++i;
    return i;
}
size_t n_trailing_ws(std::string_view s) {
    size_t n = 0;
    while (n < s.size() && is_ws(s[s.size() - 1 - n])) ++n;
    return n;
}
std::string_view trim(std::string_view s) {
    size_t b = skip_ws(s, 0);
    return s.substr(b, s.size() - b - n_trailing_ws(s.substr(b)));
}
// The longest suffix of s that is a proper prefix of marker (bytes that may still become it).
size_t n_marker_prefix_suffix(std::string_view s, std::string_view marker) {
    for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
        if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
    return 0;
}

uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// {"name": N, "arguments" | "parameters": {...}} -> a call (id filled by the caller). arguments may
// also be a string holding a JSON object (Qwen's template accepts both when rendering back).
std::optional<ToolCall> call_from_json(const nlohmann::json& j) {
    if (!j.is_object()) return std::nullopt;
    auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
        return std::nullopt;
    auto args = j.find("arguments");
    if (args == j.end()) args = j.find("parameters");
    if (args == j.end()) return std::nullopt;
    ToolCall call;
    call.name = name->get<std::string>();
    if (args->is_object()) {
        call.arguments = args->dump();
    } else if (args->is_string()) {
        auto inner = nlohmann::json::parse(args->get_ref<const std::string&>(), nullptr, false);
        if (inner.is_discarded() || !inner.is_object()) return std::nullopt;
        call.arguments = args->get<std::string>();
    } else {
        return std::nullopt;
    }
    return call;
}

std::optional<ToolCall> parse_call_object(std::string_view text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return std::nullopt;
    return call_from_json(j);
}

// Mistral: a non-empty array of calls; the model's "id" is kept when it is 9 alphanumerics.
std::optional<std::vector<ToolCall>> parse_call_array(std::string_view text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array() || j.empty()) return std::nullopt;
    std::vector<ToolCall> calls;
    for (const auto& item : j) {
        auto call = call_from_json(item);
        if (!call) return std::nullopt;
        if (auto id = item.find("id"); id != item.end() && id->is_string()) {
            const auto& s = id->get_ref<const std::string&>();
            bool ok = s.size() == 9;
            for (char c : s) ok = ok && is_alnum(c);
            if (ok) call->id = s;
        }
        calls.push_back(std::move(*call));
    }
    return calls;
}

// Llama 3.1's built-in tool form after <|python_tag|>: name.call(k="v", k2=3). Values are quoted
// strings (" or ', backslash escapes) or bare JSON scalars; a bare word that is not JSON is a string.
// `text` is the whole segment from the name through the closing parenthesis.
std::optional<ToolCall> parse_python_call(std::string_view text) {
    size_t head = text.find(k_call_head);
    if (head == std::string_view::npos || head == 0 || text.back() != ')') return std::nullopt;
    ToolCall call;
    call.name = std::string(text.substr(0, head));
    for (char c : call.name)
        if (!is_ident(c)) return std::nullopt;
    std::string_view s = text.substr(head + k_call_head.size(), text.size() - head - k_call_head.size() - 1);
    nlohmann::json args = nlohmann::json::object();
    size_t i = skip_ws(s, 0);
    while (i < s.size()) {
        size_t k = i;
        while (k < s.size() && is_ident(s[k])) ++k;
        if (k == i) return std::nullopt;
        std::string key(s.substr(i, k - i));
        i = skip_ws(s, k);
        if (i >= s.size() || s[i] != '=') return std::nullopt;
        i = skip_ws(s, i + 1);
        if (i >= s.size()) return std::nullopt;
        if (s[i] == '"' || s[i] == '\'') {
            char q = s[i++];
            std::string v;
            for (; i < s.size() && s[i] != q; ++i) {
                if (s[i] == '\\' && i + 1 < s.size()) {
                    char e = s[++i];
                    v += e == 'n' ? '\n' : e == 't' ? '\t' : e;
                } else {
                    v += s[i];
                }
            }
            if (i >= s.size()) return std::nullopt;
            ++i;  // the closing quote
            args[key] = v;
        } else {
            size_t e = i;
            while (e < s.size() && s[e] != ',' && !is_ws(s[e])) ++e;
            std::string word(s.substr(i, e - i));
            auto j = nlohmann::json::parse(word, nullptr, false);
            if (!j.is_discarded() && (j.is_number() || j.is_boolean() || j.is_null()))
                args[key] = j;
            else
                args[key] = word;
            i = e;
        }
        i = skip_ws(s, i);
        if (i < s.size()) {
            if (s[i] != ',') return std::nullopt;
            i = skip_ws(s, i + 1);
        }
    }
    call.arguments = args.dump();
    return call;
}

// Where name.call(...) opened at s[0] ends: the index of its ')' outside quotes, npos while the
// text may still complete it, or `no` when it cannot be one. (Whole-text reference version.)
constexpr size_t k_no = std::string_view::npos - 1;
size_t python_call_end(std::string_view s) {
    size_t i = 0;
    while (i < s.size() && is_ident(s[i])) ++i;
    if (i == 0) return k_no;
    if (s.size() - i < k_call_head.size())
        return s.substr(i) == k_call_head.substr(0, s.size() - i) ? std::string_view::npos : k_no;
    if (s.substr(i, k_call_head.size()) != k_call_head) return k_no;
    char quote = 0;
    for (i += k_call_head.size(); i < s.size(); ++i) {
        char c = s[i];
        if (quote) {
            if (c == '\\') ++i;
            else if (c == quote) quote = 0;
        } else if (c == '"' || c == '\'') {
            quote = c;
        } else if (c == ')') {
            return i;
        }
    }
    return std::string_view::npos;
}

// Where the JSON value opened at s[0] ('{' or '[') closes: its index, npos when the text ends
// first, k_no when a bracket does not match. Counts brackets outside strings only.
size_t json_extent_end(std::string_view s) {
    std::string stack;
    bool in_string = false;
    for (size_t i = 0; i < s.size(); ++i) {
        char c = s[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') in_string = true;
        else if (c == '{' || c == '[') stack += c;
        else if (c == '}' || c == ']') {
            if (stack.empty() || stack.back() != (c == '}' ? '{' : '[')) return k_no;
            stack.pop_back();
            if (stack.empty()) return i;
        }
    }
    return std::string_view::npos;
}

void set_ids(ToolCallFormat format, uint64_t seed, std::vector<ToolCall>& calls, size_t first_index) {
    for (size_t i = 0; i < calls.size(); ++i)
        if (calls[i].id.empty()) calls[i].id = make_tool_call_id(format, seed, int32_t(first_index + i));
}

ParsedOutput parse_hermes_or_mistral(ToolCallFormat format, std::string_view text, uint64_t seed) {
    const bool hermes = format == ToolCallFormat::hermes;
    const std::string_view marker = hermes ? k_hermes_open : k_mistral_marker;
    ParsedOutput out;
    size_t pos = 0;
    for (;;) {
        size_t p = text.find(marker, pos);
        if (p == std::string_view::npos) {
            out.content += text.substr(pos);
            break;
        }
        std::string_view chunk = text.substr(pos, p - pos);
        size_t b = p + marker.size();
        std::vector<ToolCall> calls;
        size_t next = 0;  // where the text resumes after a well-formed segment
        if (hermes) {
            size_t q = text.find(k_hermes_close, b);
            std::string_view body = q == std::string_view::npos ? text.substr(b) : text.substr(b, q - b);
            if (auto call = parse_call_object(trim(body))) {
                calls.push_back(std::move(*call));
                next = q == std::string_view::npos ? text.size() : q + k_hermes_close.size();
            }
        } else {
            size_t i = skip_ws(text, b);
            if (i < text.size() && text[i] == '[') {
                size_t e = json_extent_end(text.substr(i));
                if (e != std::string_view::npos && e != k_no) {
                    if (auto parsed = parse_call_array(text.substr(i, e + 1))) {
                        calls = std::move(*parsed);
                        next = i + e + 1;
                    }
                }
            }
        }
        if (calls.empty()) {  // not a call: the marker is text, and what follows is read again
            out.content += chunk;
            out.content += marker;
            pos = b;
            continue;
        }
        out.content += chunk.substr(0, chunk.size() - n_trailing_ws(chunk));
        set_ids(format, seed, calls, out.tool_calls.size());
        for (auto& c : calls) out.tool_calls.push_back(std::move(c));
        pos = skip_ws(text, next);
    }
    return out;
}

ParsedOutput parse_llama3(std::string_view text, uint64_t seed) {
    ParsedOutput out;
    size_t j = skip_ws(text, 0);
    bool tagged = text.substr(j).substr(0, k_python_tag.size()) == k_python_tag;
    if (tagged) j = skip_ws(text, j + k_python_tag.size());
    bool python_form = tagged && j < text.size() && is_ident(text[j]);
    if (j >= text.size() || !(text[j] == '{' || python_form)) {
        out.content = std::string(text);
        return out;
    }
    for (;;) {
        std::string_view rest = text.substr(j);
        size_t e = python_form ? python_call_end(rest) : json_extent_end(rest);
        std::optional<ToolCall> call;
        if (e != std::string_view::npos && e != k_no)
            call = python_form ? parse_python_call(rest.substr(0, e + 1)) : parse_call_object(rest.substr(0, e + 1));
        if (!call) {  // the first segment failing leaves the whole output as content
            out.content = std::string(out.tool_calls.empty() ? text : rest);
            return out;
        }
        call->id = make_tool_call_id(ToolCallFormat::llama3_json, seed, int32_t(out.tool_calls.size()));
        out.tool_calls.push_back(std::move(*call));
        size_t k = skip_ws(text, j + e + 1);
        if (k < text.size() && text[k] == ';') k = skip_ws(text, k + 1);
        if (k >= text.size()) return out;
        if (text[k] != '{') {
            out.content = std::string(text.substr(k));
            return out;
        }
        j = k;
        python_form = false;
    }
}

}  // namespace

ToolCallFormat detect_tool_call_format(std::string_view t) {
    auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
    if (has(k_hermes_open)) return ToolCallFormat::hermes;
    if (has(k_mistral_marker)) return ToolCallFormat::mistral;
    if (has(k_python_tag) || (has("<|start_header_id|>") && has("ipython"))) return ToolCallFormat::llama3_json;
    return ToolCallFormat::none;
}

const char* tool_call_format_name(ToolCallFormat format) {
    switch (format) {
    case ToolCallFormat::none: return "none";
    case ToolCallFormat::llama3_json: return "llama3_json";
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::mistral: return "mistral";
    }
    return "none";
}

std::string make_tool_call_id(ToolCallFormat format, uint64_t id_seed, int32_t index) {
    static constexpr char k_alnum[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    const bool mistral = format == ToolCallFormat::mistral;
    std::string id = mistral ? "" : "call_";
    uint64_t x = id_seed ^ (uint64_t(uint32_t(index)) * 0xD1B54A32D192ED03ull);
    for (int n = mistral ? 9 : 24; n > 0; --n) id += k_alnum[splitmix64(x) % 62];
    return id;
}

ParsedOutput parse_tool_calls(ToolCallFormat format, std::string_view text, uint64_t id_seed) {
    switch (format) {
    case ToolCallFormat::none: return ParsedOutput{std::string(text), {}};
    case ToolCallFormat::llama3_json: return parse_llama3(text, id_seed);
    case ToolCallFormat::hermes:
    case ToolCallFormat::mistral: return parse_hermes_or_mistral(format, text, id_seed);
    }
    return ParsedOutput{std::string(text), {}};
}

// ---- the streaming parser

ToolCallParser::ToolCallParser(ToolCallFormat format, uint64_t id_seed)
    : format_(format), id_seed_(id_seed),
      state_(format == ToolCallFormat::none          ? State::passthrough
             : format == ToolCallFormat::llama3_json ? State::llama_start
                                                     : State::text) {}

std::vector<ToolCallDelta> ToolCallParser::feed(std::string_view piece) {
    std::vector<ToolCallDelta> out;
    if (state_ == State::passthrough) {
        emit_content(out, piece);
        return out;
    }
    buf_ += piece;
    step(out);
    return out;
}

std::vector<ToolCallDelta> ToolCallParser::finish() {
    std::vector<ToolCallDelta> out;
    if (finished_) return out;
    at_end_ = true;
    step(out);
    emit_content(out, buf_);  // whatever is still undecided is text
    buf_.clear();
    finished_ = true;
    return out;
}

void ToolCallParser::emit_content(std::vector<ToolCallDelta>& out, std::string_view text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == ToolCallDelta::Kind::content) {
        out.back().content += text;
        return;
    }
    ToolCallDelta d;
    d.content = std::string(text);
    out.push_back(std::move(d));
}

void ToolCallParser::emit_call(std::vector<ToolCallDelta>& out, ToolCall call) {
    ToolCallDelta d;
    d.kind = ToolCallDelta::Kind::tool_call;
    d.index = n_calls_;
    d.id = call.id.empty() ? make_tool_call_id(format_, id_seed_, n_calls_) : std::move(call.id);
    d.name = std::move(call.name);
    d.arguments = std::move(call.arguments);
    ++n_calls_;
    out.push_back(std::move(d));
}

void ToolCallParser::fail_segment(std::vector<ToolCallDelta>& out) {
    size_t n = seg_ws_ + (format_ == ToolCallFormat::hermes ? k_hermes_open.size() : k_mistral_marker.size());
    emit_content(out, std::string_view(buf_).substr(0, n));
    buf_.erase(0, n);
    state_ = State::text;
}

void ToolCallParser::decide_llama_start(std::vector<ToolCallDelta>& out, bool at_end) {
    std::string_view s = buf_;
    size_t i = skip_ws(s, 0);
    auto give_up = [&] {  // not a call: the whole output is content from here on
        emit_content(out, buf_);
        buf_.clear();
        state_ = State::passthrough;
    };
    if (i == s.size()) {
        if (at_end) give_up();
        return;
    }
    size_t j = i;
    bool tagged = false;
    std::string_view from_i = s.substr(i);
    if (from_i.size() < k_python_tag.size() && k_python_tag.substr(0, from_i.size()) == from_i) {
        if (at_end) give_up();
        return;  // maybe the tag's first bytes
    }
    if (from_i.substr(0, k_python_tag.size()) == k_python_tag) {
        tagged = true;
        j = skip_ws(s, i + k_python_tag.size());
        if (j == s.size()) {
            if (at_end) give_up();
            return;
        }
    }
    if (s[j] == '{' || (tagged && is_ident(s[j]))) {
        state_ = s[j] == '{' ? State::llama_object : State::llama_call;
        seg_start_ = j;
        scan_pos_ = j;
        stack_.clear();
        in_string_ = escape_ = false;
        return;
    }
    give_up();
}

// Runs the state machine over buf_ as far as the bytes held decide; at_end_ decides the rest.
void ToolCallParser::step(std::vector<ToolCallDelta>& out) {
    for (;;) {
        switch (state_) {
        case State::passthrough:
            emit_content(out, buf_);
            buf_.clear();
            return;

        case State::text: {
            const std::string_view marker = format_ == ToolCallFormat::hermes ? k_hermes_open : k_mistral_marker;
            size_t p = buf_.find(marker);
            if (p == std::string::npos) {
                size_t held = 0;
                if (!at_end_) {
                    held = n_marker_prefix_suffix(buf_, marker);
                    held += n_trailing_ws(std::string_view(buf_).substr(0, buf_.size() - held));
                }
                emit_content(out, std::string_view(buf_).substr(0, buf_.size() - held));
                buf_.erase(0, buf_.size() - held);
                return;
            }
            size_t ws = n_trailing_ws(std::string_view(buf_).substr(0, p));
            emit_content(out, std::string_view(buf_).substr(0, p - ws));
            buf_.erase(0, p - ws);
            seg_ws_ = ws;
            scan_pos_ = ws + marker.size();
            stack_.clear();
            in_string_ = escape_ = false;
            state_ = format_ == ToolCallFormat::hermes ? State::body : State::array;
            break;
        }

        case State::body: {  // hermes
            size_t b = seg_ws_ + k_hermes_open.size();
            size_t q = buf_.find(k_hermes_close, b);
            if (q == std::string::npos && !at_end_) return;
            std::string_view body = std::string_view(buf_).substr(b, q == std::string::npos ? std::string::npos : q - b);
            if (auto call = parse_call_object(trim(body))) {
                emit_call(out, std::move(*call));
                buf_.erase(0, q == std::string::npos ? buf_.size() : q + k_hermes_close.size());
                state_ = State::after_call;
            } else {
                fail_segment(out);
            }
            break;
        }

        case State::array: {  // mistral: whitespace, then '[' ... ']' scanned incrementally
            bool failed = false, done = false;
            size_t end = 0;
            for (; scan_pos_ < buf_.size() && !failed && !done; ++scan_pos_) {
                char c = buf_[scan_pos_];
                if (stack_.empty()) {
                    if (is_ws(c)) continue;
                    if (c != '[') failed = true;
                    else { stack_ += c; seg_start_ = scan_pos_; }
                    continue;
                }
                if (in_string_) {
                    if (escape_) escape_ = false;
                    else if (c == '\\') escape_ = true;
                    else if (c == '"') in_string_ = false;
                } else if (c == '"') {
                    in_string_ = true;
                } else if (c == '{' || c == '[') {
                    stack_ += c;
                } else if (c == '}' || c == ']') {
                    if (stack_.back() != (c == '}' ? '{' : '[')) failed = true;
                    else {
                        stack_.pop_back();
                        if (stack_.empty()) { done = true; end = scan_pos_; }
                    }
                }
            }
            if (done) {
                auto calls = parse_call_array(std::string_view(buf_).substr(seg_start_, end + 1 - seg_start_));
                if (!calls) { fail_segment(out); break; }
                for (auto& c : *calls) emit_call(out, std::move(c));
                buf_.erase(0, end + 1);
                state_ = State::after_call;
                break;
            }
            if (failed || at_end_) { fail_segment(out); break; }
            return;
        }

        case State::after_call: {
            size_t i = skip_ws(buf_, 0);
            buf_.erase(0, i);
            if (buf_.empty()) return;
            state_ = State::text;
            break;
        }

        case State::llama_start:
            decide_llama_start(out, at_end_);
            if (state_ == State::llama_start) return;
            break;

        case State::llama_object:
        case State::llama_call: {
            const bool python_form = state_ == State::llama_call;
            bool failed = false, done = false;
            size_t end = 0;
            if (python_form) {
                // name.call( ... ) with quotes; the head is checked once the bytes are there.
                std::string_view seg = std::string_view(buf_).substr(seg_start_);
                size_t e = python_call_end(seg);  // cheap enough: a call is a few dozen bytes
                if (e == k_no) failed = true;
                else if (e != std::string::npos) { done = true; end = seg_start_ + e; }
            } else {
                for (; scan_pos_ < buf_.size() && !failed && !done; ++scan_pos_) {
                    char c = buf_[scan_pos_];
                    if (in_string_) {
                        if (escape_) escape_ = false;
                        else if (c == '\\') escape_ = true;
                        else if (c == '"') in_string_ = false;
                    } else if (c == '"') {
                        in_string_ = true;
                    } else if (c == '{' || c == '[') {
                        stack_ += c;
                    } else if (c == '}' || c == ']') {
                        if (stack_.empty() || stack_.back() != (c == '}' ? '{' : '[')) failed = true;
                        else {
                            stack_.pop_back();
                            if (stack_.empty()) { done = true; end = scan_pos_; }
                        }
                    }
                }
            }
            std::optional<ToolCall> call;
            if (done) {
                std::string_view seg = std::string_view(buf_).substr(seg_start_, end + 1 - seg_start_);
                call = python_form ? parse_python_call(seg) : parse_call_object(seg);
                failed = !call;
            }
            if (failed || (!done && at_end_)) {
                // Not a call: the held text (the whole output when no call came before) is content.
                state_ = State::passthrough;
                break;
            }
            if (!done) return;
            call->id.clear();
            emit_call(out, std::move(*call));
            buf_.erase(0, end + 1);
            state_ = State::llama_after;
            break;
        }

        case State::llama_after: {
            size_t k = skip_ws(buf_, 0);
            if (k < buf_.size() && buf_[k] == ';') k = skip_ws(buf_, k + 1);
            if (k >= buf_.size()) {
                if (at_end_) buf_.clear();  // separators after the last call are dropped
                return;
            }
            buf_.erase(0, k);
            if (buf_[0] == '{') {
                seg_start_ = scan_pos_ = 0;
                stack_.clear();
                in_string_ = escape_ = false;
                state_ = State::llama_object;
            } else {
                state_ = State::passthrough;
            }
            break;
        }
        }
    }
}

Expected<std::string> tool_call_gbnf(ToolCallFormat format, const nlohmann::ordered_json& tools, std::string_view only_name) {
    if (format == ToolCallFormat::none)
        return make_error("this model's chat template renders tool calls in no format the server parses (hermes, "
                          "mistral, llama3_json), so a tool call cannot be required; use tool_choice \"auto\" or a "
                          "model whose template has tool calls");
    if (!tools.is_array() || tools.empty()) return make_error("'tools' is empty; a tool call needs at least one tool");
    const char* args_key = format == ToolCallFormat::llama3_json ? "parameters" : "arguments";
    std::string rules, alts;
    bool found = false;
    for (size_t i = 0; i < tools.size(); ++i) {
        const std::string at = "tools[" + std::to_string(i) + "]";
        const auto& t = tools[i];
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
            return make_error(at, " must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}");
        const auto& f = t["function"];
        if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
            return make_error(at, ".function.name must be a non-empty string");
        const std::string name = f["name"].get<std::string>();
        if (!only_name.empty() && name != only_name) continue;
        found = true;
        nlohmann::ordered_json params = nlohmann::ordered_json::object();
        if (f.contains("parameters") && !f["parameters"].is_null()) params = f["parameters"];
        if (!params.is_object())
            return make_error(at, ".function.parameters must be a JSON Schema object (e.g. {\"type\": \"object\", \"properties\": {...}})");
        if (!params.contains("type")) params["type"] = "object";
        else if (params["type"] != "object")
            return make_error(at, ".function.parameters must describe an object (\"type\": \"object\"): a call's arguments are one");
        const std::string prefix = "tool" + std::to_string(i) + "-";
        auto r = json_schema_to_gbnf_rules(params.dump(), prefix + "s");
        if (!r) return make_error(at, ".function.parameters: ", r.error().message);
        rules += r->rules;
        const std::string head = "{\"name\": " + nlohmann::json(name).dump() + ", \"" + args_key + "\": ";
        rules += prefix + "call ::= " + gbnf_string_literal(head) + " " + r->root + " \"}\"\n";
        alts += (alts.empty() ? "" : " | ") + prefix + "call";
    }
    if (!found) return make_error("no tool is named \"", std::string(only_name), "\"; name one of 'tools'");
    std::string root;
    switch (format) {
    case ToolCallFormat::hermes: root = "\"<tool_call>\\n\" (" + alts + ") \"\\n</tool_call>\""; break;
    case ToolCallFormat::mistral: root = "\"[TOOL_CALLS][\" (" + alts + ") \"]\""; break;
    default: root = alts; break;
    }
    return "root ::= " + root + "\n" + json_schema_primitives_gbnf() + rules;
}

}  // namespace steward
