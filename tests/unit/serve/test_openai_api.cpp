// The OpenAI API's bodies without a server: parsing (every refusal names its field), the model
// field, the ChatML fallback prompt, ids, usage and chunk shapes.
#include <catch2/catch.hpp>

#include "grammar/grammar.h"
#include "serve/openai_api.h"
#include "pool/pool.h"

using namespace steward;
using namespace steward::serve;
using json = nlohmann::json;

TEST_CASE("a chat body's fields reach the request with OpenAI's defaults for the rest", "[serve][openai]") {
    ApiError err;
    auto r = parse_openai_request(
        R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9, "stop": "END",
            "n": 2, "logprobs": true, "top_logprobs": 3, "logit_bias": {"7": -100}, "seed": 5, "session": "s",
            "stream": true, "stream_options": {"include_usage": true}, "presence_penalty": 1.5, "whatever": [1]})",
        true, err);
    REQUIRE(r);
    CHECK(r->model == "m");
    CHECK(r->max_tokens == 9);
    CHECK(r->temperature == 1.0f);
    CHECK(r->stop == std::vector<std::string>{"END"});
    CHECK(r->n == 2);
    CHECK(r->logprobs);
    CHECK(r->top_logprobs == 3);
    REQUIRE(r->logit_bias.size() == 1);
    CHECK(r->logit_bias[0] == std::pair<int32_t, float>{7, -100.0f});
    CHECK(r->include_usage);
    CHECK(r->session == "s");
    const GenerationRequest g0 = to_generation_request(*r, ModelTarget{"p", ""}, "t", "PROMPT");
    CHECK(g0.prompt == "PROMPT");
    CHECK(g0.pool == "p");
    CHECK(g0.tenant == "t");
    CHECK(g0.parse_special);
    CHECK(g0.seed == 5);
    CHECK(g0.presence_penalty == 1.5f);
    CHECK(g0.top_logprobs == 3);
}

TEST_CASE("ignore_eos (llama-server's and vLLM's extension) reaches the request, off by default", "[serve][openai]") {
    ApiError err;
    auto on = parse_openai_request(R"({"prompt": "x", "ignore_eos": true})", false, err);
    auto off = parse_openai_request(R"({"prompt": "x"})", false, err);
    REQUIRE(on);
    REQUIRE(off);
    CHECK(to_generation_request(*on, ModelTarget{}, "t", "").ignore_eos);
    CHECK_FALSE(to_generation_request(*off, ModelTarget{}, "t", "").ignore_eos);
    REQUIRE_FALSE(parse_openai_request(R"({"prompt": "x", "ignore_eos": 1})", false, err));
    CHECK(err.param == "ignore_eos");
}

