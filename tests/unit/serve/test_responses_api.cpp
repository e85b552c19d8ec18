// OpenAI's Responses API without a server: the body as a chat (input items, instructions, flat
// function tools), refusals by name, the Response object and its event stream as OpenAI documents
// them (platform.openai.com/docs/api-reference/responses and .../responses-streaming), and the
// per-tenant store that previous_response_id reads.
#include <catch2/catch.hpp>

#include "serve/responses_api.h"
#include "sse_events.h"

using namespace steward;
using namespace steward::serve;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

ResponsesRequest parse_ok(const std::string& body) {
    ApiError err;
    auto r = parse_responses_request(body, err);
    INFO(err.message);
    REQUIRE(r);
    return *r;
}

ApiError parse_error(const std::string& body) {
    ApiError err;
    auto r = parse_responses_request(body, err);
    REQUIRE_FALSE(r);
    CHECK(err.status == 400);
    return err;
}

GenerationResult result(const std::string& text, FinishReason finish, int prompt = 12, int cached = 4,
                        int completion = 5) {
    GenerationResult r;
    r.text = text;
    r.finish = finish;
    r.pool = "p";
    r.metrics.prompt_tokens = prompt;
    r.metrics.cached_tokens = cached;
    r.metrics.completion_tokens = completion;
    return r;
}

json call(const std::string& id, const std::string& name, const std::string& args) {
    return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
}

}  // namespace

TEST_CASE("a string input is one user message of a chat", "[responses]") {
    ResponsesRequest r = parse_ok(R"({"model": "m", "input": "hi", "max_output_tokens": 7, "temperature": 0.5})");
    continue_conversation(r, nullptr, "resp_x");
    CHECK(r.chat.chat);
    CHECK(r.chat.model == "m");
    CHECK(r.chat.max_tokens == 7);
    CHECK(r.chat.temperature == 0.5f);
    CHECK(r.chat.messages == ojson::parse(R"([{"role": "user", "content": "hi"}])"));
    CHECK(r.store);                               // OpenAI's default
    CHECK(r.chat.session == "responses/resp_x");  // a stored response starts a session
}

TEST_CASE("input items become chat messages, calls and outputs", "[responses]") {
    ResponsesRequest r = parse_ok(R"({"model": "m", "instructions": "be brief", "store": false, "input": [
        {"role": "developer", "content": "dev"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "in Paris?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]}]})");
    continue_conversation(r, nullptr, "resp_x");
    const ojson want = ojson::parse(R"([
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": "dev"},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon", "name": "get_time"}])");
    CHECK(r.chat.messages == want);
    CHECK(r.chat.session.empty());  // store false, no previous response: no session to keep
}

TEST_CASE("flat function tools and tool_choice become the chat's", "[responses]") {
    ResponsesRequest r = parse_ok(R"({"model": "m", "input": "x",
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}, "strict": true}],
        "tool_choice": {"type": "function", "name": "f"}})");
    REQUIRE(r.chat.tool_specs);
    CHECK(*r.chat.tool_specs == ojson::parse(R"([{"type": "function", "function": {"name": "f", "description": "d",
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}])"));
    CHECK(r.chat.tool_choice == "function");
    CHECK(r.chat.tool_choice_name == "f");
    CHECK(
        parse_ok(
            R"({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"})")
            .chat.tool_choice == "required");
}

