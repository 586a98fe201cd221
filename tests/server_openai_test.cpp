// OpenAI request parsing/validation and response shapes, without a model or a socket.
#include <gtest/gtest.h>

#include <limits>

#include "server/api_common.h"
#include "server/openai_api.h"

namespace spill::server {
namespace {

Json body(const char* text) { return parse_json_body(text); }

// Runs fn, expects an ApiError with this status whose param (or message) names `field`.
template <class Fn>
ApiError expect_error(Fn&& fn, int status, const std::string& field) {
  try {
    fn();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << e.message;
    if (!field.empty()) {
      EXPECT_TRUE(e.param == field || e.message.find(field) != std::string::npos)
          << "param=" << e.param << " message=" << e.message;
    }
    EXPECT_FALSE(e.message.empty());
    return e;
  }
  ADD_FAILURE() << "expected an ApiError naming " << field;
  return {};
}

ChatCompletionRequest chat(const char* text) { return parse_chat_completion_request(body(text)); }

TEST(ServerJson, MalformedBodiesAre400) {
  const ApiError e = expect_error([] { body("{\"messages\": [}"); }, 400, "");
  EXPECT_NE(e.message.find("not valid JSON"), std::string::npos) << e.message;
  expect_error([] { body(""); }, 400, "");
  expect_error([] { body("[1, 2]"); }, 400, "");
  expect_error([] { body("\"text\""); }, 400, "");
  // Invalid UTF-8 inside a string.
  expect_error([] { body("{\"a\": \"\xff\xfe\"}"); }, 400, "");
}

TEST(ServerJson, DeepNestingIsRefusedButBracketsInStringsAreNot) {
  std::string deep(kMaxJsonDepth + 1, '[');
  deep += std::string(kMaxJsonDepth + 1, ']');
  expect_error([&] { body(("{\"x\": " + deep + "}").c_str()); }, 400, "");
  std::string shallow = "{\"s\": \"" + std::string(1000, '[') + "\\\"{{{\"}";
  EXPECT_NO_THROW(body(shallow.c_str()));
}

TEST(ServerOpenAI, MinimalChatRequest) {
  const auto r = chat(R"({"model": "x", "messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.model, "x");
  ASSERT_EQ(r.chat.messages.size(), 1u);
  EXPECT_EQ(r.chat.messages[0]["role"], "user");
  EXPECT_EQ(r.chat.messages[0]["content"], "hi");
  EXPECT_FALSE(r.gen.max_tokens.has_value());
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.gen.n, 1);
  EXPECT_TRUE(r.chat.tools.is_null());
  EXPECT_TRUE(r.chat.add_generation_prompt);
}

TEST(ServerOpenAI, UnknownFieldsAreIgnored) {
  EXPECT_NO_THROW(chat(R"({"messages": [{"role": "user", "content": "hi", "x_extra": 1}],
                           "user": "u1", "metadata": {"a": "b"}, "store": false, "some_future_field": [1]})"));
}

TEST(ServerOpenAI, ContentPartsAreJoinedAndNonTextIsRefused) {
  const auto r = chat(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})");
  EXPECT_EQ(r.chat.messages[0]["content"], "a\nb");
  const ApiError e = expect_error(
      [] {
        chat(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
               {"type": "image_url", "image_url": {"url": "data:..."}}]}]})");
      },
      400, "messages[0].content[1].type");
  EXPECT_NE(e.message.find("text only"), std::string::npos);
}

TEST(ServerOpenAI, RolesAndMessageFields) {
  const auto r = chat(R"({"messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Paris\"}"}},
         {"id": "call_2", "type": "function", "function": {"name": "get", "arguments": "not json"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})");
  const Json& m = r.chat.messages;
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[2]["content"], "");
  // JSON arguments become an object (what templates expect); others stay text.
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], Json({{"city", "Paris"}}));
  EXPECT_EQ(m[2]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(m[3]["tool_call_id"], "call_1");
  expect_error([] { chat(R"({"messages": [{"role": "wizard", "content": "x"}]})"); }, 400, "messages[0].role");
  expect_error([] { chat(R"({"messages": [{"role": "user"}]})"); }, 400, "messages[0].content");
  expect_error([] { chat(R"({"messages": []})"); }, 400, "messages");
  expect_error([] { chat(R"({"messages": "hi"})"); }, 400, "messages");
  expect_error([] { chat(R"({"model": "m"})"); }, 400, "messages");
  expect_error([] { chat(R"({"messages": [{"role": "user", "content": 5}]})"); }, 400, "messages[0].content");
}