TEST_CASE("refused bodies name the field, the value and what it must be", "[serve][openai]") {
    struct Case {
        bool chat;
        std::string body, param, in_message;
    };
    const std::vector<Case> cases = {
        {true, R"({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5})", "top_p", "'top_p' is 1.5; it must be in [0, 1]"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5})", "max_tokens", "must be an integer, not a number"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "seed": "1"})", "seed", "must be an integer"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs", "needs 'logprobs': true"},
        {true, R"({"messages": [{"role": "user", "content": 3}]})", "messages[0].content", "a string or an array of parts"},
        {true, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content", "not supported"},
        // A part's type of another JSON type (the fuzzer's find: it threw out of the parser).
        {true, R"({"messages": [{"role": "user", "content": [{"type": 6, "text": "hi"}]}]})", "messages[0].content", "not supported"},
        {true, R"({"messages": [{"content": "x"}]})", "messages[0].role", "must be a string"},
        {true, R"({"messages": []})", "messages", "empty"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "stop": ["a", ""]})", "stop", "1 to 256 bytes"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}})",
         "stream_options.include_usage", "a boolean"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"3": 200}})", "logit_bias", "[-100, 100]"},
        // Refused, not accepted silently.
        {true, R"({"messages": [{"role": "user", "content": null}]})", "messages[0].content", "is null; a user message needs content"},
        {true, R"({"messages": [{"role": "system"}]})", "messages[0].content", "is missing"},
        {true, R"({"messages": [{"role": "tool", "tool_call_id": "c"}]})", "messages[0].content", "a tool message needs content"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [1]})", "tools[0]", "must be an object, not an integer"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"parameters": {}}}]})",
         "tools[0].function.name", "non-empty string"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": ""}}]})",
         "tools[0].function.name", "non-empty string"},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]})", "tools[0].type", "must be \"function\""},
        {true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
         "tools[0].function.parameters", "JSON Schema object"},
        {false, R"({"prompt": [2147483648]})", "prompt", "holds 2147483648, which is no token id"},
        {false, R"({"prompt": [18446744073709551615]})", "prompt", "which is no token id"},
        {false, R"({"prompt": 5})", "prompt", "a string or an array of token ids"},
        {false, R"({"prompt": [1, -2]})", "prompt", "holds -2, which is no token id"},
        {false, R"({"prompt": "x", "logprobs": 6})", "logprobs", "in [0, 5]"},
        {false, R"({})", "prompt", "required"},
        {false, R"([1, 2])", "", "must be a JSON object"},
    };
    for (const auto& c : cases) {
        INFO(c.body);
        ApiError err;
        REQUIRE(!parse_openai_request(c.body, c.chat, err));
        CHECK(err.status == 400);
        CHECK(err.param == c.param);
        CHECK_THAT(err.message, Catch::Contains(c.in_message));
        const json body = json::parse(error_body(err));
        CHECK(body["error"]["message"] == err.message);
        CHECK(body["error"]["type"] == "invalid_request_error");
    }
}

TEST_CASE("an assistant message that calls tools may have null content", "[serve][openai]") {
    ApiError err;
    CHECK(parse_openai_request(
        R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "1"}]})",
        true, err));
}

TEST_CASE("a completion prompt is text, one string in an array, or token ids", "[serve][openai]") {
    ApiError err;
    auto text = parse_openai_request(R"({"prompt": ["only one"], "logprobs": 2, "echo": true})", false, err);
    REQUIRE(text);
    CHECK(text->prompt == "only one");
    CHECK(!text->prompt_is_ids);
    CHECK(text->logprobs);
    CHECK(text->top_logprobs == 2);
    CHECK(text->echo);
    auto ids = parse_openai_request(R"({"prompt": [3, 4, 5]})", false, err);
    REQUIRE(ids);
    CHECK(ids->prompt_is_ids);
    CHECK(ids->prompt_ids == std::vector<int32_t>{3, 4, 5});
    CHECK(to_generation_request(*ids, {}, "default", "").prompt_ids == std::vector<int32_t>{3, 4, 5});
}

TEST_CASE("the model field routes, pins a pool, names a bucket, or is not found", "[serve][openai]") {
    const auto pool = [](std::string name) {
        PoolInfo p;
        p.name = std::move(name);
        return p;
    };
    const PoolInfo a = pool("a"), b = pool("b");
    Config cfg;
    cfg.buckets.push_back(BucketConfig{});
    cfg.buckets.back().name = "chat";
    ApiError err;
    auto routed = resolve_model("steward", {a, b}, cfg, err);
    REQUIRE(routed);
    CHECK(routed->pool.empty());
    CHECK(routed->bucket_hint.empty());
    CHECK(resolve_model("", {a, b}, cfg, err)->pool.empty());
    CHECK(resolve_model("b", {a, b}, cfg, err)->pool == "b");
    CHECK(resolve_model("chat", {a, b}, cfg, err)->bucket_hint == "chat");
    CHECK(!resolve_model("gpt-4o", {a, b}, cfg, err));
    CHECK(err.status == 404);
    CHECK(err.code == "model_not_found");
    CHECK_THAT(err.message, Catch::Contains("steward, a, b, chat"));
    const json list = models_list({a, b}, cfg, 0);
    REQUIRE(list["data"].size() == 4);
    // Pools first (a client taking the first entry gets a model), then the routes.
    CHECK(list["data"][0]["id"] == "a");
    CHECK(list["data"][0]["steward_kind"] == "pool");
    CHECK(list["data"][1]["id"] == "b");
    CHECK(list["data"][2]["id"] == "steward");
    CHECK(list["data"][2]["steward_kind"] == "routed");
    CHECK(list["data"][3]["steward_kind"] == "bucket");
}