TEST_CASE("Responses: what is not served is a 400 naming it", "[responses]") {
    struct Case {
        std::string body, param, in_message;
    };
    const std::vector<Case> cases = {
        {R"({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type", "'web_search'"},
        {R"({"model": "m", "input": "x", "tools": [{"type": "file_search", "vector_store_ids": []}]})", "tools[0].type",
         "'file_search'"},
        {R"({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
         "input[0].content[0].type", "'input_image'"},
        {R"({"model": "m", "input": [{"type": "reasoning", "summary": []}]})", "input[0].type", "'reasoning'"},
        {R"({"model": "m", "input": "x", "reasoning": {"effort": "high"}})", "reasoning", "not supported"},
        {R"({"model": "m", "input": "x", "background": true})", "background", "not supported"},
        {R"({"model": "m", "input": "x", "truncation": "auto"})", "truncation", "\"auto\""},
        {R"({"model": "m", "input": "x", "frobnicate": 1})", "frobnicate", "Unknown parameter: 'frobnicate'"},
        {R"({"model": "m", "input": "x", "max_output_tokens": 0})", "max_output_tokens", "[1, 1048576]"},
        {R"({"model": "m", "input": "x", "temperature": 3})", "temperature", "[0, 2]"},
        {R"({"model": "m", "input": "x", "tool_choice": "required"})", "tool_choice", "needs 'tools'"},
        {R"({"model": "m", "input": "x", "tool_choice": {"type": "web_search_preview"}})", "tool_choice.type",
         "web_search_preview"},
        {R"({"model": "m", "input": []})", "input", "empty"},
        {R"({"input": "x"})", "model", "required"},
        {R"({"model": "m", "input": "x", "metadata": {"k": 1}})", "metadata.k", "string"},
        {R"({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": 5}}})",
         "text.format.schema", ""},
    };
    for (const Case& c : cases) {
        INFO(c.body);
        const ApiError e = parse_error(c.body);
        CHECK(e.param == c.param);
        CHECK(e.message.find(c.in_message) != std::string::npos);
    }
}

TEST_CASE("previous turns precede input, instructions are not carried", "[responses]") {
    auto first = std::make_shared<ConversationTurn>();
    first->session = "responses/resp_a";
    first->messages = ojson::parse(R"([{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}])");
    auto second = std::make_shared<ConversationTurn>();
    second->parent = first;
    second->session = first->session;
    second->messages = ojson::parse(R"([{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}])");
    ResponsesRequest r =
        parse_ok(R"({"model": "m", "input": "q3", "instructions": "new", "previous_response_id": "resp_b"})");
    continue_conversation(r, second.get(), "resp_c");
    CHECK(r.chat.messages == ojson::parse(R"([{"role": "system", "content": "new"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"}])"));
    CHECK(r.chat.session == "responses/resp_a");  // the chain's one session
}

TEST_CASE("the Response object has OpenAI's fields", "[responses]") {
    ResponsesRequest r = parse_ok(R"({"model": "tiny", "input": "hi", "metadata": {"k": "v"}, "instructions": "i"})");
    auto store = std::make_shared<ResponseStore>(8, 1 << 20, std::chrono::seconds(60));
    ResponsesAnswer a(r, "resp_abc", 1700000000, store, "t", nullptr);
    ChoiceOutput out;
    out.content = "Hello";
    const json j = a.answer(result("Hello", FinishReason::STOP), out, "");
    CHECK(j["id"] == "resp_abc");
    CHECK(j["object"] == "response");
    CHECK(j["created_at"] == 1700000000);
    CHECK(j["status"] == "completed");
    CHECK(j["model"] == "tiny");
    CHECK(j["instructions"] == "i");
    CHECK(j["metadata"] == json{{"k", "v"}});
    CHECK(j["error"].is_null());
    CHECK(j["incomplete_details"].is_null());
    CHECK(j["previous_response_id"].is_null());
    REQUIRE(j["output"].size() == 1);
    const json& m = j["output"][0];
    CHECK(m["type"] == "message");
    CHECK(m["role"] == "assistant");
    CHECK(m["status"] == "completed");
    CHECK(m["id"].get<std::string>().rfind("msg_", 0) == 0);
    CHECK(m["content"][0]["type"] == "output_text");
    CHECK(m["content"][0]["text"] == "Hello");
    CHECK(m["content"][0]["annotations"] == json::array());
    CHECK(j["usage"] ==
          json::parse(R"({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 17})"));
    // Stored with its turn: the input and the answer as chat messages.
    auto e = store->get("t", "resp_abc");
    REQUIRE(e);
    CHECK(e->response == j);
    CHECK(e->turn->messages ==
          ojson::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}])"));
}

