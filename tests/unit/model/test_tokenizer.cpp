// Tokenizer tests: llama.cpp's reference tokenizations for seven real vocabularies, round trips,
// byte fallback, hand-made vocabularies whose merges are worked out by hand, and streaming.
#include <algorithm>
#include <catch2/catch.hpp>
#include <zlib.h>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include "test_paths.h"

#include "model/gguf.h"
#include "model/tokenizer.h"

using namespace steward;

namespace {

const std::string k_tok_dir = std::string(STEWARD_TESTDATA_DIR) + "/tokenizers/";
const char* const k_vocabs[] = {"llama-spm", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "falcon", "starcoder"};

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<std::string> split(const std::string& s, const std::string& sep) {
    std::vector<std::string> parts;
    size_t pos = 0;
    for (size_t hit; (hit = s.find(sep, pos)) != std::string::npos; pos = hit + sep.size())
        parts.push_back(s.substr(pos, hit - pos));
    parts.push_back(s.substr(pos));
    return parts;
}

// The .out files' format: each id preceded by one space.
std::string join_ids(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
        s += ' ';
        s += std::to_string(id);
    }
    return s;
}

std::unique_ptr<Tokenizer> load_vocab(const std::string& name) {
    auto tok = Tokenizer::load(k_tok_dir + "ggml-vocab-" + name + ".gguf");
    INFO((tok ? std::string() : tok.error().message));
    REQUIRE(tok.ok());
    return std::move(*tok);
}

// Every byte sequence in s is well-formed UTF-8.
bool is_valid_utf8(const std::string& s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    size_t i = 0, n = s.size();
    while (i < n) {
        unsigned char c = p[i];
        size_t len = c < 0x80                   ? 1
                     : (c >= 0xC2 && c <= 0xDF) ? 2
                     : (c >= 0xE0 && c <= 0xEF) ? 3
                     : (c >= 0xF0 && c <= 0xF4) ? 4
                                                : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t k = 1; k < len; ++k)
            if ((p[i + k] & 0xC0) != 0x80) return false;
        if (c == 0xE0 && p[i + 1] < 0xA0) return false;
        if (c == 0xED && p[i + 1] > 0x9F) return false;
        if (c == 0xF0 && p[i + 1] < 0x90) return false;
        if (c == 0xF4 && p[i + 1] > 0x8F) return false;
        i += len;
    }
    return true;
}

std::unique_ptr<Tokenizer> from_writer(const GgufWriter& w) {
    auto file = GgufFile::from_bytes(w.to_bytes());
    REQUIRE(file.ok());
    auto tok = Tokenizer::from_gguf(**file);
    INFO((tok ? std::string() : tok.error().message));
    REQUIRE(tok.ok());
    return std::move(*tok);  // the tokenizer outlives the file: it copied what it needs
}

// A tiny byte-level BPE vocabulary over the letters a, b, c (no byte remapping needed: they are
// printable ASCII, which GPT-2's alphabet maps to itself).
std::unique_ptr<Tokenizer> make_abc_bpe(const std::vector<std::string>& merges) {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "gpt-2");
    w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "c", "ab", "bc", "abc", "<|end|>"});
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 1, 3});
    w.set_string_array("tokenizer.ggml.merges", merges);
    w.set_i32("tokenizer.ggml.eos_token_id", 6);
    return from_writer(w);
}

// llama.cpp's vocabulary test pair for base: the texts of base.inp (separated by
// __ggml_vocab_test__) and the expected ids of base.out, one line per text.
std::pair<std::vector<std::string>, std::vector<std::string>> read_vocab_test(const std::string& base) {
    std::vector<std::string> texts = split(read_all(base + ".inp"), "\n__ggml_vocab_test__\n");
    // Most files end with a separator, which leaves an empty piece after it (gemma-4's does not).
    REQUIRE(!texts.empty());
    if (texts.back().empty()) texts.pop_back();
    std::vector<std::string> expected = split(read_all(base + ".out"), "\n");
    if (!expected.empty() && expected.back().empty() && expected.size() == texts.size() + 1) expected.pop_back();
    REQUIRE(expected.size() == texts.size());
    return {texts, expected};
}

}  // namespace

