// Anthropic Messages requests -> template conversations, and the Messages response and stream
// shapes, without a model or a socket.
#include <gtest/gtest.h>

#include "server/anthropic_api.h"
#include "server/api_common.h"

namespace spill::server {
namespace {

MessagesRequest parse(const char* text) { return parse_messages_request(parse_json_body(text)); }

template <class Fn>
void expect_400(Fn&& fn, const std::string& field) {
  try {
    fn();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.message;
    EXPECT_TRUE(e.param == field || e.message.find(field) != std::string::npos) << e.param << ": " << e.message;
    return;
  }
  ADD_FAILURE() << "expected a 400 naming " << field;
}

struct SseEvent {
  std::string event;
  Json data;
};

std::vector<SseEvent> parse_sse(const std::string& text) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event in: " << text.substr(pos);
    if (end == std::string::npos) break;
    const std::string block = text.substr(pos, end - pos);
    pos = end + 2;
    SseEvent ev;
    size_t line_start = 0;
    while (line_start < block.size()) {
      size_t nl = block.find('\n', line_start);
      if (nl == std::string::npos) nl = block.size();
      const std::string line = block.substr(line_start, nl - line_start);
      if (line.rfind("event: ", 0) == 0) ev.event = line.substr(7);
      if (line.rfind("data: ", 0) == 0) ev.data = Json::parse(line.substr(6));
      line_start = nl + 1;
    }
    EXPECT_EQ(ev.event, ev.data.value("type", "")) << "event name and data.type must agree";
    out.push_back(std::move(ev));
  }
  return out;
}

TEST(ServerAnthropic, MinimalRequest) {
  const auto r = parse(R"({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.model, "claude-sonnet-4-5");
  EXPECT_EQ(*r.gen.max_tokens, 64);
  ASSERT_EQ(r.chat.messages.size(), 1u);
  EXPECT_EQ(r.chat.messages[0], Json({{"role", "user"}, {"content", "hi"}}));
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.assistant_prefill.empty());
}

TEST(ServerAnthropic, SystemPromptAsStringOrBlocks) {
  auto r = parse(R"({"max_tokens": 8, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.chat.messages[0], Json({{"role", "system"}, {"content", "be brief"}}));
  r = parse(R"({"max_tokens": 8, "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "b"}], "messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.chat.messages[0]["content"], "a\nb");
}

TEST(ServerAnthropic, SystemMessagesInsideMessages) {
  // Claude Code sends {"role": "system"} inside messages: leading ones join the system prompt,
  // later ones stay in place as system turns.
  auto r = parse(R"({"max_tokens": 8, "system": "base", "messages": [
      {"role": "system", "content": "extra"},
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "hello"},
      {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
      {"role": "user", "content": "go on"}]})");
  ASSERT_EQ(r.chat.messages.size(), 5u);
  EXPECT_EQ(r.chat.messages[0], Json({{"role", "system"}, {"content", "base\n\nextra"}}));
  EXPECT_EQ(r.chat.messages[1]["role"], "user");
  EXPECT_EQ(r.chat.messages[3], Json({{"role", "system"}, {"content", "reminder"}}));
  // Without a system field, the first system message is the system prompt.
  r = parse(R"({"max_tokens": 8, "messages": [{"role": "system", "content": "only"}, {"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.chat.messages[0], Json({{"role", "system"}, {"content", "only"}}));
  expect_400([] { parse(R"({"max_tokens": 8, "messages": [{"role": "robot", "content": "x"}]})"); }, "messages[0].role");
}

TEST(ServerAnthropic, ToolUseAndToolResultBecomeToolCallsAndToolMessages) {
  const auto r = parse(R"({"max_tokens": 100,
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
              {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "use the tool", "signature": "sig"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true},
        {"type": "text", "text": "thanks"}]}]})");
  const Json& m = r.chat.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["content"], "Checking.");
  EXPECT_EQ(m[1]["reasoning_content"], "use the tool");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], Json({{"city", "Paris"}}));
  EXPECT_EQ(m[2], Json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "sunny"}}));
  EXPECT_EQ(m[3]["content"], "Error: boom");
  EXPECT_EQ(m[4], Json({{"role", "user"}, {"content", "thanks"}}));
  // Custom tools become OpenAI-style function tools; server tools are left out.
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0]["type"], "function");
  EXPECT_EQ(r.chat.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.chat.tools[0]["function"]["parameters"]["type"], "object");
}

TEST(ServerAnthropic, ImagesInToolResultsBecomeNotes) {
  const auto r = parse(R"({"max_tokens": 8, "messages": [{"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "shot:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}]})");
  EXPECT_EQ(r.chat.messages[0]["content"], "shot:\n[image omitted: the model reads text only]");
}

