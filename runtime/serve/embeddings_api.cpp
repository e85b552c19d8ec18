// /v1/embeddings bodies: parse `input` in its four shapes, answer floats or base64, map failures.
#include "serve/embeddings_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

namespace steward::serve {

using json = nlohmann::json;

namespace {

bool refuse(ApiError& err, std::string message, std::string param, std::string code) {
    err = ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
    return false;
}

const char* kind_of(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return "a boolean";
        case json::value_t::string: return "a string";
        case json::value_t::array: return "an array";
        case json::value_t::object: return "an object";
        case json::value_t::number_float: return "a fractional number";
        default: return "a number";
    }
}

// A token id: a JSON integer in [0, INT32_MAX] (the pool's vocabulary bounds it later).
bool token_id(const json& t, int32_t& out) {
    if (t.is_number_unsigned()) {
        if (t.get<uint64_t>() > (uint64_t)INT32_MAX) return false;
        out = (int32_t)t.get<uint64_t>();
        return true;
    }
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) return false;
    out = (int32_t)t.get<int64_t>();
    return true;
}

bool parse_input(const json& body, EmbeddingsRequest& r, ApiError& err) {
    auto it = body.find("input");
    if (it == body.end() || it->is_null())
        return refuse(
            err, "'input' is required: a string, an array of strings, an array of token ids or an array of such arrays",
            "input", "missing_field");
    const json& in = *it;
    if (in.is_string()) {
        if (in.get_ref<const std::string&>().empty())
            return refuse(err, "'input' is an empty string; give some text", "input", "invalid_value");
        r.texts.push_back(in.get<std::string>());
        return true;
    }
    if (!in.is_array())
        return refuse(err, std::string("'input' must be a string or an array, not ") + kind_of(in), "input",
                      "invalid_type");
    if (in.empty()) return refuse(err, "'input' is an empty array; give at least one input", "input", "invalid_value");
    // An array of integers is one input given as token ids.
    if (in.front().is_number()) {
        std::vector<int32_t> ids;
        for (size_t k = 0; k < in.size(); k++) {
            int32_t id;
            if (!token_id(in[k], id))
                return refuse(err,
                              "'input[" + std::to_string(k) + "]' is " + in[k].dump() +
                                  ", which is no token id (ids are integers from 0 to the vocabulary's size - 1)",
                              "input", "invalid_value");
            ids.push_back(id);
        }
        r.token_ids.push_back(std::move(ids));
        return true;
    }
    if (in.size() > k_max_embedding_inputs)
        return refuse(err,
                      "'input' holds " + std::to_string(in.size()) + " inputs; at most " +
                          std::to_string(k_max_embedding_inputs) + " go in one request: split the batch",
                      "input", "invalid_value");
    const bool strings = in.front().is_string();
    for (size_t k = 0; k < in.size(); k++) {
        const json& v = in[k];
        const std::string at = "'input[" + std::to_string(k) + "]'";
        if (strings) {
            if (!v.is_string())
                return refuse(err, at + " is " + kind_of(v) + "; a batch holds strings only, or token-id arrays only",
                              "input", "invalid_type");
            if (v.get_ref<const std::string&>().empty())
                return refuse(err, at + " is an empty string; give some text", "input", "invalid_value");
            r.texts.push_back(v.get<std::string>());
            continue;
        }
        if (!v.is_array())
            return refuse(err, at + " is " + kind_of(v) + "; a batch holds strings only, or token-id arrays only",
                          "input", "invalid_type");
        if (v.empty())
            return refuse(err, at + " is an empty array; give at least one token id", "input", "invalid_value");
        std::vector<int32_t> ids;
        for (size_t t = 0; t < v.size(); t++) {
            int32_t id;
            if (!token_id(v[t], id))
                return refuse(err,
                              "'input[" + std::to_string(k) + "][" + std::to_string(t) + "]' is " + v[t].dump() +
                                  ", which is no token id (ids are integers from 0 to the vocabulary's size - 1)",
                              "input", "invalid_value");
            ids.push_back(id);
        }
        r.token_ids.push_back(std::move(ids));
    }
    return true;
}

void append_float(std::string& out, float v) {
    if (!std::isfinite(v)) {  // JSON has no NaN; a finite model never gives one, but never write invalid JSON
        out += "null";
        return;
    }
    char buf[32];
    auto res = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, res.ptr);
}

}  // namespace