TEST_CASE("Tokenizers reproduce llama.cpp's reference tokenizations and decode back to the text", "[tokenizer]") {
    for (const char* name : k_vocabs) {
        const std::string base = k_tok_dir + "ggml-vocab-" + name + ".gguf";
        auto tok = load_vocab(name);
        const auto [texts, expected] = read_vocab_test(base);

        size_t n_pass = 0;
        for (size_t i = 0; i < texts.size(); ++i) {
            INFO("vocab " << name << ", text " << i << ": '" << texts[i] << "'");
            const std::vector<int32_t> ids = tok->encode(texts[i], /*add_bos=*/false);
            CHECK(join_ids(ids) == expected[i]);
            // SPM's prefix space is dropped from the first token, so every text comes back whole,
            // leading spaces included (the prefix is exactly one extra space).
            CHECK(tok->decode(ids) == texts[i]);
            n_pass += join_ids(ids) == expected[i] && tok->decode(ids) == texts[i];
        }
        CHECK(n_pass == texts.size());
    }
}

TEST_CASE("Multi-byte characters and emoji survive a round trip through every vocabulary", "[tokenizer]") {
    const std::string texts[] = {
        "Grüße, 世界! 🦙🚀 naïve café",
        "  leading spaces, tabs\tand\nnew lines\r\n",
        "日本語のテキストと한국어 텍스트, Ελληνικά, русский, עברית, العربية",
        "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, e\u0301 combining",
        "<s> </s> <|endoftext|> <|im_start|> look special but are plain text",
    };
    for (const char* name : k_vocabs) {
        auto tok = load_vocab(name);
        for (const std::string& text : texts) {
            INFO("vocab " << name << ", text '" << text << "'");
            const auto ids = tok->encode(text, false);
            CHECK(!ids.empty());
            CHECK(tok->decode(ids) == text);
        }
    }
}

TEST_CASE("Invalid UTF-8 in the input comes back byte for byte", "[tokenizer]") {
    // SPM falls back to <0xNN> tokens; byte-level BPE maps every byte, and the pre-tokenizer
    // leaves ill-formed bytes in words of their own.
    const std::string text = std::string("ok \xFF\xFE bad \xE2\x82 cut ") + "\xC0\xAF end\xF0\x9F";
    for (const char* name : {"llama-spm", "gpt-2", "llama-bpe", "qwen2"}) {
        INFO(name);
        auto tok = load_vocab(name);
        CHECK(tok->decode(tok->encode(text, false)) == text);
    }
    // Falcon and StarCoder have no tokens for the bytes valid UTF-8 never holds (0xC0, 0xFE,
    // 0xFF), and DeepSeek's are user-defined tokens that decode as their text, so for them
    // (as in llama.cpp) only the rest of the text survives.
    for (const char* name : {"deepseek-llm", "falcon", "starcoder"}) {
        INFO(name);
        auto tok = load_vocab(name);
        const std::string back = tok->decode(tok->encode(text, false));
        CHECK(back.rfind("ok ", 0) == 0);
        CHECK(back.find(" bad \xE2\x82 cut ") != std::string::npos);
        CHECK(back.find(" end\xF0\x9F") != std::string::npos);
    }
}