TEST(ServerOpenAI, SamplingFieldsAndRanges) {
  const auto r = chat(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 0, "top_p": 0.9,
      "top_k": 40, "min_p": 0.05, "seed": 18446744073709551615, "presence_penalty": 0.5, "frequency_penalty": -0.5,
      "repetition_penalty": 1.1, "max_tokens": 10, "max_completion_tokens": 20, "ignore_eos": true,
      "stop": ["a", "", "b"], "n": 3, "logprobs": true, "top_logprobs": 5,
      "stream": true, "stream_options": {"include_usage": true}})");
  EXPECT_EQ(*r.gen.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(*r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(*r.gen.sampling.top_k, 40);
  EXPECT_EQ(*r.gen.sampling.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*r.gen.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_TRUE(r.gen.ignore_eos);
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.gen.n, 3);
  EXPECT_TRUE(r.gen.logprobs);
  EXPECT_EQ(r.gen.top_logprobs, 5);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);

  const char* base = R"({"messages": [{"role": "user", "content": "x"}], )";
  auto with = [&](const std::string& field) { return chat((std::string(base) + field + "}").c_str()); };
  expect_error([&] { with(R"("temperature": 2.5)"); }, 400, "temperature");
  expect_error([&] { with(R"("temperature": -1)"); }, 400, "temperature");
  expect_error([&] { with(R"("temperature": "hot")"); }, 400, "temperature");
  expect_error([&] { with(R"("top_p": 1.5)"); }, 400, "top_p");
  expect_error([&] { with(R"("top_k": -2)"); }, 400, "top_k");
  expect_error([&] { with(R"("top_k": 1.5)"); }, 400, "top_k");
  expect_error([&] { with(R"("max_tokens": 0)"); }, 400, "max_tokens");
  expect_error([&] { with(R"("max_tokens": "10")"); }, 400, "max_tokens");
  expect_error([&] { with(R"("max_completion_tokens": -5)"); }, 400, "max_completion_tokens");
  expect_error([&] { with(R"("presence_penalty": 3)"); }, 400, "presence_penalty");
  expect_error([&] { with(R"("repetition_penalty": 0)"); }, 400, "repetition_penalty");
  expect_error([&] { with(R"("stop": 5)"); }, 400, "stop");
  expect_error([&] { with(R"("stop": ["a", 1])"); }, 400, "stop");
  expect_error([&] { with(R"("n": 0)"); }, 400, "n");
  expect_error([&] { with(R"("n": 1000)"); }, 400, "n");
  expect_error([&] { with(R"("top_logprobs": 3)"); }, 400, "top_logprobs");
  expect_error([&] { with(R"("logprobs": true, "top_logprobs": 21)"); }, 400, "top_logprobs");
  expect_error([&] { with(R"("stream": "yes")"); }, 400, "stream");
  expect_error([&] { with(R"("logit_bias": {"50256": -100})"); }, 400, "logit_bias");
  expect_error([&] { with(R"("response_format": {"type": "json_schema", "json_schema": {}})"); }, 400, "response_format");
  expect_error([&] { with(R"("functions": [])"); }, 400, "functions");
  // Explicit nulls mean "not given", as the SDKs send them.
  EXPECT_NO_THROW(with(R"("temperature": null, "max_tokens": null, "stop": null, "response_format": {"type": "text"})"));
  // An integral float is an integer.
  EXPECT_EQ(*with(R"("max_tokens": 16.0)").gen.max_tokens, 16);
  // top_p 0 means "only the top token" (the sampler needs > 0).
  EXPECT_GT(*with(R"("top_p": 0)").gen.sampling.top_p, 0.0f);
}

TEST(ServerOpenAI, ToolsAndToolChoice) {
  const char* tools = R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  auto with = [&](const std::string& extra) {
    return chat((std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + tools + extra + "}").c_str());
  };
  const auto r = with("");
  ASSERT_TRUE(r.chat.tools.is_array());
  // Key order is kept: templates print tools with tojson.
  EXPECT_EQ(r.chat.tools[0]["function"].begin().key(), "name");
  EXPECT_EQ(r.chat.tool_choice.mode, ToolChoiceMode::Auto);
  EXPECT_EQ(with(R"(, "tool_choice": "none")").chat.tool_choice.mode, ToolChoiceMode::None);
  EXPECT_EQ(with(R"(, "tool_choice": "required")").chat.tool_choice.mode, ToolChoiceMode::Required);
  const auto named = with(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  EXPECT_EQ(named.chat.tool_choice.mode, ToolChoiceMode::Named);
  EXPECT_EQ(named.chat.tool_choice.name, "get_weather");
  expect_error([&] { with(R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})"); }, 400, "tool_choice");
  expect_error([&] { with(R"(, "tool_choice": "sometimes")"); }, 400, "tool_choice");
  expect_error([] { chat(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})"); }, 400,
               "tool_choice");
  expect_error([] { chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})"); }, 400,
               "tools[0].function");
  expect_error([] { chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}})"); }, 400, "tools");
  EXPECT_TRUE(chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": []})").chat.tools.is_null());
}