TEST(ServerAnthropic, ToolChoiceAndThinking) {
  const char* pre = R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t", "input_schema": {"type": "object"}}], )";
  auto with = [&](const std::string& extra) { return parse((pre + extra + "}").c_str()); };
  EXPECT_EQ(with(R"("tool_choice": {"type": "any"})").chat.tool_choice.mode, ToolChoiceMode::Required);
  EXPECT_EQ(with(R"("tool_choice": {"type": "none"})").chat.tool_choice.mode, ToolChoiceMode::None);
  const auto named = with(R"("tool_choice": {"type": "tool", "name": "t", "disable_parallel_tool_use": true})");
  EXPECT_EQ(named.chat.tool_choice.mode, ToolChoiceMode::Named);
  EXPECT_TRUE(named.single_tool_call);
  expect_400([&] { with(R"("tool_choice": {"type": "tool", "name": "other"})"); }, "tool_choice.name");
  expect_400([&] { with(R"("tool_choice": {"type": "maybe"})"); }, "tool_choice.type");
  EXPECT_EQ(with(R"("thinking": {"type": "disabled"})").chat.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(with(R"("thinking": {"type": "enabled", "budget_tokens": 2048})").chat.template_kwargs["enable_thinking"], true);
}

TEST(ServerAnthropic, FinalAssistantMessageIsAPrefill) {
  const auto r = parse(R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]})");
  EXPECT_EQ(r.assistant_prefill, "The answer is");
  EXPECT_EQ(r.chat.messages.size(), 1u);
}

TEST(ServerAnthropic, Validation) {
  expect_400([] { parse(R"({"messages": [{"role": "user", "content": "x"}]})"); }, "max_tokens");
  expect_400([] { parse(R"({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]})"); }, "max_tokens");
  expect_400([] { parse(R"({"max_tokens": 5, "messages": []})"); }, "messages");
  // "system" inside messages is accepted (SystemMessagesInsideMessages); unknown roles are not.
  expect_400([] { parse(R"({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]})"); }, "messages[0].role");
  expect_400([] { parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5})"); },
             "temperature");
  expect_400([] { parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_k": -1})"); }, "top_k");
  expect_400([] { parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "x"})"); },
             "stop_sequences");
  expect_400(
      [] {
        parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]})");
      },
      "messages[0].content[0].type");
  // count_tokens does not need max_tokens; unknown fields are ignored.
  EXPECT_NO_THROW(parse_count_tokens_request(parse_json_body(
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": {"user_id": "u"}, "service_tier": "auto"})")));
  const auto r = parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["END", ""], "temperature": 0.2, "top_k": 5, "stream": true})");
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"END"}));
  EXPECT_FLOAT_EQ(*r.gen.sampling.temperature, 0.2f);
  EXPECT_EQ(*r.gen.sampling.top_k, 5);
  EXPECT_TRUE(r.stream);
}

TEST(ServerAnthropic, StopReasonsAndUsage) {
  EXPECT_EQ(anthropic_stop_reason("stop", false, 0), "end_turn");
  EXPECT_EQ(anthropic_stop_reason("stop", true, 0), "stop_sequence");
  EXPECT_EQ(anthropic_stop_reason("stop", false, 2), "tool_use");
  EXPECT_EQ(anthropic_stop_reason("length", false, 0), "max_tokens");
  EXPECT_EQ(anthropic_stop_reason("length", false, 1), "tool_use");
  const Json u = anthropic_usage({.prompt_tokens = 100, .completion_tokens = 7, .cached_tokens = 64});
  EXPECT_EQ(u["input_tokens"], 36);
  EXPECT_EQ(u["cache_read_input_tokens"], 64);
  EXPECT_EQ(u["cache_creation_input_tokens"], 0);
  EXPECT_EQ(u["output_tokens"], 7);
}