TEST_CASE("Special token text is parsed only on request, except user-defined tokens", "[tokenizer]") {
    auto spm = load_vocab("llama-spm");
    // parse_special: "<s>" is BOS, and the space prefix restarts after it ("▁Hi" = 6324).
    CHECK(spm->encode("<s>Hi", false, true) == std::vector<int32_t>{1, 6324});
    // Without it "<s>" is text: "▁<", "s", ">" and then "Hi" with no space before it.
    const auto plain = spm->encode("<s>Hi", false, false);
    CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
    CHECK(spm->decode(plain) == "<s>Hi");

    // Qwen2's [PAD...] tokens are user-defined (type 4): like llama.cpp and Hugging Face, they
    // are split out even when control tokens are not parsed.
    auto qwen = load_vocab("qwen2");
    CHECK(qwen->encode("a[PAD151646]", false, false) == std::vector<int32_t>{64, 151646});
    CHECK(qwen->decode(std::vector<int32_t>{64, 151646}) == "a[PAD151646]");
}

TEST_CASE("SPM encodes characters missing from the vocabulary as <0xNN> byte tokens", "[tokenizer]") {
    auto tok = load_vocab("llama-spm");
    // U+1F999 (🦙) has no token in Llama 2's vocabulary: its four UTF-8 bytes F0 9F A6 99 become
    // byte tokens, after the "▁" that the space prefix adds.
    const std::string text = "🦙";
    const auto ids = tok->encode(text, false);
    REQUIRE(ids.size() == 5);
    CHECK(tok->token_text(ids[0]) == "\xE2\x96\x81");
    CHECK(tok->token_text(ids[1]) == "<0xF0>");
    CHECK(tok->token_text(ids[2]) == "<0x9F>");
    CHECK(tok->token_text(ids[3]) == "<0xA6>");
    CHECK(tok->token_text(ids[4]) == "<0x99>");
    CHECK(tok->token_to_bytes(ids[1]) == "\xF0");
    CHECK(tok->decode(ids) == text);
    // With BOS in front the first word still loses its prefix space.
    const auto with_bos = tok->encode(text, true);
    REQUIRE(with_bos.size() == 6);
    CHECK(with_bos[0] == tok->bos());
    CHECK(tok->decode(with_bos) == text);
}

TEST_CASE("BPE merge order follows merge rank, not position", "[tokenizer]") {
    // Merges, lowest rank first. On "abc" the symbols start as a|b|c with candidate pairs
    // (a,b) and (b,c).
    SECTION("with 'a b' ranked first, 'ab c' completes the word") {
        // rank 0 "a b": a|b|c -> ab|c; candidates now (ab,c) = rank 2 -> abc.
        auto tok = make_abc_bpe({"a b", "b c", "ab c"});
        CHECK(tok->encode("abc", false) == std::vector<int32_t>{5});
    }
    SECTION("with 'b c' ranked first, 'a bc' is not a merge, so the word stops at a|bc") {
        // rank 0 "b c": a|b|c -> a|bc; the only candidate (a,bc) has no merge -> [a, bc].
        auto tok = make_abc_bpe({"b c", "a b", "ab c"});
        CHECK(tok->encode("abc", false) == std::vector<int32_t>{0, 4});
    }
    SECTION("equal candidates merge leftmost first") {
        // "abab" with only "a b": both (a,b) pairs have rank 0 -> ab|ab.
        auto tok = make_abc_bpe({"a b"});
        CHECK(tok->encode("abab", false) == std::vector<int32_t>{3, 3});
    }
    SECTION("the pre-tokenizer splits words before merges apply") {
        // gpt-2's regex makes "abc" and " abc" separate words; " " (U+0120 'Ġ' in GPT-2's
        // alphabet) is not in this vocabulary, and "abc" in the second word still merges.
        auto tok = make_abc_bpe({"a b", "ab c"});
        CHECK(tok->encode("abc abc", false) == std::vector<int32_t>{5, 5});
    }
    SECTION("control tokens split out only with parse_special") {
        auto tok = make_abc_bpe({"a b", "ab c"});
        CHECK(tok->encode("abc<|end|>", false, true) == std::vector<int32_t>{5, 6});
        CHECK(tok->is_eog(6));
        CHECK(!tok->is_eog(5));
        CHECK(tok->decode(std::vector<int32_t>{5, 6}) == "abc");  // control tokens decode to ""
        CHECK(!tok->add_bos_default());                           // gpt2 vocabularies do not add BOS unless they say so
    }
}