TEST_CASE("max_output_tokens reached: incomplete, with the reason", "[responses]") {
    ResponsesRequest r = parse_ok(R"({"model": "m", "input": "hi", "max_output_tokens": 5})");
    ResponsesAnswer a(r, "resp_abc", 1, nullptr, "t", nullptr);
    ChoiceOutput out;
    out.content = "Once upon";
    const json j = a.answer(result("Once upon", FinishReason::LENGTH), out, "");
    CHECK(j["status"] == "incomplete");
    CHECK(j["incomplete_details"] == json{{"reason", "max_output_tokens"}});
    CHECK(j["max_output_tokens"] == 5);
    CHECK(j["output"][0]["status"] == "incomplete");
}

TEST_CASE("tool calls are function_call items with call_id and name", "[responses]") {
    ResponsesRequest r = parse_ok(
        R"({"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}], "parallel_tool_calls": false})");
    auto store = std::make_shared<ResponseStore>(8, 1 << 20, std::chrono::seconds(60));
    ResponsesAnswer a(r, "resp_abc", 1, store, "t", nullptr);
    ChoiceOutput out;
    out.tool_calls = json::array({call("call_1", "f", R"({"a":1})"), call("call_2", "f", "{}")});
    const json j = a.answer(result("", FinishReason::STOP), out, "");
    REQUIRE(j["output"].size() == 1);  // parallel_tool_calls false: the first call only
    const json& fc = j["output"][0];
    CHECK(fc["type"] == "function_call");
    CHECK(fc["call_id"] == "call_1");
    CHECK(fc["name"] == "f");
    CHECK(fc["arguments"] == R"({"a":1})");
    CHECK(fc["status"] == "completed");
    CHECK(fc["id"].get<std::string>().rfind("fc_", 0) == 0);
    // The stored turn renders the call with its arguments as an object (templates tojson them).
    CHECK(store->get("t", "resp_abc")->turn->messages[1] == ojson::parse(R"({"role": "assistant", "content": null,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]})"));
}

TEST_CASE("Responses events come in the order the SDK reads", "[responses]") {
    ResponsesRequest r =
        parse_ok(R"({"model": "m", "input": "hi", "stream": true, "tools": [{"type": "function", "name": "f"}]})");
    auto store = std::make_shared<ResponseStore>(8, 1 << 20, std::chrono::seconds(60));
    ResponsesAnswer a(r, "resp_abc", 1, store, "t", nullptr);
    std::string sse = a.stream_open();  // one call after another: the answer keeps the stream's state
    sse += a.stream_delta({{"content", "Hel"}});
    sse += a.stream_delta({{"content", "lo"}});
    sse += a.stream_delta({{"tool_calls", json::array({call("call_9", "f", R"({"x":2})")})}});
    sse += a.stream_finish(result("", FinishReason::STOP), "");
    const auto events = steward::test::sse_events(sse);
    std::vector<std::string> types;
    for (size_t i = 0; i < events.size(); i++) {
        types.push_back(events[i].data["type"]);
        CHECK(events[i].name == events[i].data["type"]);  // the event line names the data's type
        CHECK(events[i].data["sequence_number"] == i);
    }
    const std::vector<std::string> want = {"response.created",
                                           "response.in_progress",
                                           "response.output_item.added",
                                           "response.content_part.added",
                                           "response.output_text.delta",
                                           "response.output_text.delta",
                                           "response.output_text.done",
                                           "response.content_part.done",
                                           "response.output_item.done",
                                           "response.output_item.added",
                                           "response.function_call_arguments.delta",
                                           "response.function_call_arguments.done",
                                           "response.output_item.done",
                                           "response.completed"};
    CHECK(types == want);
    CHECK(events[0].data["response"]["status"] == "in_progress");
    CHECK(events[0].data["response"]["output"] == json::array());
    CHECK(events[2].data["item"]["type"] == "message");
    CHECK(events[2].data["output_index"] == 0);
    CHECK(events[3].data["part"]["type"] == "output_text");
    CHECK(events[4].data["delta"] == "Hel");
    CHECK(events[4].data["item_id"] == events[2].data["item"]["id"]);
    CHECK(events[6].data["text"] == "Hello");
    CHECK(events[9].data["item"]["type"] == "function_call");
    CHECK(events[9].data["item"]["arguments"] == "");
    CHECK(events[9].data["output_index"] == 1);
    CHECK(events[10].data["delta"] == R"({"x":2})");
    CHECK(events[11].data["arguments"] == R"({"x":2})");
    const json& done = events.back().data["response"];
    CHECK(done["status"] == "completed");
    REQUIRE(done["output"].size() == 2);
    CHECK(done["output"][0]["content"][0]["text"] == "Hello");
    CHECK(done["output"][1]["call_id"] == "call_9");
    CHECK(done["usage"]["total_tokens"] == 17);
    CHECK(store->get("t", "resp_abc")->response == done);
}

