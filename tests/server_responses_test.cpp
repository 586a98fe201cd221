// The Responses API without a model or a socket: input items -> the chat conversation the
// templates take, the output items and typed stream events, the response object, the store.
#include <gtest/gtest.h>

#include "server/api_common.h"
#include "server/responses_api.h"

namespace spill::server {
namespace {

ResponsesRequest parse_request(const char* text) { return parse_responses_request(parse_json_body(text)); }

// A 400 whose param is exactly `field`.
template <class Fn>
void expect_400_param(Fn&& fn, const std::string& field) {
  try {
    fn();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.message;
    EXPECT_EQ(e.param, field) << e.message;
    return;
  }
  ADD_FAILURE() << "expected a 400 naming " << field;
}

TEST(ServerResponses, StringInputAndInstructions) {
  const auto r = parse_request(R"({"model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 9})");
  ASSERT_EQ(r.chat.messages.size(), 2u);
  EXPECT_EQ(r.chat.messages[0], Json({{"role", "system"}, {"content", "be brief"}}));
  EXPECT_EQ(r.chat.messages[1], Json({{"role", "user"}, {"content", "hi"}}));
  EXPECT_EQ(*r.gen.max_tokens, 9);
  EXPECT_TRUE(r.store);
  EXPECT_FALSE(r.stream);
}

TEST(ServerResponses, ItemsBecomeChatMessages) {
  const auto r = parse_request(R"({"input": [
      {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
      {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{\"path\": \"x\"}"},
      {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": "not json"},
      {"type": "function_call_output", "call_id": "c1", "output": "file text"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "a.txt"}]}],
    "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}, {"type": "web_search"}]})");
  const Json& m = r.chat.messages;
  ASSERT_EQ(m.size(), 5u) << m.dump();
  EXPECT_EQ(m[0], Json({{"role", "system"}, {"content", "rules"}}));
  EXPECT_EQ(m[1], Json({{"role", "user"}, {"content", "a\nb"}}));
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "Let me look.");
  EXPECT_EQ(m[2]["reasoning_content"], "plan");
  ASSERT_EQ(m[2]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], Json({{"path", "x"}}));
  EXPECT_EQ(m[2]["tool_calls"][1]["function"]["arguments"], "not json");  // passed as it came
  EXPECT_EQ(m[3], Json({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "file text"}}));
  EXPECT_EQ(m[4]["content"], "a.txt");
  // Hosted tools are left out; function tools take the chat shape.
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0]["function"]["name"], "read");
}

TEST(ServerResponses, PreviousConversationGoesAfterTheInstructions) {
  auto r = parse_request(R"({"input": [{"type": "function_call_output", "call_id": "c1", "output": "18C"}],
                     "instructions": "new rules", "previous_response_id": "resp_x"})");
  prepend_conversation(r, Json::parse(R"([{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": {}}}]}])"));
  ASSERT_EQ(r.chat.messages.size(), 4u);
  EXPECT_EQ(r.chat.messages[0]["content"], "new rules");
  EXPECT_EQ(r.chat.messages[1]["content"], "weather?");
  EXPECT_EQ(r.chat.messages[3]["role"], "tool");
}