TEST_CASE("A hand-made SPM vocabulary merges the best-scoring pair first", "[tokenizer]") {
    // Tokens and scores (higher merges first):
    //   0 <unk>  1 <s>  2 </s>  3 ▁  4 a  5 b  6 c  7 ▁a (-1)  8 ab (-3)  9 bc (-2)  10 ▁ab (-0.5)
    //   11..12 <0x21> <0x7A> (byte fallback for '!' and 'z')
    // "abc" -> "▁abc" -> symbols ▁|a|b|c. Candidate pairs: ▁a (-1), ab (-3), bc (-2).
    //   best ▁a: ▁a|b|c; candidates ▁ab (-0.5), bc (-2). best ▁ab: ▁ab|c; "▁abc" is no token.
    //   -> [▁ab, c] = [10, 6].
    // "bc!" -> ▁|b|c|! : candidates ▁b (none), bc (-2), c! (none) -> ▁|bc|!; '!' is not a token
    //   -> byte fallback <0x21>: [3, 9, 11].
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "llama");
    const std::string sp = "\xE2\x96\x81";
    w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", sp, "a", "b", "c", sp + "a", "ab", "bc",
                                                 sp + "ab", "<0x21>", "<0x7A>"});
    w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -5, -6, -6, -6, -1, -3, -2, -0.5f, 0, 0});
    w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6, 6});
    auto tok = from_writer(w);
    CHECK(tok->kind() == TokenizerKind::SPM);
    CHECK(tok->bos() == 1);  // Llama defaults when the ids are not in the metadata
    CHECK(tok->eos() == 2);
    CHECK(tok->add_bos_default());
    CHECK(tok->encode("abc", false) == std::vector<int32_t>{10, 6});
    CHECK(tok->encode("bc!", false) == std::vector<int32_t>{3, 9, 11});
    CHECK(tok->encode("abc", true) == std::vector<int32_t>{1, 10, 6});
    CHECK(tok->decode(std::vector<int32_t>{1, 10, 6}) == "abc");
    CHECK(tok->decode(std::vector<int32_t>{3, 9, 11}) == "bc!");
    // parse_special splits "<s>" out and restarts the space prefix after it.
    CHECK(tok->encode("<s>a", false, true) == std::vector<int32_t>{1, 7});
    CHECK(tok->is_eog(2));

    SECTION("without add_space_prefix no ▁ is prepended") {
        // "abc" -> a|b|c: candidates ab (-3), bc (-2); bc wins -> a|bc, and "abc" is no token.
        w.set_bool("tokenizer.ggml.add_space_prefix", false);
        auto plain = from_writer(w);
        CHECK(plain->encode("abc", false) == std::vector<int32_t>{4, 9});
        CHECK(plain->decode(std::vector<int32_t>{3, 8}) == " ab");
    }
}

