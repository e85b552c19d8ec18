#include "serve/reasoning.h"

namespace steward::serve {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The length of the longest suffix of s that is a proper prefix of tag (a tag that may be arriving).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; n--)
        if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
    return 0;
}

std::string_view trim_newlines(std::string_view s, bool front, bool back) {
    while (front && !s.empty() && (s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
    while (back && !s.empty() && (s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

}  // namespace

bool thinking_template(std::string_view t) {
    return t.find(k_think_open) != std::string_view::npos && t.find(k_think_close) != std::string_view::npos;
}

bool prompt_opens_think(std::string_view p) {
    while (!p.empty() && is_space(p.back())) p.remove_suffix(1);
    return p.size() >= k_think_open.size() && p.substr(p.size() - k_think_open.size()) == k_think_open;
}

ReasoningSplit split_reasoning(std::string_view text, bool opened) {
    ReasoningSplit r;
    std::string_view rest = text;
    if (!opened) {
        size_t i = 0;
        while (i < rest.size() && is_space(rest[i])) i++;
        if (rest.substr(i, k_think_open.size()) != k_think_open) {
            r.content = std::string(text);
            return r;
        }
        rest.remove_prefix(i + k_think_open.size());
    }
    r.had_reasoning = true;
    const size_t close = rest.find(k_think_close);
    if (close == std::string_view::npos) {
        r.reasoning = std::string(trim_newlines(rest, true, true));
        return r;
    }
    r.reasoning = std::string(trim_newlines(rest.substr(0, close), true, true));
    r.content = std::string(trim_newlines(rest.substr(close + k_think_close.size()), true, false));
    return r;
}

void ReasoningStream::step(std::vector<std::pair<bool, std::string>>& out, bool final) {
    for (;;) {
        switch (state_) {
            case State::before: {
                size_t i = 0;
                while (i < buf_.size() && is_space(buf_[i])) i++;
                const std::string_view after = std::string_view(buf_).substr(i);
                if (after.size() >= k_think_open.size() && after.substr(0, k_think_open.size()) == k_think_open) {
                    buf_.erase(0, i + k_think_open.size());
                    state_ = State::reasoning_start;
                    continue;
                }
                if (!final && k_think_open.substr(0, after.size()) == after) return;  // may still open
                state_ = State::content;
                continue;
            }
            case State::reasoning_start: {
                size_t i = 0;
                while (i < buf_.size() && (buf_[i] == '\n' || buf_[i] == '\r')) i++;
                buf_.erase(0, i);
                if (buf_.empty() && !final) return;
                state_ = State::reasoning;
                continue;
            }
            case State::reasoning: {
                const size_t close = buf_.find(k_think_close);
                if (close != std::string::npos) {
                    if (close > 0) out.emplace_back(true, buf_.substr(0, close));
                    buf_.erase(0, close + k_think_close.size());
                    state_ = State::content_start;
                    continue;
                }
                const size_t hold = final ? 0 : partial_tag_suffix(buf_, k_think_close);
                if (buf_.size() > hold) out.emplace_back(true, buf_.substr(0, buf_.size() - hold));
                buf_.erase(0, buf_.size() - hold);
                return;
            }
            case State::content_start: {
                size_t i = 0;
                while (i < buf_.size() && (buf_[i] == '\n' || buf_[i] == '\r')) i++;
                buf_.erase(0, i);
                if (buf_.empty()) return;
                state_ = State::content;
                continue;
            }
            case State::content:
                if (!buf_.empty()) out.emplace_back(false, std::move(buf_));
                buf_.clear();
                return;
        }
    }
}

std::vector<std::pair<bool, std::string>> ReasoningStream::feed(std::string_view piece) {
    std::vector<std::pair<bool, std::string>> out;
    buf_ += piece;
    step(out, false);
    return out;
}

std::vector<std::pair<bool, std::string>> ReasoningStream::finish() {
    std::vector<std::pair<bool, std::string>> out;
    step(out, true);
    return out;
}

}  // namespace steward::serve