std::optional<EmbeddingsRequest> parse_embeddings_request(std::string_view body, ApiError& err) {
    auto parsed = parse_json_body(body, err);
    if (!parsed) return std::nullopt;
    const json& j = *parsed;
    if (!j.is_object()) {
        refuse(err, std::string("the body must be a JSON object, not ") + kind_of(j), "", "invalid_type");
        return std::nullopt;
    }
    EmbeddingsRequest r;
    auto str = [&](const char* key, std::string& out) {
        auto it = j.find(key);
        if (it == j.end() || it->is_null()) return true;
        if (!it->is_string())
            return refuse(err, std::string("'") + key + "' must be a string, not " + kind_of(*it), key, "invalid_type");
        out = it->get<std::string>();
        return true;
    };
    std::string format = "float";
    if (!str("model", r.model) || !str("user", r.user) || !str("encoding_format", format) || !parse_input(j, r, err))
        return std::nullopt;
    if (format != "float" && format != "base64") {
        refuse(err, "'encoding_format' is \"" + format + "\"; it must be \"float\" or \"base64\"", "encoding_format",
               "invalid_value");
        return std::nullopt;
    }
    r.base64 = format == "base64";
    if (auto it = j.find("dimensions"); it != j.end() && !it->is_null()) {
        const bool whole =
            it->is_number_integer() || (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>());
        const double d = it->is_number() ? it->get<double>() : 0;
        if (!whole || d < 1 || d > (1 << 24)) {
            refuse(err,
                   "'dimensions' is " + it->dump() + "; it must be a positive integer (the model's embedding width)",
                   "dimensions", "invalid_value");
            return std::nullopt;
        }
        r.dimensions = (int)d;
    }
    return r;
}

std::string base64_floats(const std::vector<float>& v) {
    static const char* k_alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::vector<uint8_t> bytes(v.size() * 4);
    for (size_t i = 0; i < v.size(); i++) {
        uint32_t u;
        std::memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; b++) bytes[i * 4 + b] = (uint8_t)(u >> (8 * b));  // little-endian on any host
    }
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const size_t n = std::min<size_t>(3, bytes.size() - i);
        uint32_t chunk = (uint32_t)bytes[i] << 16;
        if (n > 1) chunk |= (uint32_t)bytes[i + 1] << 8;
        if (n > 2) chunk |= bytes[i + 2];
        out += k_alphabet[(chunk >> 18) & 63];
        out += k_alphabet[(chunk >> 12) & 63];
        out += n > 1 ? k_alphabet[(chunk >> 6) & 63] : '=';
        out += n > 2 ? k_alphabet[chunk & 63] : '=';
    }
    return out;
}

std::string embeddings_body(const EmbeddingsRequest& req, const EmbeddingResult& r) {
    // Written by hand around the vectors: nlohmann's json holds a float as a double and prints its
    // 17 digits (0.1f as 0.10000000149011612), twice the bytes of the float's shortest form.
    std::string out = "{\"object\":\"list\",\"data\":[";
    for (size_t i = 0; i < r.vectors.size(); i++) {
        if (i) out += ',';
        out += "{\"object\":\"embedding\",\"index\":" + std::to_string(i) + ",\"embedding\":";
        if (req.base64) {
            out += '"' + base64_floats(r.vectors[i]) + '"';
        } else {
            out += '[';
            for (size_t k = 0; k < r.vectors[i].size(); k++) {
                if (k) out += ',';
                append_float(out, r.vectors[i][k]);
            }
            out += ']';
        }
        out += '}';
    }
    const json usage = {{"prompt_tokens", r.prompt_tokens}, {"total_tokens", r.prompt_tokens}};
    out += "],\"model\":" +
           json(req.model.empty() ? std::string(k_routed_model) : req.model)
               .dump(-1, ' ', false, json::error_handler_t::replace) +
           ",\"usage\":" + usage.dump() + "}";
    return out;
}

ApiError embeddings_error(const EmbeddingResult& r) {
    switch (r.status) {
        case EmbedStatus::CONTEXT_LENGTH_EXCEEDED:
            return {400, r.error, "invalid_request_error", "input", "context_length_exceeded"};
        case EmbedStatus::INVALID_INPUT: return {400, r.error, "invalid_request_error", "input", "invalid_value"};
        case EmbedStatus::UNKNOWN_POOL: return {404, r.error, "invalid_request_error", "model", "model_not_found"};
        case EmbedStatus::UNSUPPORTED_POOL:
            return {400, r.error, "invalid_request_error", "model", "model_not_supported"};
        case EmbedStatus::OK:
        case EmbedStatus::FAILED: break;
    }
    return {500, r.error.empty() ? "the embedding failed" : r.error, "server_error", "", "embedding_failed"};
}

std::optional<ApiError> dimensions_error(const EmbeddingsRequest& req, const EmbeddingResult& r) {
    if (req.dimensions == 0 || req.dimensions == r.n_embd) return std::nullopt;
    return ApiError{400,
                    "'dimensions' is " + std::to_string(req.dimensions) + " but pool '" + r.pool + "' embeds in " +
                        std::to_string(r.n_embd) +
                        " dimensions; Steward does not shorten vectors: omit dimensions or give " +
                        std::to_string(r.n_embd),
                    "invalid_request_error", "dimensions", "invalid_value"};
}

}  // namespace steward::serve