TEST_CASE("Malformed tokenizer metadata yields errors that name the key", "[tokenizer]") {
    auto error_of = [](const GgufWriter& w) {
        auto file = GgufFile::from_bytes(w.to_bytes());
        REQUIRE(file.ok());
        auto tok = Tokenizer::from_gguf(**file);
        REQUIRE(!tok.ok());
        return tok.error().message;
    };
    GgufWriter no_model;
    no_model.set_string_array("tokenizer.ggml.tokens", {"a"});
    CHECK_THAT(error_of(no_model), Catch::Contains("tokenizer.ggml.model"));

    GgufWriter unknown_model;
    unknown_model.set_string("tokenizer.ggml.model", "t5");  // T5's Unigram (llama.cpp's UGM)
    unknown_model.set_string_array("tokenizer.ggml.tokens", {"a"});
    CHECK_THAT(error_of(unknown_model), Catch::Contains("'t5'") && Catch::Contains("'bert' for WordPiece"));

    GgufWriter no_tokens;
    no_tokens.set_string("tokenizer.ggml.model", "llama");
    CHECK_THAT(error_of(no_tokens), Catch::Contains("tokenizer.ggml.tokens is missing"));

    GgufWriter bad_scores;
    bad_scores.set_string("tokenizer.ggml.model", "llama");
    bad_scores.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    bad_scores.set_f32_array("tokenizer.ggml.scores", {0});
    CHECK_THAT(error_of(bad_scores), Catch::Contains("tokenizer.ggml.scores has 1 entries"));

    GgufWriter bad_types;
    bad_types.set_string("tokenizer.ggml.model", "gpt2");
    bad_types.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    bad_types.set_i32_array("tokenizer.ggml.token_type", {1});
    bad_types.set_string_array("tokenizer.ggml.merges", {"a b"});
    CHECK_THAT(error_of(bad_types), Catch::Contains("tokenizer.ggml.token_type"));

    GgufWriter no_merges;
    no_merges.set_string("tokenizer.ggml.model", "gpt2");
    no_merges.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    CHECK_THAT(error_of(no_merges), Catch::Contains("tokenizer.ggml.merges is missing"));

    GgufWriter bad_merge;
    bad_merge.set_string("tokenizer.ggml.model", "gpt2");
    bad_merge.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    bad_merge.set_string_array("tokenizer.ggml.merges", {"ab"});
    CHECK_THAT(error_of(bad_merge), Catch::Contains("tokenizer.ggml.merges[0]"));

    GgufWriter bad_eos;
    bad_eos.set_string("tokenizer.ggml.model", "gpt2");
    bad_eos.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    bad_eos.set_string_array("tokenizer.ggml.merges", {"a b"});
    bad_eos.set_i32("tokenizer.ggml.eos_token_id", 7);
    CHECK_THAT(error_of(bad_eos), Catch::Contains("tokenizer.ggml.eos_token_id = 7"));

    GgufWriter bad_sep;  // WordPiece's [SEP] id as a string, then outside the vocabulary
    bad_sep.set_string("tokenizer.ggml.model", "bert");
    bad_sep.set_string_array("tokenizer.ggml.tokens", {"[PAD]", "a", "b"});
    bad_sep.set_string("tokenizer.ggml.seperator_token_id", "2");
    CHECK_THAT(error_of(bad_sep), Catch::Contains("seperator_token_id") && Catch::Contains("not an integer"));
    bad_sep.set_i32("tokenizer.ggml.seperator_token_id", 9);
    CHECK_THAT(error_of(bad_sep), Catch::Contains("seperator_token_id = 9") && Catch::Contains("outside the vocabulary"));

    GgufWriter unknown_pre;  // an unknown pre-tokenizer is a warning, not an error
    unknown_pre.set_string("tokenizer.ggml.model", "gpt2");
    unknown_pre.set_string("tokenizer.ggml.pre", "no-such-pre");
    unknown_pre.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
    unknown_pre.set_string_array("tokenizer.ggml.merges", {"a b"});
    auto file = GgufFile::from_bytes(unknown_pre.to_bytes());
    REQUIRE(file.ok());
    auto tok = Tokenizer::from_gguf(**file);
    REQUIRE(tok.ok());
    CHECK((*tok)->pre() == "no-such-pre");
    CHECK((*tok)->encode("ab", false) == std::vector<int32_t>{2});
}