TEST_CASE("no template: refused, the chatml fallback renders ChatML", "[serve][openai]") {
    ApiError err;
    auto r = parse_openai_request(
        R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "assistant", "content": null}]})",
        true, err);
    REQUIRE(r);
    PoolInfo none;
    none.name = "plain";
    auto refused = render_prompt(none, *r);
    REQUIRE(!refused);
    CHECK_THAT(refused.error().message, Catch::Contains("chat_template_file") && Catch::Contains("plain"));
    const PoolRendering pr = render_for_pool(*r, none);
    REQUIRE(pr.error);
    CHECK(pr.error->code == "chat_template_missing");
    PoolInfo chatml;
    chatml.chat_template = k_chatml_template;
    auto p = render_prompt(chatml, *r);
    REQUIRE(p);
    CHECK(*p == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("request ids round-trip through the response id, anything else is 0", "[serve][openai]") {
    CHECK(response_id(true, 42) == "chatcmpl-42");
    CHECK(response_id(false, 42) == "cmpl-42");
    CHECK(parse_request_id("chatcmpl-42") == 42);
    CHECK(parse_request_id("cmpl-7") == 7);
    CHECK(parse_request_id("9") == 9);
    CHECK(parse_request_id("chatcmpl-") == 0);
    CHECK(parse_request_id("x-9") == 0);
    CHECK(parse_request_id("9a") == 0);
}

TEST_CASE("usage counts the shared prompt once and every choice's output, chunks have OpenAI's shape", "[serve][openai]") {
    GenerationResult a, b;
    a.metrics.prompt_tokens = b.metrics.prompt_tokens = 10;
    a.metrics.cached_tokens = 8;
    a.metrics.completion_tokens = 3;
    b.metrics.completion_tokens = 4;
    const json u = usage_json({a, b});
    CHECK(u["prompt_tokens"] == 10);
    CHECK(u["completion_tokens"] == 7);
    CHECK(u["total_tokens"] == 17);
    CHECK(u["prompt_tokens_details"]["cached_tokens"] == 8);
    OpenAiRequest chat;
    chat.chat = true;
    const json c = stream_chunk(chat, 5, 100, 1, {{"content", "x"}}, "stop");
    CHECK(c["object"] == "chat.completion.chunk");
    CHECK(c["id"] == "chatcmpl-5");
    CHECK(c["choices"][0]["index"] == 1);
    CHECK(c["choices"][0]["delta"]["content"] == "x");
    CHECK(c["choices"][0]["finish_reason"] == "stop");
    CHECK(sse_event(c).rfind("data: {", 0) == 0);
    CHECK(sse_event(c).substr(sse_event(c).size() - 2) == "\n\n");
    const json last = stream_usage_chunk(chat, 5, 100, {a});
    CHECK(last["choices"].empty());
    CHECK(last["usage"]["completion_tokens"] == 3);
    GenerationResult over;
    over.finish = FinishReason::OVERLOADED;
    over.error = "queue full";
    const ApiError e = error_for_result(over);
    CHECK(e.status == 429);
    CHECK(e.message == "queue full");
}

TEST_CASE("response_format json_schema / json_object and grammar become the request's constraint, json ones classify as json", "[serve][grammar]") {
    ApiError err;
    auto r = parse_openai_request(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",
        "json_schema": {"name": "n", "strict": true, "schema": {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "boolean"}}}}}})",
                                  true, err);
    REQUIRE(r);
    CHECK(r->json_schema.find("\"z\"") < r->json_schema.find("\"a\""));  // the property order as sent
    GenerationRequest g = to_generation_request(*r, {}, "t", "p");
    CHECK(g.json_schema == r->json_schema);
    CHECK(g.response_format == "json");  // the structured bucket's match rule
    auto o = parse_openai_request(R"({"prompt": "x", "response_format": {"type": "json_object"}})", false, err);
    REQUIRE(o);
    CHECK(to_generation_request(*o, {}, "t", "p").json_object);
    CHECK(to_generation_request(*o, {}, "t", "p").response_format == "json");
    auto t = parse_openai_request(R"({"prompt": "x", "response_format": {"type": "text"}})", false, err);
    REQUIRE(t);
    CHECK(to_generation_request(*t, {}, "t", "p").response_format.empty());
    auto gb = parse_openai_request(R"({"prompt": "x", "grammar": "root ::= [0-9]+"})", false, err);
    REQUIRE(gb);
    CHECK(to_generation_request(*gb, {}, "t", "p").grammar == "root ::= [0-9]+");
    CHECK(to_generation_request(*gb, {}, "t", "p").response_format.empty());

    CHECK_FALSE(parse_openai_request(R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema":
        {"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 1}}}}}})", false, err));
    CHECK(err.status == 400);
    CHECK(err.code == "invalid_json_schema");
    CHECK_THAT(err.message, Catch::Contains("/properties/a"));
    CHECK_FALSE(parse_openai_request(R"({"prompt": "x", "grammar": "root ::= (\"a\""})", false, err));
    CHECK(err.code == "invalid_grammar");
    CHECK_THAT(err.message, Catch::Contains("grammar:1:"));
    CHECK_FALSE(parse_openai_request(R"({"prompt": "x", "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}})", false, err));
    CHECK(err.param == "grammar");
}