TEST(ServerAnthropic, NonStreamingContentBlocks) {
  MessageContentBuilder b;
  b.add({OutputPiece{.kind = OutputPiece::Kind::Reasoning, .text = "hm", .call = {}},
         OutputPiece{.kind = OutputPiece::Kind::Reasoning, .text = "m", .call = {}}});
  b.add({OutputPiece{.kind = OutputPiece::Kind::Content, .text = "Hi", .call = {}},
         OutputPiece{.kind = OutputPiece::Kind::ToolCall, .text = "", .call = {"get", R"({"city":"Paris"})"}}});
  ASSERT_EQ(b.content.size(), 3u);
  EXPECT_EQ(b.content[0], Json({{"type", "thinking"}, {"thinking", "hmm"}, {"signature", ""}}));
  EXPECT_EQ(b.content[1], Json({{"type", "text"}, {"text", "Hi"}}));
  EXPECT_EQ(b.content[2]["type"], "tool_use");
  EXPECT_EQ(b.content[2]["input"], Json({{"city", "Paris"}}));
  EXPECT_EQ(b.content[2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  const Json r = messages_response("msg_1", "claude-x", b.content, "tool_use", std::nullopt,
                                   {.prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 0});
  EXPECT_EQ(r["type"], "message");
  EXPECT_EQ(r["role"], "assistant");
  EXPECT_EQ(r["model"], "claude-x");
  EXPECT_EQ(r["stop_reason"], "tool_use");
  EXPECT_TRUE(r["stop_sequence"].is_null());
  EXPECT_EQ(r["usage"]["input_tokens"], 5);
}

TEST(ServerAnthropic, StreamEventSequence) {
  MessagesStreamWriter w("msg_1", "claude-x");
  std::string sse = w.start(12);
  sse += w.add({OutputPiece{.kind = OutputPiece::Kind::Reasoning, .text = "a", .call = {}}});
  sse += w.add({OutputPiece{.kind = OutputPiece::Kind::Reasoning, .text = "b", .call = {}},
                OutputPiece{.kind = OutputPiece::Kind::Content, .text = "Hi", .call = {}}});
  sse += w.add({OutputPiece{.kind = OutputPiece::Kind::ToolCall, .text = "", .call = {"f", R"({"x":1})"}}});
  sse += w.finish("tool_use", std::nullopt, {.prompt_tokens = 12, .completion_tokens = 9, .cached_tokens = 4});
  const auto events = parse_sse(sse);
  std::vector<std::string> names;
  for (const auto& e : events) names.push_back(e.event);
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_stop", "content_block_start",
                                             "content_block_delta", "content_block_stop", "content_block_start",
                                             "content_block_delta", "content_block_stop", "message_delta",
                                             "message_stop"}));
  EXPECT_EQ(events[0].data["message"]["id"], "msg_1");
  EXPECT_TRUE(events[0].data["message"]["content"].empty());
  EXPECT_EQ(events[0].data["message"]["usage"]["input_tokens"], 12);
  EXPECT_EQ(events[2].data["index"], 0);
  EXPECT_EQ(events[2].data["content_block"]["type"], "thinking");
  EXPECT_EQ(events[3].data["delta"], Json({{"type", "thinking_delta"}, {"thinking", "a"}}));
  EXPECT_EQ(events[6].data["index"], 1);
  EXPECT_EQ(events[6].data["content_block"], Json({{"type", "text"}, {"text", ""}}));
  EXPECT_EQ(events[7].data["delta"], Json({{"type", "text_delta"}, {"text", "Hi"}}));
  EXPECT_EQ(events[9].data["index"], 2);
  EXPECT_EQ(events[9].data["content_block"]["type"], "tool_use");
  EXPECT_EQ(events[9].data["content_block"]["name"], "f");
  EXPECT_EQ(events[9].data["content_block"]["input"], Json::object());
  EXPECT_EQ(events[10].data["delta"], Json({{"type", "input_json_delta"}, {"partial_json", R"({"x":1})"}}));
  EXPECT_EQ(events[11].data["index"], 2);
  EXPECT_EQ(events[12].data["delta"]["stop_reason"], "tool_use");
  EXPECT_TRUE(events[12].data["delta"]["stop_sequence"].is_null());
  EXPECT_EQ(events[12].data["usage"]["output_tokens"], 9);
  EXPECT_EQ(events[12].data["usage"]["input_tokens"], 8);
  EXPECT_EQ(events[12].data["usage"]["cache_read_input_tokens"], 4);

  const auto err = parse_sse(MessagesStreamWriter::error({.status = 500, .message = "x", .param = "", .code = ""}));
  ASSERT_EQ(err.size(), 1u);
  EXPECT_EQ(err[0].data["error"]["type"], "api_error");
}

TEST(ServerAnthropic, EmptyStreamStillCloses) {
  MessagesStreamWriter w("msg_2", "m");
  const auto events = parse_sse(w.start(3) + w.finish("max_tokens", std::nullopt, {.prompt_tokens = 3, .completion_tokens = 0, .cached_tokens = 0}));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].event, "message_delta");
  EXPECT_EQ(events[3].event, "message_stop");
}

}  // namespace
}  // namespace spill::server
