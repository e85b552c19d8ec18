// Anthropic's Messages API without a server: the body as a chat (system, text / tool_use /
// tool_result blocks, client tools, tool_choice), refusals, the Message object, its event stream
// and errors as Anthropic documents them (docs.anthropic.com/en/api/messages, .../messages-streaming,
// .../errors), and which stop string ended an output.
#include <catch2/catch.hpp>

#include "serve/anthropic_api.h"
#include "sse_events.h"

using namespace steward;
using namespace steward::serve;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

AnthropicRequest parse_ok(const std::string& body) {
    ApiError err;
    auto r = parse_anthropic_request(body, err);
    INFO(err.message);
    REQUIRE(r);
    return *r;
}

GenerationResult result(const std::string& text, FinishReason finish) {
    GenerationResult r;
    r.text = text;
    r.finish = finish;
    r.metrics.prompt_tokens = 20;
    r.metrics.cached_tokens = 16;
    r.metrics.completion_tokens = 3;
    return r;
}

}  // namespace

TEST_CASE("system, text, tool_use, tool_result become chat messages", "[anthropic]") {
    AnthropicRequest r = parse_ok(
        R"({"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
        "stop_sequences": ["END"], "temperature": 0.2, "top_k": 5, "metadata": {"user_id": "u1"},
        "messages": [
          {"role": "user", "content": "weather in Paris?"},
          {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
              {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_abc", "content": [{"type": "text", "text": "sunny"}]},
              {"type": "text", "text": "and tomorrow?", "cache_control": {"type": "ephemeral"}}]}]})");
    const ojson want = ojson::parse(R"([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "abc", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "abc", "content": "sunny"},
        {"role": "user", "content": "and tomorrow?"}])");
    CHECK(r.chat.messages == want);
    CHECK(r.chat.chat);
    CHECK(r.chat.max_tokens == 64);
    CHECK(r.chat.stop == std::vector<std::string>{"END"});
    CHECK(r.chat.temperature == 0.2f);
    CHECK(r.chat.top_k == 5);
    CHECK(r.chat.user == "u1");
}

TEST_CASE("client tools and tool_choice map onto the chat's", "[anthropic]") {
    const std::string tools =
        R"("tools": [{"name": "f", "description": "d", "input_schema": {"type": "object", "properties": {}}}])";
    AnthropicRequest r =
        parse_ok(R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], )" + tools + "}");
    REQUIRE(r.chat.tool_specs);
    CHECK(*r.chat.tool_specs == ojson::parse(R"([{"type": "function", "function": {"name": "f", "description": "d",
        "parameters": {"type": "object", "properties": {}}}}])"));
    CHECK(r.chat.tool_choice == "auto");
    auto with_choice = [&](const std::string& tc) {
        return parse_ok(R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], )" + tools +
                        R"(, "tool_choice": )" + tc + "}");
    };
    CHECK(with_choice(R"({"type": "any"})").chat.tool_choice == "required");
    CHECK(with_choice(R"({"type": "none"})").chat.tool_choice == "none");
    const AnthropicRequest named = with_choice(R"({"type": "tool", "name": "f", "disable_parallel_tool_use": true})");
    CHECK(named.chat.tool_choice == "function");
    CHECK(named.chat.tool_choice_name == "f");
    CHECK(named.disable_parallel_tool_use);
}

TEST_CASE("Messages: what is not served is a 400 naming it", "[anthropic]") {
    struct Case {
        std::string body, param, in_message;
    };
    const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
    const std::vector<Case> cases = {
        {R"({"model": "m", )" + msgs + "}", "max_tokens", "Field required"},
        {R"({"max_tokens": 8, )" + msgs + "}", "model", "Field required"},
        {R"({"model": "m", "max_tokens": 8})", "messages", "Field required"},
        {R"({"model": "m", "max_tokens": 8, )" + msgs +
             R"(, "tools": [{"type": "web_search_20250305", "name": "web_search"}]})",
         "tools.0.type", "web_search_20250305"},
        {R"({"model": "m", "max_tokens": 8, )" + msgs + R"(, "tools": [{"name": "f"}]})", "tools.0.input_schema",
         "required"},
        {R"({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})",
         "messages.0.content.0.type", "'image'"},
        {R"({"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]})", "messages.0.role",
         "'system'"},
        {R"({"model": "m", "max_tokens": 8, )" + msgs + R"(, "thinking": {"type": "enabled", "budget_tokens": 1024}})",
         "thinking", "not supported"},
        {R"({"model": "m", "max_tokens": 8, )" + msgs + R"(, "temperature": 1.5})", "temperature", "[0, 1]"},
        {R"({"model": "m", "max_tokens": 8, )" + msgs + R"(, "tool_choice": {"type": "any"}})", "tool_choice",
         "needs 'tools'"},
        {R"({"model": "m", "max_tokens": 8, )" + msgs + R"(, "stop_sequences": [""]})", "stop_sequences",
         "stop_sequences"},
        {R"({"model": "m", "max_tokens": 8, )" + msgs + R"(, "frobnicate": 1})", "frobnicate",
         "Extra inputs are not permitted"},
    };
    for (const Case& c : cases) {
        INFO(c.body);
        ApiError err;
        REQUIRE_FALSE(parse_anthropic_request(c.body, err));
        CHECK(err.status == 400);
        CHECK(err.param == c.param);
        CHECK(err.message.find(c.in_message) != std::string::npos);
    }
}

