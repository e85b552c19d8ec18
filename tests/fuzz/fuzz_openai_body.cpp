// Fuzzes the OpenAI API's body parsers (runtime/serve/openai_api.h) as the HTTP server calls them.
// The first byte picks the endpoint (chat, completion, tokenize, detokenize), the rest is the body.
// Invariants: nothing throws; a refusal is a 400 or 404 whose error body is OpenAI's JSON with a
// message; an accepted request becomes a runtime request and its response objects serialise.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "serve/openai_api.h"

using namespace steward;
using namespace steward::serve;

namespace {

void fail(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fuzz_openai_body invariant broken: %s: %s\n", what, detail.c_str());
    std::abort();
}

void check_refusal(const ApiError& e) {
    if (e.status != 400 && e.status != 404) fail("refusal status", std::to_string(e.status));
    if (e.message.empty()) fail("refusal without a message", e.param);
    const auto j = nlohmann::json::parse(error_body(e), nullptr, false);
    if (j.is_discarded() || !j["error"]["message"].is_string()) fail("error body is not OpenAI's JSON", error_body(e));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1 || size > 16384) return 0;
    const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
    const int kind = data[0] % 4;
    ApiError err;
    try {
        if (kind == 2) {
            if (!parse_tokenize_request(body, err)) check_refusal(err);
            return 0;
        }
        if (kind == 3) {
            if (!parse_detokenize_request(body, err)) check_refusal(err);
            return 0;
        }
        const bool chat = kind == 0;
        auto r = parse_openai_request(body, chat, err);
        if (!r) {
            check_refusal(err);
            return 0;
        }
        PoolInfo pool;
        pool.name = "p";
        pool.n_ctx = 512;
        Config cfg;
        ApiError model_err;
        auto target = resolve_model(r->model, {pool}, cfg, model_err);
        if (!target) {
            if (model_err.status != 404 || model_err.code != "model_not_found") fail("unknown model", model_err.message);
            target = ModelTarget{};
        }
        std::string rendered;
        if (chat) {
            auto p = render_prompt(pool, *r);
            if (!p) return 0;
            rendered = *p;
        }
        {
            const GenerationRequest g = to_generation_request(*r, *target, "default", rendered);
            if (g.stop.size() > (size_t)k_max_stop || g.top_logprobs < 0 || g.top_logprobs > 20) fail("out-of-range field passed", body);
        }
        GenerationResult res;
        res.text = "out";
        res.tokens = {1, 2};
        res.logprobs = {-0.5f, -1.0f};
        std::vector<GenerationResult> results((size_t)r->n, res);
        const auto full = completion_response(*r, 7, 0, results, {}, {}, &pool);
        if ((int)full["choices"].size() != r->n) fail("choices", full.dump());
        (void)sse_event(stream_chunk(*r, 7, 0, 0, chat ? nlohmann::json{{"content", "x"}} : nlohmann::json("x"), nullptr));
        (void)sse_event(stream_usage_chunk(*r, 7, 0, results));
    } catch (const std::exception& e) {
        fail("exception", e.what());
    }
    return 0;
}
