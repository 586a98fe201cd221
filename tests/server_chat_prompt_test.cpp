// How the server reads a model's chat template: which output conventions it expects (reasoning,
// Hermes tool calls), forced tool calls, the fallback template, and template errors as 400s.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "server/api_common.h"
#include "server/chat_prompt.h"

namespace spill::server {
namespace {

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(SPILL_TEST_DATA) + "/chat_templates/" + name);
  EXPECT_TRUE(in) << name;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChatInput conversation(const char* body) { return parse_chat_input(parse_json_body(body)); }

// The "tools" member of a request body, as text to splice into one.
const char* kToolsMember = R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";

TEST(ServerChatPrompt, Qwen3ThinksAndUsesHermesToolCalls) {
  const ChatPrompt p = ChatPrompt::from_source(read_template("Qwen-Qwen3-0.6B.jinja"), {{"eos_token", "<|im_end|>"}});
  EXPECT_TRUE(p.thinks());
  EXPECT_TRUE(p.hermes_tools());
  auto chat = conversation((std::string(R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], )") + kToolsMember + "}").c_str());
  RenderedPrompt r = p.render(chat);
  EXPECT_NE(r.text.find("<tools>"), std::string::npos);
  EXPECT_NE(r.text.find("\"name\": \"get_weather\""), std::string::npos);
  EXPECT_TRUE(r.text.ends_with("<|im_start|>assistant\n"));
  EXPECT_TRUE(r.parser.parse_reasoning);
  EXPECT_FALSE(r.parser.starts_in_reasoning);
  EXPECT_TRUE(r.parser.parse_tool_calls);
  EXPECT_TRUE(r.forced_reply.empty());
  EXPECT_TRUE(r.stop_strings.empty());

  chat.tool_choice = {.mode = ToolChoiceMode::None, .name = ""};
  const RenderedPrompt none = p.render(chat);
  EXPECT_FALSE(none.parser.parse_tool_calls);
  EXPECT_EQ(none.text.find("<tools>"), std::string::npos) << "tool_choice none hides the tools";

  chat.tool_choice = {.mode = ToolChoiceMode::Required, .name = ""};
  r = p.render(chat);
  EXPECT_EQ(r.forced_reply, "<tool_call>\n");
  EXPECT_TRUE(r.text.ends_with("<|im_start|>assistant\n<tool_call>\n"));

  chat.tool_choice = {.mode = ToolChoiceMode::Named, .name = "get_weather"};
  r = p.render(chat);
  EXPECT_EQ(r.forced_reply, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  // The parser, fed the forced start and the model's continuation, yields the call.
  OutputParser parser(r.parser);
  std::vector<OutputPiece> pieces = parser.push(r.forced_reply);
  EXPECT_TRUE(pieces.empty());
  for (auto& piece : parser.push("{\"city\": \"Paris\"}}\n</tool_call>")) pieces.push_back(piece);
  for (auto& piece : parser.finish()) pieces.push_back(piece);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].kind, OutputPiece::Kind::ToolCall);
  EXPECT_EQ(pieces[0].call.name, "get_weather");
  EXPECT_EQ(pieces[0].call.arguments, R"({"city":"Paris"})");
}

TEST(ServerChatPrompt, Qwen3EnableThinkingFalseClosesTheThinkBlock) {
  const ChatPrompt p = ChatPrompt::from_source(read_template("Qwen-Qwen3-0.6B.jinja"));
  const auto chat = conversation(R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": false}})");
  const RenderedPrompt r = p.render(chat);
  EXPECT_TRUE(r.text.ends_with("<think>\n\n</think>\n\n"));
  EXPECT_FALSE(r.parser.starts_in_reasoning);
}

TEST(ServerChatPrompt, DeepSeekR1OpensThinkingInThePrompt) {
  const ChatPrompt p = ChatPrompt::from_source(read_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
                                               {{"bos_token", "<｜begin▁of▁sentence｜>"}, {"eos_token", "<｜end▁of▁sentence｜>"}});
  EXPECT_TRUE(p.thinks());
  const RenderedPrompt r = p.render(conversation(R"({"messages": [{"role": "user", "content": "2+2?"}]})"));
  EXPECT_TRUE(r.parser.starts_in_reasoning) << r.text;
  OutputParser parser(r.parser);
  std::string reasoning, content;
  for (const auto& pieces : {parser.push("Easy.\n</think>\n\n4"), parser.finish()})
    for (const OutputPiece& piece : pieces) (piece.kind == OutputPiece::Kind::Reasoning ? reasoning : content) += piece.text;
  EXPECT_EQ(reasoning, "Easy.");
  EXPECT_EQ(content, "4");
}

TEST(ServerChatPrompt, LlamaTemplateNeitherThinksNorForcesHermesCalls) {
  const ChatPrompt p = ChatPrompt::from_source(read_template("meta-llama-Llama-3.3-70B-Instruct.jinja"),
                                               {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}});
  EXPECT_FALSE(p.thinks());
  EXPECT_FALSE(p.hermes_tools());
  auto chat = conversation((std::string(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", )") + kToolsMember + "}").c_str());
  const RenderedPrompt r = p.render(chat);
  EXPECT_TRUE(r.forced_reply.empty());
  EXPECT_FALSE(r.parser.parse_reasoning);
}

TEST(ServerChatPrompt, FallbackIsChatMLWithToolsAndStopsAtImEnd) {
  const ChatPrompt p = ChatPrompt::from_source("");
  EXPECT_TRUE(p.is_fallback());
  EXPECT_TRUE(p.hermes_tools());
  const auto chat = conversation((std::string(R"({"messages": [
      {"role": "system", "content": "S"}, {"role": "user", "content": "U"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], )") + kToolsMember + "}").c_str());
  const RenderedPrompt r = p.render(chat);
  EXPECT_TRUE(r.text.starts_with("<|im_start|>system\nS\n\n# Tools")) << r.text;
  EXPECT_NE(r.text.find("<|im_start|>user\nU<|im_end|>\n"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"),
            std::string::npos)
      << r.text;
  EXPECT_NE(r.text.find("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"), std::string::npos) << r.text;
  EXPECT_TRUE(r.text.ends_with("<|im_start|>assistant\n"));
  EXPECT_EQ(r.stop_strings, (std::vector<std::string>{"<|im_end|>", "<|im_start|>"}));
}

TEST(ServerChatPrompt, AssistantPrefillIsAppended) {
  const ChatPrompt p = ChatPrompt::from_source("");
  const RenderedPrompt r = p.render(conversation(R"({"messages": [{"role": "user", "content": "U"}]})"), "The answer:");
  EXPECT_TRUE(r.text.ends_with("<|im_start|>assistant\nThe answer:"));
}

TEST(ServerChatPrompt, TemplateExceptionsAre400) {
  const ChatPrompt p = ChatPrompt::from_source("{{ raise_exception('roles must alternate') }}");
  try {
    (void)p.render(conversation(R"({"messages": [{"role": "user", "content": "U"}]})"));
    ADD_FAILURE() << "expected an ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(e.message.find("roles must alternate"), std::string::npos) << e.message;
  }
}

}  // namespace
}  // namespace spill::server