TEST_CASE("Vocabulary-only GGUF files load with Tokenizer::load", "[tokenizer]") {
    struct Expect {
        const char* name;
        TokenizerKind kind;
        int32_t n_vocab, bos, eos;
        bool add_bos;
        const char* pre;
    };
    const Expect cases[] = {
        {"llama-spm", TokenizerKind::SPM, 32000, 1, 2, true, "default"},
        {"gpt-2", TokenizerKind::BPE, 50257, 50256, 50256, false, "gpt-2"},
        {"llama-bpe", TokenizerKind::BPE, 128256, 128000, 128001, true, "llama-bpe"},
        {"qwen2", TokenizerKind::BPE, 151936, 151643, 151643, false, "qwen2"},
    };
    for (const Expect& e : cases) {
        INFO(e.name);
        auto tok = load_vocab(e.name);
        CHECK(tok->kind() == e.kind);
        CHECK(tok->n_vocab() == e.n_vocab);
        CHECK(tok->bos() == e.bos);
        CHECK(tok->eos() == e.eos);
        CHECK(tok->add_bos_default() == e.add_bos);
        CHECK(tok->pre() == e.pre);
        CHECK(tok->is_eog(e.eos));
        CHECK(!tok->is_eog(0));
        CHECK(tok->token_to_bytes(-1).empty());
        CHECK(tok->token_to_bytes(e.n_vocab).empty());
    }
    auto llama3 = load_vocab("llama-bpe");
    CHECK(llama3->is_eog(128009));  // <|eot_id|>
    auto qwen = load_vocab("qwen2");
    CHECK(qwen->is_eog(151645));  // <|im_end|>
    CHECK(qwen->encode("<|im_start|>user", false, true).front() == 151644);
    CHECK(qwen->encode("<|im_start|>user", false, false).front() != 151644);

    auto missing = Tokenizer::load(k_tok_dir + "no-such-file.gguf");
    CHECK(!missing.ok());
}

TEST_CASE("StreamDecoder never emits a partial UTF-8 character", "[tokenizer]") {
    auto tok = load_vocab("llama-spm");
    SECTION("an emoji's byte tokens, fed one at a time") {
        const std::string text = "Hi 🦙!";
        const auto ids = tok->encode(text, true);
        StreamDecoder stream(*tok);
        std::string all;
        for (int32_t id : ids) {
            const std::string part = stream.push(id);
            CHECK(is_valid_utf8(part));
            all += part;
        }
        all += stream.flush();
        CHECK(all == text);
        CHECK(all == tok->decode(ids));
    }
    SECTION("held bytes that never complete become U+FFFD on flush") {
        StreamDecoder stream(*tok);
        const int32_t f0 = tok->encode("\xF0", false).back();  // <0xF0>
        REQUIRE(tok->token_text(f0) == "<0xF0>");
        CHECK(stream.push(f0).empty());
        CHECK(stream.flush() == "\xEF\xBF\xBD");
    }
    SECTION("a broken sequence is replaced and the stream goes on") {
        StreamDecoder stream(*tok);
        const auto f0 = tok->encode("\xF0", false).back();
        const auto a = tok->encode("a", false).back();  // "▁a": the first piece drops its space
        CHECK(stream.push(f0).empty());
        CHECK(stream.push(a) == "\xEF\xBF\xBD a");
        CHECK(stream.flush().empty());
    }
    SECTION("byte-level BPE pieces that split a character are held back") {
        auto gpt2 = load_vocab("gpt-2");
        const std::string text = "世界🦙";
        const auto ids = gpt2->encode(text, false);
        StreamDecoder stream(*gpt2);
        std::string all;
        for (int32_t id : ids) {
            const std::string part = stream.push(id);
            CHECK(is_valid_utf8(part));
            all += part;
        }
        CHECK(stream.flush().empty());
        CHECK(all == text);
    }
}

// From fuzz_tokenizer_spm (tests/fuzz/corpus/fuzz_tokenizer_spm/regress-sp-marker.bin): SentencePiece
// writes a space as U+2581, so a U+2581 in the input decodes as a space (as in llama.cpp); every other
// byte, ill-formed ones included, comes back as it was. The fuzz target checks exactly this promise.
TEST_CASE("SPM decodes a U+2581 in the input as a space and keeps every other byte", "[tokenizer]") {
    auto tok = load_vocab("llama-spm");
    const std::string text =
        "\xF0+\xF2\xE2\x96\x81 a\xE2\x96\x81\xE2\x96\x81"
        "b";
    CHECK(tok->decode(tok->encode(text, false)) == "\xF0+\xF2  a  b");
    CHECK(tok->decode(tok->encode(text, true)) == "\xF0+\xF2  a  b");
    auto bpe = load_vocab("llama-bpe");
    CHECK(bpe->decode(bpe->encode(text, false)) == text);  // byte-level BPE keeps it as it is
}