TEST_CASE("errors take Anthropic's shape and types", "[anthropic]") {
    const json j = json::parse(
        anthropic_error_body(ApiError{404, "no such model", "invalid_request_error", "model", "model_not_found"}));
    CHECK(j == json::parse(R"({"type": "error", "error": {"type": "not_found_error", "message": "no such model"}})"));
    CHECK(std::string(anthropic_error_type(400)) == "invalid_request_error");
    CHECK(std::string(anthropic_error_type(401)) == "authentication_error");
    CHECK(std::string(anthropic_error_type(429)) == "rate_limit_error");
    CHECK(std::string(anthropic_error_type(500)) == "api_error");
}

TEST_CASE("the Message answer has Anthropic's fields and stop reasons", "[anthropic]") {
    AnthropicRequest r = parse_ok(
        R"({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["END"]})");
    AnthropicAnswer a(r, "msg_1");
    ChoiceOutput text;
    text.content = "Hi";
    const json j = a.answer(result("Hi", FinishReason::STOP), text, "");
    CHECK(j == json::parse(R"({"id": "msg_1", "type": "message", "role": "assistant", "model": "tiny",
        "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 16, "output_tokens": 3}})"));
    CHECK(a.answer(result("Hi", FinishReason::STOP), text, "END")["stop_reason"] == "stop_sequence");
    CHECK(a.answer(result("Hi", FinishReason::STOP), text, "END")["stop_sequence"] == "END");
    CHECK(a.answer(result("Hi", FinishReason::LENGTH), text, "")["stop_reason"] == "max_tokens");
    ChoiceOutput calls;
    calls.tool_calls = json::array(
        {{{"id", "call_xyz"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", R"({"a":1})"}}}}});
    const json t = a.answer(result("", FinishReason::STOP), calls, "");
    CHECK(t["stop_reason"] == "tool_use");
    CHECK(t["content"] == json::parse(R"([{"type": "tool_use", "id": "toolu_xyz", "name": "f", "input": {"a": 1}}])"));
    CHECK(chat_tool_id(anthropic_tool_id("call_xyz")) == "xyz");
}

TEST_CASE("the stream's events come in Anthropic's order", "[anthropic]") {
    AnthropicRequest r =
        parse_ok(R"({"model": "tiny", "max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}]})");
    AnthropicAnswer a(r, "msg_1");
    const json call = {
        {"id", "call_q"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", R"({"a":1})"}}}};
    std::string sse = a.stream_open();  // one call after another: the answer keeps the stream's state
    sse += a.stream_delta({{"content", "Hi"}});
    sse += a.stream_delta({{"content", " there"}});
    sse += a.stream_delta({{"tool_calls", json::array({call})}});
    sse += a.stream_finish(result("", FinishReason::STOP), "");
    const auto events = steward::test::sse_events(sse);
    std::vector<std::string> types;
    for (const auto& e : events) {
        types.push_back(e.data["type"]);
        CHECK(e.name == e.data["type"]);
    }
    const std::vector<std::string> want = {"message_start",       "content_block_start", "ping",
                                           "content_block_delta", "content_block_delta", "content_block_stop",
                                           "content_block_start", "content_block_delta", "content_block_stop",
                                           "message_delta",       "message_stop"};
    CHECK(types == want);
    const json& m = events[0].data["message"];
    CHECK(m["id"] == "msg_1");
    CHECK(m["role"] == "assistant");
    CHECK(m["content"] == json::array());
    CHECK(m["stop_reason"].is_null());
    CHECK(events[1].data["index"] == 0);
    CHECK(events[1].data["content_block"] == json::parse(R"({"type": "text", "text": ""})"));
    CHECK(events[3].data["delta"] == json::parse(R"({"type": "text_delta", "text": "Hi"})"));
    CHECK(events[6].data["index"] == 1);
    CHECK(events[6].data["content_block"] ==
          json::parse(R"({"type": "tool_use", "id": "toolu_q", "name": "f", "input": {}})"));
    CHECK(events[7].data["delta"] == json::parse(R"({"type": "input_json_delta", "partial_json": "{\"a\":1}"})"));
    CHECK(events[9].data["delta"]["stop_reason"] == "tool_use");
    CHECK(events[9].data["usage"]["output_tokens"] == 3);
    const auto err =
        steward::test::sse_events(a.stream_error(ApiError{429, "busy", "rate_limit_error", "", "overloaded"}));
    REQUIRE(err.size() == 1);
    CHECK(err[0].name == "error");
    CHECK(err[0].data == json::parse(R"({"type": "error", "error": {"type": "rate_limit_error", "message": "busy"}})"));
}

TEST_CASE("the stop string that ended an output is found", "[anthropic]") {
    CHECK(matched_stop("Once upon ", "Once upon END and", {"and", "END"}) == "END");
    CHECK(matched_stop("Once upon", "Once upon", {"END"}).empty());   // ended at end-of-sequence
    CHECK(matched_stop("Once", " Once END", {"END", "x"}) == "END");  // decoded otherwise: the first found
    CHECK(matched_stop("a", "aXY", {"XYZ", "XY"}) == "XY");
}
