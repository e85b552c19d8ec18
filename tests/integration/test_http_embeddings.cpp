// POST /v1/embeddings end to end over a real trained model (TinyStories-656K): the vectors are
// llama.cpp's (tests/data/embeddings), batched or not, as floats or base64, from text or token ids;
// the routed alias, pools that cannot embed, and every refusal as OpenAI's error object.
#include <fmt/format.h>
#include <steward/runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "encoder_reference.h"
#include "http_client.h"
#include "model/synth.h"
#include "llama_embeddings.h"
#include "process_temp_dir.h"
#include "test_paths.h"

using namespace steward;
using namespace steward_test;
using json = nlohmann::json;

namespace {

const std::string k_key = "sk-embed";
const std::vector<std::pair<std::string, std::string>> k_auth = {{"Authorization", "Bearer " + k_key}};

// A simulated pool first (it cannot embed: the routed alias must pass it), then the real model
// twice: "story" pools as the GGUF says (no pooling_type: last), "story_mean" by the mean.
Served serve_story() {
    static const ProcessTempDir dir("steward_test_embed_http_");
    const std::string model = std::string(STEWARD_TESTDATA_DIR) + "/real/TinyStories-656K.f32.gguf";
    const std::string sim = std::string(STEWARD_SOURCE_DIR) + "/configs/sim/";
    const std::string text = fmt::format(R"(
[limits]
request_timeout_ms = 60000
[reload]
watch = false
[server]
host = "127.0.0.1"
port = 0
io_threads = 2

[[pool]]
name = "sim"
backend = "sim"
[pool.sim]
device = "{0}h100.toml"
model = "{0}llama-1b.toml"

[[pool]]
name = "story"
model = "{1}"
threads = 1
kv_blocks = 64
max_batch_tokens = 64

[[pool]]
name = "story_mean"
model = "{1}"
threads = 1
kv_blocks = 64
pooling = "mean"

[[tenant]]
name = "acme"
api_keys = ["{2}"]
)",
                                         sim, model, k_key);
    const std::string path = (dir.path() / "embed.toml").string();
    std::ofstream(path) << text;
    auto c = parse_config(text, path);
    if (!c) FAIL(c.error().message);
    return serve_config(*c);
}

// llama.cpp's vectors of TinyStories-656K for one pooling, in the fixture's prompt order.
std::vector<LlamaEmbedding> story_references(const std::string& pooling) {
    auto out = llama_embeddings("TinyStories-656K.f32.gguf", pooling);
    REQUIRE(out.size() == 4);
    return out;
}

std::vector<float> floats_of(const json& embedding) {
    std::vector<float> v;
    for (const auto& x : embedding) v.push_back(x.get<float>());
    return v;
}

// OpenAI's base64 encoding_format back to floats: RFC 4648 base64 of little-endian float32s,
// decoded here without the server's code.
std::vector<float> floats_of_base64(const std::string& b64) {
    auto value = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        return c == '+' ? 62 : c == '/' ? 63 : -1;
    };
    REQUIRE(b64.size() % 4 == 0);
    std::vector<uint8_t> bytes;
    for (size_t i = 0; i < b64.size(); i += 4) {
        uint32_t chunk = 0;
        int n = 0;
        for (int k = 0; k < 4; k++) {
            const int v = b64[i + k] == '=' ? 0 : value(b64[i + k]);
            REQUIRE(v >= 0);
            if (b64[i + k] != '=') n++;
            chunk = chunk << 6 | (uint32_t)v;
        }
        for (int k = 0; k < n - 1; k++) bytes.push_back((uint8_t)(chunk >> (16 - 8 * k)));
    }
    REQUIRE(bytes.size() % 4 == 0);
    std::vector<float> out(bytes.size() / 4);
    for (size_t i = 0; i < out.size(); i++) {
        const uint32_t u =
            bytes[4 * i] | bytes[4 * i + 1] << 8 | bytes[4 * i + 2] << 16 | (uint32_t)bytes[4 * i + 3] << 24;
        std::memcpy(&out[i], &u, 4);
    }
    return out;
}

Reply embed(uint16_t port, const json& body) {
    return post(port, "/v1/embeddings", body, k_auth);
}

}  // namespace