TEST_CASE("WordPiece (bert-bge) reproduces llama.cpp's reference tokenizations", "[tokenizer][wpm]") {
    // llama.cpp's vocabulary test for BERT's WordPiece (tests/data/tokenizers, from llama.cpp's
    // models/): normalised text (NFD, accents dropped, lower case), so no decode round trip.
    const std::string base = std::string(STEWARD_SOURCE_DIR) + "/tests/data/tokenizers/ggml-vocab-bert-bge.gguf";
    auto tok = Tokenizer::load(base);
    INFO("load: " << (tok.ok() ? std::string("ok") : tok.error().message));
    REQUIRE(tok.ok());
    CHECK((*tok)->kind() == TokenizerKind::WPM);
    const auto [texts, expected] = read_vocab_test(base);
    size_t n_pass = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        INFO("text " << i << ": '" << texts[i] << "'");
        const std::vector<int32_t> ids = (*tok)->encode(texts[i], /*add_bos=*/false);
        CHECK(join_ids(ids) == expected[i]);
        n_pass += join_ids(ids) == expected[i];
    }
    CHECK(n_pass == texts.size());
    CHECK(texts.size() >= 40);
    // [CLS] first and [SEP] last when asked (llama.cpp's add_special for WordPiece); words start
    // with U+2581 pieces and decode with a space before them.
    const std::vector<int32_t> hello = (*tok)->encode("Hello world", true);
    REQUIRE(hello.size() == 4);
    CHECK(hello[0] == 101);
    CHECK(hello[3] == 102);
    CHECK((*tok)->decode(hello) == " hello world");
}

TEST_CASE("Gemma 4's BPE (gemma-4) reproduces llama.cpp's reference tokenizations and decodes back", "[tokenizer][gemma4]") {
    // The 15.8 MB vocabulary is kept gzip-compressed (4.6 MB): read it whole into memory.
    const std::string base = std::string(STEWARD_SOURCE_DIR) + "/tests/data/tokenizers/ggml-vocab-gemma-4.gguf";
    gzFile gz = gzopen((base + ".gz").c_str(), "rb");
    REQUIRE(gz != nullptr);
    std::vector<uint8_t> bytes;
    std::vector<uint8_t> buf(1 << 16);
    for (int n; (n = gzread(gz, buf.data(), (unsigned)buf.size())) > 0;) bytes.insert(bytes.end(), buf.begin(), buf.begin() + n);
    gzclose(gz);
    auto file = GgufFile::from_bytes(std::move(bytes));
    INFO("parse: " << (file.ok() ? std::string("ok") : file.error().message));
    REQUIRE(file.ok());
    auto tok = Tokenizer::from_gguf(**file);
    INFO("load: " << (tok.ok() ? std::string("ok") : tok.error().message));
    REQUIRE(tok.ok());
    CHECK((*tok)->kind() == TokenizerKind::BPE);
    CHECK((*tok)->add_bos_default());  // llama.cpp forces BOS for Gemma 4
    const auto [texts, expected] = read_vocab_test(base);
    size_t n_pass = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
        INFO("text " << i << ": '" << texts[i] << "'");
        const std::vector<int32_t> ids = (*tok)->encode(texts[i], /*add_bos=*/false);
        // This .out file writes the ids without the leading space of the others.
        const std::string got = ids.empty() ? std::string() : join_ids(ids).substr(1);
        CHECK(got == expected[i]);
        CHECK((*tok)->decode(ids) == texts[i]);
        n_pass += got == expected[i] && (*tok)->decode(ids) == texts[i];
    }
    CHECK(n_pass == texts.size());
    CHECK(texts.size() >= 40);
}
