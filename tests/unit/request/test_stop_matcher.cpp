// StopMatcher against a naive reference that rescans the whole text after every piece: the text
// emitted so far, the hold-back and the cut are the same for random texts, stop sets and splits.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>

#include "request/stop_matcher.h"

using steward::StopMatcher;

namespace {

// The reference: given everything received, what the caller may have (and whether it stopped).
std::pair<std::string, bool> reference(const std::string& text, const std::vector<std::string>& stops) {
    size_t cut = std::string::npos;
    for (const auto& s : stops)
        if (!s.empty()) cut = std::min(cut, text.find(s));
    if (cut != std::string::npos) return {text.substr(0, cut), true};
    size_t keep = 0;
    for (size_t n = 1; n <= text.size(); n++)
        for (const auto& s : stops)
            if (n < s.size() && text.compare(text.size() - n, n, s, 0, n) == 0) keep = std::max(keep, n);
    return {text.substr(0, text.size() - keep), false};
}

}  // namespace

TEST_CASE("a stop string split across pieces is never streamed and ends the output where it starts", "[stop]") {
    StopMatcher m({"</end>", "STOP"});
    std::string got;
    for (const char* p : {"Hello wor", "ld </e", "nd> tail"}) got += m.push(p).emit;
    CHECK(got == "Hello world ");
    CHECK(m.stopped());
    CHECK(m.push("more").emit.empty());
    CHECK(m.flush().empty());
}

TEST_CASE("held-back text that turns out not to be a stop string is released, and flushed at the end", "[stop]") {
    StopMatcher m({"</end>"});
    CHECK(m.push("a </e").emit == "a ");
    CHECK(m.push("x").emit == "</ex");
    CHECK(m.push("</").emit.empty());
    CHECK(m.flush() == "</");
    CHECK_FALSE(m.stopped());
}

TEST_CASE("StopMatcher equals a rescan of the whole text after every piece", "[stop]") {
    std::mt19937 rng(11);
    const std::string alphabet = "ab<>/ ";
    for (int round = 0; round < 3000; round++) {
        std::vector<std::string> stops;
        for (int i = 0, n = 1 + (int)(rng() % 3); i < n; i++) {
            std::string s;
            for (int j = 0, l = 1 + (int)(rng() % 4); j < l; j++) s += alphabet[rng() % alphabet.size()];
            stops.push_back(s);
        }
        std::string text;
        for (int j = 0, l = (int)(rng() % 30); j < l; j++) text += alphabet[rng() % alphabet.size()];
        StopMatcher m(stops);
        std::string received, emitted;
        bool stopped = false;
        for (size_t pos = 0; pos < text.size() && !stopped;) {
            const size_t n = std::min(text.size() - pos, (size_t)(1 + rng() % 5));
            received += text.substr(pos, n);
            pos += n;
            auto o = m.push(text.substr(pos - n, n));
            emitted += o.emit;
            auto [want, want_stop] = reference(received, stops);
            INFO("text '" << received << "' stops " << stops.size());
            REQUIRE(o.stopped == want_stop);
            REQUIRE(emitted == want);
            stopped = o.stopped;
        }
        if (!stopped) {
            emitted += m.flush();
            REQUIRE(emitted == text);
        }
    }
}