TEST_CASE("embeddings over HTTP are llama.cpp's, batched", "[http][embed]") {
    auto s = serve_story();
    for (const std::string pooling : {"mean", "last"}) {
        INFO("pooling " << pooling);
        const auto refs = story_references(pooling);
        json input = json::array();
        int64_t n_tokens = 0;
        for (const auto& r : refs) input.push_back(r.prompt), n_tokens += (int64_t)r.ids.size();
        const std::string model = pooling == "mean" ? "story_mean" : "story";  // "story": no pooling_type -> last
        const Reply r = embed(s.port, {{"model", model}, {"input", input}, {"encoding_format", "float"}});
        INFO(r.body.substr(0, 400));
        REQUIRE(r.status == 200);
        CHECK(std::string(r.headers["x-steward-pool"]) == model);
        const json j = r.j();
        CHECK(j["object"] == "list");
        CHECK(j["model"] == model);
        CHECK(j["usage"]["prompt_tokens"] == n_tokens);
        CHECK(j["usage"]["total_tokens"] == n_tokens);
        REQUIRE(j["data"].size() == refs.size());
        for (size_t i = 0; i < refs.size(); i++) {
            CHECK(j["data"][i]["object"] == "embedding");
            CHECK(j["data"][i]["index"] == i);
            CHECK(cosine(floats_of(j["data"][i]["embedding"]), refs[i].vec) >= 0.9999);
        }
    }
}

TEST_CASE("base64 embeddings decode to the float answer", "[http][embed]") {
    auto s = serve_story();
    const json input = {"Once upon a time", "The little bird was sad because"};
    const Reply f = embed(s.port, {{"model", "story_mean"}, {"input", input}});  // float is the default
    const Reply b = embed(s.port, {{"model", "story_mean"}, {"input", input}, {"encoding_format", "base64"}});
    REQUIRE(f.status == 200);
    REQUIRE(b.status == 200);
    const json fj = f.j(), bj = b.j();
    for (size_t i = 0; i < input.size(); i++) {
        const auto floats = floats_of(fj["data"][i]["embedding"]);
        const json& e = bj["data"][i]["embedding"];
        REQUIRE(e.is_string());
        const auto decoded = floats_of_base64(e.get<std::string>());
        REQUIRE(decoded.size() == 128);
        CHECK(decoded == floats);  // the floats' shortest forms parse back to the very same floats
    }
}

TEST_CASE("token-id inputs embed as their texts do", "[http][embed]") {
    auto s = serve_story();
    const auto refs = story_references("mean");
    const Reply text = embed(s.port, {{"model", "story_mean"}, {"input", {refs[0].prompt, refs[1].prompt}}});
    const Reply one = embed(s.port, {{"model", "story_mean"}, {"input", refs[0].ids}});
    const Reply two = embed(s.port, {{"model", "story_mean"}, {"input", {refs[0].ids, refs[1].ids}}});
    REQUIRE(text.status == 200);
    REQUIRE(one.status == 200);
    REQUIRE(two.status == 200);
    CHECK(one.j()["data"].size() == 1);
    CHECK(one.j()["data"][0]["embedding"] == text.j()["data"][0]["embedding"]);
    CHECK(two.j()["data"] == text.j()["data"]);
    CHECK(two.j()["usage"] == text.j()["usage"]);
}

TEST_CASE("the routed alias embeds on the first pool that can", "[http][embed]") {
    auto s = serve_story();
    for (const json& body :
         {json{{"model", "steward"}, {"input", "Once upon a time"}}, json{{"input", "Once upon a time"}}}) {
        const Reply r = embed(s.port, body);
        INFO(r.body.substr(0, 300));
        REQUIRE(r.status == 200);
        CHECK(std::string(r.headers["x-steward-pool"]) == "story");  // "sim" is first, and cannot
        CHECK(r.j()["model"] == "steward");
        CHECK(cosine(floats_of(r.j()["data"][0]["embedding"]), story_references("last")[0].vec) >= 0.9999);
    }
}