TEST_CASE("a stream cut by max_output_tokens ends response.incomplete", "[responses]") {
    ResponsesRequest r = parse_ok(R"({"model": "m", "input": "hi", "stream": true})");
    ResponsesAnswer a(r, "resp_abc", 1, nullptr, "t", nullptr);
    std::string sse = a.stream_open();
    sse += a.stream_finish(result("", FinishReason::LENGTH), "");
    auto events = steward::test::sse_events(sse);
    REQUIRE(events.size() == 8);  // an empty output is still one (empty) message item
    CHECK(events[2].data["type"] == "response.output_item.added");
    CHECK(events.back().data["type"] == "response.incomplete");
    CHECK(events.back().data["response"]["incomplete_details"]["reason"] == "max_output_tokens");
    ResponsesAnswer b(r, "resp_def", 1, nullptr, "t", nullptr);
    sse = b.stream_open();
    sse += b.stream_error(ApiError{400, "too long", "invalid_request_error", "input", "context_length_exceeded"});
    events = steward::test::sse_events(sse);
    CHECK(events[2].data["type"] == "error");
    CHECK(events[2].data["code"] == "context_length_exceeded");
    CHECK(events[3].data["type"] == "response.failed");
    CHECK(events[3].data["response"]["status"] == "failed");
}

TEST_CASE("the store keeps tenants apart, bounds count and age", "[responses]") {
    ResponseStore s(2, 1 << 20, std::chrono::seconds(60));
    s.put("a", "resp_1", {{"id", "resp_1"}}, nullptr);
    CHECK(s.get("a", "resp_1"));
    CHECK_FALSE(s.get("b", "resp_1"));  // another tenant's id is unknown to it
    s.put("a", "resp_2", {{"id", "resp_2"}}, nullptr);
    CHECK(s.get("a", "resp_1"));  // resp_1 now the most recently used
    s.put("a", "resp_3", {{"id", "resp_3"}}, nullptr);
    CHECK(s.size() == 2);
    CHECK_FALSE(s.get("a", "resp_2"));  // the least recently used went
    CHECK(s.get("a", "resp_1"));
    ResponseStore expired(8, 1 << 20, std::chrono::seconds(0));
    expired.put("a", "resp_1", json::object(), nullptr);
    CHECK_FALSE(expired.get("a", "resp_1"));
    ResponseStore small(8, 64, std::chrono::seconds(60));
    small.put("a", "resp_1", {{"text", std::string(100, 'x')}}, nullptr);
    CHECK(small.size() == 0);  // over the byte bound on its own
    const ApiError e = response_not_found("resp_9", "previous_response_id");
    CHECK(e.status == 404);
    CHECK(e.message == "Previous response with id 'resp_9' not found.");
    CHECK(e.code == "previous_response_not_found");
}
