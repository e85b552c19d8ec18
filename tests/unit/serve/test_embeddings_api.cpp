// /v1/embeddings bodies (runtime/serve/embeddings_api.h): the four shapes of `input`, the base64
// encoding against Python's struct + base64, and the answer's shape.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "serve/embeddings_api.h"

using namespace steward;
using namespace steward::serve;
using json = nlohmann::json;

TEST_CASE("embeddings input takes its four OpenAI shapes", "[serve][embed]") {
    ApiError err;
    auto one = parse_embeddings_request(R"({"input": "hi", "model": "m", "user": "u"})", err);
    REQUIRE(one);
    CHECK(one->texts == std::vector<std::string>{"hi"});
    CHECK(one->model == "m");
    CHECK(!one->base64);
    auto texts =
        parse_embeddings_request(R"({"input": ["a", "b"], "encoding_format": "base64", "dimensions": 64})", err);
    REQUIRE(texts);
    CHECK(texts->texts == std::vector<std::string>{"a", "b"});
    CHECK(texts->base64);
    CHECK(texts->dimensions == 64);
    auto ids = parse_embeddings_request(R"({"input": [1, 2, 3]})", err);
    REQUIRE(ids);
    CHECK(ids->token_ids == std::vector<std::vector<int32_t>>{{1, 2, 3}});
    auto batch = parse_embeddings_request(R"({"input": [[1], [2, 3]]})", err);
    REQUIRE(batch);
    CHECK(batch->token_ids == std::vector<std::vector<int32_t>>{{1}, {2, 3}});
    for (const char* bad : {R"({"input": [1, "a"]})", R"({"input": [[1], 2]})", R"({"input": [1.5]})",
                            R"({"input": [4294967296]})", R"({"input": "x", "dimensions": -1})",
                            R"({"input": "x", "dimensions": 1.5})", R"({"input": "x", "encoding_format": "int8"})",
                            R"({"input": "x", "model": 3})", R"([1])", R"({"input": true})"}) {
        INFO(bad);
        CHECK(!parse_embeddings_request(bad, err));
        CHECK(err.status == 400);
        CHECK(!err.code.empty());
    }
    json many = {{"input", json::array()}};
    for (size_t i = 0; i <= k_max_embedding_inputs; i++) many["input"].push_back("x");
    CHECK(!parse_embeddings_request(many.dump(), err));
    CHECK_THAT(err.message, Catch::Contains("2049 inputs"));
}

TEST_CASE("base64 embeddings are little-endian float32s", "[serve][embed]") {
    // python3 -c "import struct, base64; print(base64.b64encode(struct.pack('<2f', 1.0, -2.0)).decode())"
    CHECK(base64_floats({1.0f, -2.0f}) == "AACAPwAAAMA=");
    CHECK(base64_floats({0.1f, -0.5f, 3.25f}) == "zczMPQAAAL8AAFBA");
    CHECK(base64_floats({}).empty());
}

TEST_CASE("the embeddings answer is OpenAI's list", "[serve][embed]") {
    EmbeddingsRequest req;
    EmbeddingResult r;
    r.pool = "p";
    r.n_embd = 2;
    r.vectors = {{0.6f, -0.8f}, {1.0f, 0.0f}};
    r.prompt_tokens = 7;
    const json j = json::parse(embeddings_body(req, r));
    CHECK(j["object"] == "list");
    CHECK(j["model"] == "steward");  // none asked: the routed alias
    CHECK(j["usage"] == json{{"prompt_tokens", 7}, {"total_tokens", 7}});
    REQUIRE(j["data"].size() == 2);
    CHECK(j["data"][1] == json{{"object", "embedding"}, {"index", 1}, {"embedding", {1.0, 0.0}}});
    CHECK(j["data"][0]["embedding"][0].get<float>() == 0.6f);
    req.base64 = true;
    req.model = "p";
    const json b = json::parse(embeddings_body(req, r));
    CHECK(b["model"] == "p");
    CHECK(b["data"][1]["embedding"] == base64_floats({1.0f, 0.0f}));
    req.dimensions = 3;
    auto e = dimensions_error(req, r);
    REQUIRE(e);
    CHECK_THAT(e->message, Catch::Contains("'dimensions' is 3") && Catch::Contains("2 dimensions"));
    req.dimensions = 2;
    CHECK(!dimensions_error(req, r));
}