TEST(ServerResponses, Validation) {
  expect_400_param([] { parse_request(R"({"model": "m"})"); }, "input");
  expect_400_param([] { parse_request(R"({"input": 3})"); }, "input");
  expect_400_param([] { parse_request(R"({"input": [{"role": "robot", "content": "x"}]})"); }, "input[0].role");
  expect_400_param([] { parse_request(R"({"input": [{"type": "function_call", "name": "x"}]})"); }, "input[0].call_id");
  expect_400_param([] { parse_request(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})"); }, "input[0].output");
  expect_400_param([] { parse_request(R"({"input": [{"type": "item_reference", "id": "x"}]})"); }, "input[0].type");
  expect_400_param([] { parse_request(R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})"); }, "input[0].content[0].type");
  expect_400_param([] { parse_request(R"({"input": "x", "tool_choice": "required"})"); }, "tool_choice");
  expect_400_param([] { parse_request(R"({"input": "x", "tools": [{"type": "function", "name": "a"}], "tool_choice": {"type": "function", "name": "b"}})"); }, "tool_choice.name");
  expect_400_param([] { parse_request(R"({"input": "x", "max_output_tokens": 0})"); }, "max_output_tokens");
  expect_400_param([] { parse_request(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})"); }, "text.format.type");
}

struct Event {
  std::string name;
  Json data;
};
std::vector<Event> events_of(const std::string& sse) {
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string block = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = block.find('\n');
    out.push_back({block.substr(7, nl - 7), Json::parse(block.substr(nl + 7))});
  }
  return out;
}

TEST(ServerResponses, OutputItemsAndEvents) {
  ResponseOutputBuilder b("resp_1");
  std::vector<OutputPiece> pieces(4);
  pieces[0] = {.kind = OutputPiece::Kind::Reasoning, .text = "think", .call = {}};
  pieces[1] = {.kind = OutputPiece::Kind::Content, .text = "Hel", .call = {}};
  pieces[2] = {.kind = OutputPiece::Kind::Content, .text = "lo", .call = {}};
  pieces[3] = {.kind = OutputPiece::Kind::ToolCall, .text = "", .call = {.name = "read", .arguments = R"({"path":"a"})"}};
  std::string sse = b.add(pieces);
  sse += b.close();
  const std::vector<Event> ev = events_of(sse);
  std::vector<std::string> names;
  for (size_t i = 0; i < ev.size(); ++i) {
    names.push_back(ev[i].name);
    EXPECT_EQ(ev[i].data["type"], ev[i].name);
    EXPECT_EQ(ev[i].data["sequence_number"], int64_t(i));
  }
  const std::vector<std::string> want = {
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done"};
  EXPECT_EQ(names, want);
  const Json& out = b.output();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["content"][0], Json({{"type", "reasoning_text"}, {"text", "think"}}));
  EXPECT_EQ(out[1]["content"][0]["text"], "Hello");
  EXPECT_EQ(out[1]["status"], "completed");
  EXPECT_EQ(out[2]["type"], "function_call");
  EXPECT_EQ(out[2]["arguments"], R"({"path":"a"})");
  EXPECT_EQ(b.n_tool_calls(), 1);
  // The turn as chat messages, for the store.
  const Json chat = b.as_chat_messages();
  ASSERT_EQ(chat.size(), 1u);
  EXPECT_EQ(chat[0]["content"], "Hello");
  EXPECT_EQ(chat[0]["reasoning_content"], "think");
  EXPECT_EQ(chat[0]["tool_calls"][0]["function"]["arguments"], Json({{"path", "a"}}));
  EXPECT_EQ(chat[0]["tool_calls"][0]["id"], out[2]["call_id"]);
}

TEST(ServerResponses, ResponseObjectAndUsage) {
  const auto r = parse_request(R"({"input": "x", "max_output_tokens": 5, "temperature": 0.5, "metadata": {"k": "v"}})");
  const Json o = response_object("resp_1", 1700000000, "m", r, Json::array(),
                                 ResponseStatus{.status = "incomplete", .incomplete_reason = "max_output_tokens"},
                                 UsageCounts{.prompt_tokens = 10, .completion_tokens = 5, .cached_tokens = 4}, 2);
  EXPECT_EQ(o["object"], "response");
  EXPECT_EQ(o["status"], "incomplete");
  EXPECT_EQ(o["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(o["max_output_tokens"], 5);
  EXPECT_EQ(o["metadata"]["k"], "v");
  EXPECT_EQ(o["usage"]["input_tokens"], 10);
  EXPECT_EQ(o["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(o["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
  EXPECT_EQ(o["usage"]["total_tokens"], 15);
}

TEST(ServerResponses, StoreKeepsTheNewestWithinBounds) {
  ResponseStore store(2, 1 << 20);
  auto entry = [](const char* text) { return ResponseStore::Entry{.response = Json{{"id", text}}, .conversation = Json::array({text}), .bytes = 0}; };
  store.put("a", entry("a"));
  store.put("b", entry("b"));
  store.put("c", entry("c"));
  EXPECT_FALSE(store.get("a"));
  EXPECT_TRUE(store.get("b"));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.erase("b"));
  EXPECT_FALSE(store.erase("b"));
  // The byte bound: an entry larger than the store is not kept; big ones push out old ones.
  ResponseStore small(100, 200);
  small.put("big", ResponseStore::Entry{.response = Json::object(), .conversation = Json::array({std::string(300, 'x')}), .bytes = 0});
  EXPECT_FALSE(small.get("big"));
  small.put("x", ResponseStore::Entry{.response = Json::object(), .conversation = Json::array({std::string(120, 'x')}), .bytes = 0});
  small.put("y", ResponseStore::Entry{.response = Json::object(), .conversation = Json::array({std::string(120, 'y')}), .bytes = 0});
  EXPECT_FALSE(small.get("x"));
  EXPECT_TRUE(small.get("y"));
  // Capacity 0 keeps nothing.
  ResponseStore none(0, 1 << 20);
  none.put("a", entry("a"));
  EXPECT_FALSE(none.get("a"));
}

}  // namespace
}  // namespace spill::server