TEST(ServerOpenAI, ChatTemplateKwargs) {
  const auto r = chat(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(r.chat.template_kwargs["enable_thinking"], false);
  expect_error([] { chat(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 1})"); }, 400,
               "chat_template_kwargs");
}

TEST(ServerOpenAI, CompletionPrompts) {
  auto r = parse_completion_request(body(R"({"prompt": "def f():", "max_tokens": 5, "echo": true, "logprobs": 2})"));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "def f():");
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_TRUE(r.echo);
  EXPECT_TRUE(r.gen.logprobs);
  EXPECT_EQ(r.gen.top_logprobs, 2);
  r = parse_completion_request(body(R"({"prompt": [1, 2, 3]})"));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  r = parse_completion_request(body(R"({"prompt": ["a", "b"], "n": 2})"));
  EXPECT_EQ(r.prompts.size(), 2u);
  r = parse_completion_request(body(R"({"prompt": [[1], [2, 3]]})"));
  EXPECT_EQ(r.prompts[1].tokens, (std::vector<int32_t>{2, 3}));
  expect_error([] { parse_completion_request(body(R"({"max_tokens": 5})")); }, 400, "prompt");
  expect_error([] { parse_completion_request(body(R"({"prompt": [1, -2]})")); }, 400, "prompt");
  expect_error([] { parse_completion_request(body(R"({"prompt": 7})")); }, 400, "prompt");
  expect_error([] { parse_completion_request(body(R"({"prompt": []})")); }, 400, "prompt");
  expect_error([] { parse_completion_request(body(R"({"prompt": "x", "suffix": "y"})")); }, 400, "suffix");
  expect_error([] { parse_completion_request(body(R"({"prompt": "x", "best_of": 3})")); }, 400, "best_of");
  expect_error([] { parse_completion_request(body(R"({"prompt": "x", "logprobs": 50})")); }, 400, "logprobs");
  expect_error([] { parse_completion_request(body(R"({"prompt": ["a", "b", "c"], "n": 100})")); }, 400, "n");
}

TEST(ServerOpenAI, GenerationDefaultsAndResolution) {
  auto d = GenerationDefaults::from_json(nlohmann::json::parse(R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95})"));
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.6f);
  EXPECT_EQ(d.sampling.top_k, 20);
  GenerationOptions g;
  g.sampling.temperature = 0.0f;
  g.logprobs = true;
  g.top_logprobs = 2;
  SamplingParams p = resolve_sampling(g, d);
  EXPECT_TRUE(p.greedy());
  EXPECT_EQ(p.top_k, 20);  // not given: the model's default stays
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.top_logprobs, 2);
  // Without do_sample transformers is greedy.
  d = GenerationDefaults::from_json(nlohmann::json::parse(R"({"temperature": 0.6, "eos_token_id": 2})"));
  EXPECT_TRUE(d.sampling.greedy());
  // Nonsense in the file is ignored rather than breaking every request.
  d = GenerationDefaults::from_json(nlohmann::json::parse(R"({"do_sample": true, "top_p": 7})"));
  EXPECT_FLOAT_EQ(d.sampling.top_p, 1.0f);
}

ResponseMeta meta() { return {.id = "chatcmpl-1", .created = 1700000000, .model = "spill-tiny"}; }

TEST(ServerOpenAI, ChatCompletionResponseShape) {
  ChatChoiceResult c;
  c.content = "Hello";
  c.reasoning = "think";
  c.finish_reason = "stop";
  const Json r = chat_completion_response(meta(), {c}, {.prompt_tokens = 10, .completion_tokens = 3, .cached_tokens = 8});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"], "chatcmpl-1");
  EXPECT_EQ(r["model"], "spill-tiny");
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "think");
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  EXPECT_EQ(r["usage"]["total_tokens"], 13);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
}

TEST(ServerOpenAI, ToolCallResponseHasNullContent) {
  ChatChoiceResult c;
  append_pieces(c, {OutputPiece{.kind = OutputPiece::Kind::ToolCall, .text = "", .call = {"get", R"({"a":1})"}}}, true);
  c.finish_reason = chat_finish_reason("stop", int(c.tool_calls.size()));
  const Json r = chat_completion_response(meta(), {c}, {});
  const Json& m = r["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null());
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"a":1})");
  EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(chat_finish_reason("length", 1), "tool_calls");
  EXPECT_EQ(chat_finish_reason("length", 0), "length");
  EXPECT_EQ(chat_finish_reason("stop", 0), "stop");
}

