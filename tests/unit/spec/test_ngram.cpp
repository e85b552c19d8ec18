// Tests of prompt lookup drafting (runtime/spec/ngram.h) on hand-worked sequences.
#include <catch2/catch.hpp>
#include <vector>

#include "spec/ngram.h"

using namespace steward;
using V = std::vector<int32_t>;

TEST_CASE("prompt lookup proposes what followed the most recent earlier occurrence of the tail", "[spec][ngram]") {
    // Tail (3, 4) occurs at 2 (followed by 5 6 7) and at 7 (followed by 9 1): the later one wins.
    const V seq = {1, 2, 3, 4, 5, 6, 7, 3, 4, 9, 1, 3, 4};
    CHECK(ngram_propose(seq, {2, 2, 3}) == V{9, 1, 3});
    CHECK(ngram_propose(seq, {2, 2, 1}) == V{9});
    // k past the end of the text: only what exists.
    CHECK(ngram_propose(seq, {2, 2, 10}) == V{9, 1, 3, 4});
}

TEST_CASE("prompt lookup tries the longest n first and falls back to shorter tails", "[spec][ngram]") {
    // Tail (8, 3, 4): no earlier 3-gram match; 2-gram (3, 4) matched at 1 -> 5 6.
    const V seq = {0, 3, 4, 5, 6, 8, 3, 4};
    CHECK(ngram_propose(seq, {1, 3, 2}) == V{5, 6});
    // With the 2-gram excluded, the 1-gram (4) matches at 2 -> 5 6 as well; with (1, 1) only.
    CHECK(ngram_propose(seq, {1, 1, 2}) == V{5, 6});
    // A 3-gram match beats a more recent 2-gram match: (7, 3, 4) at 0 -> 1; (3, 4) also at 5 -> 9.
    const V seq2 = {7, 3, 4, 1, 2, 3, 4, 9, 7, 3, 4};
    CHECK(ngram_propose(seq2, {2, 3, 1}) == V{1});
    CHECK(ngram_propose(seq2, {2, 2, 1}) == V{9});
}

TEST_CASE("prompt lookup continues a repeating pattern into the tail itself", "[spec][ngram]") {
    const V seq = {5, 6, 5, 6, 5, 6};
    // Tail (5, 6): most recent earlier occurrence at 2, followed by 5 6 (the tail).
    CHECK(ngram_propose(seq, {2, 2, 4}) == V{5, 6});
    const V run = {9, 9, 9, 9};
    CHECK(ngram_propose(run, {1, 3, 3}) == V{9});  // (9 9 9) at 0, followed by the last 9
}

TEST_CASE("prompt lookup proposes nothing without a match or room", "[spec][ngram]") {
    CHECK(ngram_propose(V{1, 2, 3, 4}, {1, 3, 4}).empty());  // no repeated token
    CHECK(ngram_propose(V{}, {1, 3, 4}).empty());
    CHECK(ngram_propose(V{7}, {1, 3, 4}).empty());  // a tail needs something before it
    CHECK(ngram_propose(V{7, 7}, {1, 3, 0}).empty()); // k = 0
    CHECK(ngram_propose(V{7, 7}, {1, 3, 2}) == V{7});
}