TEST_CASE("embedding refusals are OpenAI errors naming the field", "[http][embed]") {
    auto s = serve_story();
    // Past the context (512): token ids, and a text whose tokens are.
    check_error(embed(s.port, {{"model", "story"}, {"input", std::vector<int>(513, 5)}}), 400, "input",
                "context_length_exceeded", "513 tokens, over pool 'story''s context of 512");
    std::string long_text;
    for (int i = 0; i < 300; i++) long_text += "the dog ran. ";
    check_error(embed(s.port, {{"model", "story"}, {"input", {"short", long_text}}}), 400, "input",
                "context_length_exceeded", "input 1 has");
    // A whole context is fine.
    CHECK(embed(s.port, {{"model", "story"}, {"input", std::vector<int>(512, 5)}}).status == 200);
    // Empty, mixed and malformed inputs.
    check_error(embed(s.port, {{"model", "story"}}), 400, "input", "missing_field");
    check_error(embed(s.port, {{"model", "story"}, {"input", ""}}), 400, "input", "invalid_value", "empty string");
    check_error(embed(s.port, {{"model", "story"}, {"input", json::array()}}), 400, "input", "invalid_value",
                "empty array");
    check_error(embed(s.port, {{"model", "story"}, {"input", {"a", ""}}}), 400, "input", "invalid_value", "'input[1]'");
    check_error(embed(s.port, {{"model", "story"}, {"input", {{1, 2}, json::array()}}}), 400, "input", "invalid_value",
                "'input[1]'");
    check_error(embed(s.port, {{"model", "story"}, {"input", {"a", 1}}}), 400, "input", "invalid_type", "'input[1]'");
    check_error(embed(s.port, {{"model", "story"}, {"input", {1, -2}}}), 400, "input", "invalid_value", "-2");
    check_error(embed(s.port, {{"model", "story"}, {"input", {1, 5000}}}), 400, "input", "invalid_value",
                "vocabulary of 2048");
    check_error(embed(s.port, {{"model", "story"}, {"input", json::object()}}), 400, "input", "invalid_type");
    // dimensions: only the model's own width.
    check_error(embed(s.port, {{"model", "story"}, {"input", "hi"}, {"dimensions", 64}}), 400, "dimensions",
                "invalid_value", "'dimensions' is 64 but pool 'story' embeds in 128 dimensions");
    CHECK(embed(s.port, {{"model", "story"}, {"input", "hi"}, {"dimensions", 128}, {"user", "u1"}}).status == 200);
    check_error(embed(s.port, {{"model", "story"}, {"input", "hi"}, {"dimensions", 0}}), 400, "dimensions",
                "invalid_value");
    check_error(embed(s.port, {{"model", "story"}, {"input", "hi"}, {"encoding_format", "int8"}}), 400,
                "encoding_format", "invalid_value", "\"float\" or \"base64\"");
    // Models: one that does not exist, one that cannot embed.
    check_error(embed(s.port, {{"model", "nope"}, {"input", "hi"}}), 404, "model", "model_not_found");
    check_error(embed(s.port, {{"model", "sim"}, {"input", "hi"}}), 400, "model", "model_not_supported",
                "pool 'sim' is simulated");
    // Tenants' keys, as every other endpoint.
    check_error(post(s.port, "/v1/embeddings", {{"input", "hi"}}), 401, "", "invalid_api_key");
    check_error(post(s.port, "/v1/embeddings", {{"input", "hi"}}, {{"Authorization", "Bearer sk-wrong"}}), 401, "",
                "invalid_api_key");
    check_error(request(s.port, http_client::http::verb::get, "/v1/embeddings", "", k_auth), 405, "",
                "method_not_allowed");
}

TEST_CASE("an encoder pool (bert) embeds as llama-embedding does and refuses generation by name", "[http][embed][encoder]") {
    // The bert file of tests/data/encoders (its script's `steward model synth --arch bert ... --seed 41`),
    // written to disk and served as a user serves a downloaded BGE.
    static const ProcessTempDir dir("steward_test_embed_bert_");
    const std::string model = (dir.path() / "bert.gguf").string();
    REQUIRE(synth_write(encoder_spec("bert", GgmlType::F32), model).ok());
    // llama.cpp's tokens and vector of "the little story of a cat" on that file (CLS pooling).
    std::vector<float> ref;
    int n_ref_tokens = 0;
    for (const EncoderRow& r : encoder_reference_rows())
        if (r.arch == "bert" && r.dtype == "f32" && r.text == 1) ref = r.vec, n_ref_tokens = (int)r.ids.size();
    REQUIRE(ref.size() == 128);
    const std::string text = fmt::format(R"(
[reload]
watch = false
[server]
host = "127.0.0.1"
port = 0
io_threads = 2

[[pool]]
name = "bge"
model = "{0}"
threads = 1
kv_blocks = 16
)",
                                         model);
    auto c = parse_config(text, (dir.path() / "bert.toml").string());
    if (!c) FAIL(c.error().message);
    auto s = serve_config(*c);
    const Reply r = post(s.port, "/v1/embeddings", {{"model", "bge"}, {"input", "the little story of a cat"}});
    INFO(r.body.substr(0, 400));
    REQUIRE(r.status == 200);
    const json j = r.j();
    CHECK(j["usage"]["prompt_tokens"] == n_ref_tokens);  // [CLS] ... [SEP], as llama.cpp counts them
    CHECK(1.0 - cosine(floats_of(j["data"][0]["embedding"]), ref) < 1e-4);
    // A completion on it: a 400 that says what the pool is and where to send what, and the server
    // still serves.
    const Reply g = post(s.port, "/v1/completions", {{"model", "bge"}, {"prompt", "the little"}, {"max_tokens", 4}});
    INFO(g.body);
    CHECK(g.status == 400);
    CHECK_THAT(g.body, Catch::Contains("encoder (bert)") && Catch::Contains("/v1/embeddings"));
    CHECK(post(s.port, "/v1/embeddings", {{"model", "bge"}, {"input", "a cat"}}).status == 200);
}
