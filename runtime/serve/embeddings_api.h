// POST /v1/embeddings as plain values: the body parsed and validated (an error names the field),
// the runtime's EmbeddingResult answered as OpenAI's list of embeddings (floats, or base64 of
// little-endian float32, which the official openai npm client asks for by default), and its
// failures as OpenAI's errors. The HTTP server (http_server.cpp) moves the bytes.
#pragma once
#include <steward/runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/openai_api.h"

namespace steward::serve {

// OpenAI's bound on one request's inputs.
inline constexpr size_t k_max_embedding_inputs = 2048;

struct EmbeddingsRequest {
    std::string model;  // "" or "steward": routed (the first pool that can embed)
    // `input`: a string or an array of strings (texts), or an array of token ids or an array of
    // such arrays (token_ids); one of the two is filled, in order.
    std::vector<std::string> texts;
    std::vector<std::vector<int32_t>> token_ids;
    bool base64 = false;  // encoding_format "base64" (else "float")
    int dimensions = 0;   // 0: not given; else must equal the model's width (Steward does not truncate)
    std::string user;
};

// Parses a body; nullopt with err filled when refused: malformed JSON, `input` missing, empty (no
// input, an empty string or id array), of mixed kinds, over k_max_embedding_inputs, a token id that
// is negative or past int32; encoding_format not "float" / "base64"; dimensions not a positive
// integer. Each a 400 whose param names the field. Unknown fields are ignored, as OpenAI does.
std::optional<EmbeddingsRequest> parse_embeddings_request(std::string_view body, ApiError& err);

// The 200 body: {object: "list", data: [{object: "embedding", index, embedding}], model,
// usage: {prompt_tokens, total_tokens}}; `model` is the name the client asked for ("steward" when
// it gave none). Floats are written in their shortest round-trip form.
std::string embeddings_body(const EmbeddingsRequest& req, const EmbeddingResult& r);

// A vector as OpenAI's base64 encoding_format: its float32s little-endian, base64 (RFC 4648, padded).
std::string base64_floats(const std::vector<float>& v);

// A failed EmbeddingResult as OpenAI's error: an input past the context 400 context_length_exceeded,
// a bad input 400 invalid_value, an unknown pool 404 model_not_found, a pool that cannot embed 400
// model_not_supported, the rest 500 embedding_failed. A `dimensions` other than the model's width
// is a 400 naming both (dimensions_error).
ApiError embeddings_error(const EmbeddingResult& r);
std::optional<ApiError> dimensions_error(const EmbeddingsRequest& req, const EmbeddingResult& r);

}  // namespace steward::serve