TEST_CASE("tool_choice: required and a named function set the pool's tool-call grammar, none leaves calls as content", "[serve][openai][tools]") {
    const std::string tools = R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer","minimum":0,"maximum":9}},"required":["x"]}}}])";
    const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
    PoolInfo hermes;
    hermes.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}<tool_call>";
    for (const std::string choice : {R"("required")", R"({"type": "function", "function": {"name": "f"}})"}) {
        ApiError err;
        auto r = parse_openai_request("{" + msgs + R"(, "tools": )" + tools + R"(, "tool_choice": )" + choice + "}", true, err);
        REQUIRE(r);
        CHECK(r->grammar.empty());
        REQUIRE(apply_tool_choice(*r, hermes, err));
        auto g = CompiledGrammar::from_gbnf(r->grammar);
        REQUIRE(g.ok());
        GrammarMatcher ok(*g), bad(*g);
        CHECK((ok.accept_bytes("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 7}}\n</tool_call>") && ok.is_accepting()));
        CHECK_FALSE(bad.accept_bytes("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 10"));
        CHECK(to_generation_request(*r, {}, "t", "").grammar == r->grammar);
    }
    ApiError err;
    auto none = parse_openai_request("{" + msgs + R"(, "tools": )" + tools + R"(, "tool_choice": "none"})", true, err);
    REQUIRE(none);
    REQUIRE(apply_tool_choice(*none, hermes, err));
    CHECK(none->grammar.empty());
    const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
    const ChoiceOutput out = parse_choice_output(*none, &hermes, call);
    CHECK(out.content == call);
    CHECK(out.tool_calls.empty());
    // Refusals name tool_choice.
    for (const std::string body : {"{" + msgs + R"(, "tool_choice": "required"})",
                                   "{" + msgs + R"(, "tools": )" + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}})",
                                   "{" + msgs + R"(, "tools": )" + tools + R"(, "tool_choice": "required", "grammar": "root ::= \"a\""})"}) {
        ApiError e;
        INFO(body);
        CHECK_FALSE(parse_openai_request(body, true, e));
        CHECK(e.param == "tool_choice");
    }
    ApiError e;
    CHECK_FALSE(parse_openai_request(R"({"prompt": "x", "tool_choice": "auto"})", false, e));
    CHECK(e.param == "tool_choice");
}