TEST(ServerOpenAI, ParallelToolCallsFalseKeepsTheFirst) {
  ChatChoiceResult c;
  const OutputPiece call{.kind = OutputPiece::Kind::ToolCall, .text = "", .call = {"a", "{}"}};
  append_pieces(c, {call, call}, /*parallel_tool_calls=*/false);
  EXPECT_EQ(c.tool_calls.size(), 1u);
}

TEST(ServerOpenAI, ChunksAndDeltas) {
  ChatDeltaBuilder b;
  std::vector<Json> d = b.deltas({OutputPiece{.kind = OutputPiece::Kind::Reasoning, .text = "hm", .call = {}},
                                  OutputPiece{.kind = OutputPiece::Kind::Content, .text = "Hi", .call = {}}});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0]["role"], "assistant");  // the first delta carries the role
  EXPECT_EQ(d[0]["reasoning_content"], "hm");
  EXPECT_FALSE(d[1].contains("role"));
  EXPECT_EQ(d[1]["content"], "Hi");
  d = b.deltas({OutputPiece{.kind = OutputPiece::Kind::ToolCall, .text = "", .call = {"f", R"({"x":1})"}},
                OutputPiece{.kind = OutputPiece::Kind::ToolCall, .text = "", .call = {"g", "{}"}}});
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(d[0]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(d[0]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(d[0]["tool_calls"][0]["function"]["arguments"], "");
  EXPECT_TRUE(d[0]["tool_calls"][0].contains("id"));
  EXPECT_EQ(d[1]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(d[1]["tool_calls"][0]["function"]["arguments"], R"({"x":1})");
  EXPECT_FALSE(d[1]["tool_calls"][0].contains("id"));
  EXPECT_EQ(d[2]["tool_calls"][0]["index"], 1);
  EXPECT_EQ(b.n_tool_calls(), 2);
  EXPECT_FALSE(b.role_delta_if_unsent().has_value());
  ChatDeltaBuilder empty;
  EXPECT_EQ(*empty.role_delta_if_unsent(), Json({{"role", "assistant"}, {"content", ""}}));

  Json chunk = chat_chunk(meta(), 0, Json{{"content", "x"}}, std::nullopt, nullptr, /*usage_field=*/true);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk.contains("usage"));
  EXPECT_TRUE(chunk["usage"].is_null());
  chunk = chat_chunk(meta(), 1, Json::object(), "length", nullptr, false);
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_FALSE(chunk.contains("usage"));
  const Json u = usage_chunk(meta(), "chat.completion.chunk", {.prompt_tokens = 4, .completion_tokens = 2, .cached_tokens = 0});
  EXPECT_TRUE(u["choices"].is_array());
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 6);
  const Json c = completion_chunk(meta(), 0, "abc", std::nullopt, nullptr, false);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
  EXPECT_EQ(sse_data(Json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

TEST(ServerOpenAI, CompletionResponseShape) {
  const Json r = completion_response({.id = "cmpl-1", .created = 1, .model = "m"},
                                     {CompletionChoiceResult{.index = 0, .text = "x", .finish_reason = "length", .logprobs = nullptr}},
                                     {.prompt_tokens = 2, .completion_tokens = 1, .cached_tokens = 0});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "x");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST(ServerOpenAI, ErrorShapes) {
  const ApiError e{.status = 400, .message = "too long", .param = "messages", .code = "context_length_exceeded"};
  const Json o = openai_error_body(e);
  EXPECT_EQ(o["error"]["message"], "too long");
  EXPECT_EQ(o["error"]["type"], "invalid_request_error");
  EXPECT_EQ(o["error"]["param"], "messages");
  EXPECT_EQ(o["error"]["code"], "context_length_exceeded");
  const Json n = openai_error_body({.status = 401, .message = "no key", .param = "", .code = ""});
  EXPECT_TRUE(n["error"]["param"].is_null());
  EXPECT_TRUE(n["error"]["code"].is_null());
  EXPECT_EQ(n["error"]["type"], "authentication_error");
  const Json a = anthropic_error_body({.status = 503, .message = "busy", .param = "", .code = ""});
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "overloaded_error");
  EXPECT_EQ(a["error"]["message"], "busy");
}

TEST(ServerOpenAI, DumpReplacesInvalidUtf8) {
  EXPECT_EQ(dump_json(Json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

TEST(ServerOpenAI, RandomIds) {
  const std::string a = random_id("chatcmpl-"), b = random_id("chatcmpl-");
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace spill::server
