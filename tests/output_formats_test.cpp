// Each model family's tool-call and reasoning format, read back from what the family's own chat
// template writes. What a template renders for an assistant turn with tool calls (and reasoning,
// where the template renders it) is what the model was trained to emit, so: render a conversation
// through ChatPrompt (the server's path: an OpenAI request body, parse_chat_input, the history
// adapted to the template's fields, the real template from tests/data/chat_templates), cut out
// the assistant turn, feed it to the parser the prompt chose, cut at every byte boundary and byte
// by byte, and check that the same tool calls, reasoning and content come back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "server/api_common.h"
#include "server/chat_prompt.h"
#include "server/output_parser.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace spill::server {
namespace {

namespace fs = std::filesystem;
const fs::path kTemplateDir = fs::path(SPILL_TEST_DATA) / "chat_templates";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The special tokens the fixture maker passed to each template (cases.json, and the GLM fixture).
Json special_tokens(const std::string& name) {
  for (const char* file : {"cases.json", "cases-zai-org-GLM-4.6-jinja2.json"}) {
    const Json fixture = Json::parse(read_file(kTemplateDir / file));
    if (fixture["templates"].contains(name)) return fixture["templates"][name]["special_tokens"];
  }
  ADD_FAILURE() << "no special tokens for " << name;
  return Json::object();
}

ChatPrompt family_prompt(const std::string& name) {
  return ChatPrompt::from_source(read_file(kTemplateDir / (name + ".jinja")), special_tokens(name));
}

// The tools of the chat template fixtures: search's "query" is a string, "max_results" an integer.
const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "search", "description": "Search the web.",
   "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"},
                  "filters": {"type": "array", "items": {"type": "string"}}}, "required": ["query"]}}}])");

const Json kUser = Json{{"role", "user"}, {"content", "What's the weather in Paris, and search for 42?"}};
const Json kWeatherArgs = Json::parse(R"({"city": "Paris", "unit": "celsius"})");
// "42" is a string that reads as JSON: only the schema keeps it a string in GLM's format.
const Json kSearchArgs = Json::parse(R"({"query": "42", "max_results": 3, "filters": ["news", "é \"q\""]})");
const std::string kReasoning = "The user wants the weather in Paris.\nThen a search.";

// An assistant turn as a client sends it back (OpenAI shape: arguments as JSON text).
Json assistant_turn(const std::string& content, const std::string& reasoning, bool two_calls = true) {
  Json calls = Json::array();
  calls.push_back({{"id", "call_1"}, {"type", "function"},
                   {"function", {{"name", "get_weather"}, {"arguments", kWeatherArgs.dump()}}}});
  if (two_calls)
    calls.push_back({{"id", "call_2"}, {"type", "function"},
                     {"function", {{"name", "search"}, {"arguments", kSearchArgs.dump()}}}});
  Json m = {{"role", "assistant"}, {"content", content.empty() ? Json(nullptr) : Json(content)}, {"tool_calls", calls}};
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  return m;
}

ChatInput chat(const Json& messages, bool add_generation_prompt, const Json& kwargs = Json::object()) {
  Json body = {{"messages", messages}, {"tools", kTools}, {"add_generation_prompt", add_generation_prompt}};
  if (!kwargs.empty()) body["chat_template_kwargs"] = kwargs;
  return parse_chat_input(body);
}

// The prompt for kUser, and the text the template writes for `assistant` after it: after the
// generation prompt where the history's rendering continues it, else after the conversation
// before the turn (`turn_opener`, the template's own assistant header, is removed then).
struct Turn {
  RenderedPrompt prompt;
  std::string text;
};

Turn render_turn(const ChatPrompt& p, const Json& assistant, const std::string& turn_opener = "",
                 const Json& kwargs = Json::object()) {
  Turn t;
  t.prompt = p.render(chat(Json::array({kUser}), true, kwargs));
  const std::string full = p.render(chat(Json::array({kUser, assistant}), false, kwargs)).text;
  if (turn_opener.empty()) {
    EXPECT_TRUE(full.starts_with(t.prompt.text)) << "the history does not continue the generation prompt:\n" << full;
    t.text = full.substr(std::min(full.size(), t.prompt.text.size()));
  } else {
    const std::string before = p.render(chat(Json::array({kUser}), false, kwargs)).text;
    EXPECT_TRUE(full.starts_with(before + turn_opener)) << full;
    t.text = full.substr(std::min(full.size(), before.size() + turn_opener.size()));
  }
  return t;
}

// Removes the end-of-turn marker the template writes after the turn: the model's EOS, which the
// engine stops at and never puts in the text.
std::string without_suffix(std::string text, std::string_view suffix) {
  EXPECT_TRUE(text.ends_with(suffix)) << "expected the turn to end with " << suffix << ":\n" << text;
  if (text.ends_with(suffix)) text.resize(text.size() - suffix.size());
  return text;
}

struct Expected {
  std::string reasoning;
  std::string content;
  std::vector<std::pair<std::string, Json>> calls;
};

struct Got {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
};

Got parse_pieces(const OutputParserOptions& options, const std::vector<std::string_view>& chunks) {
  OutputParser parser(options);
  Got got;
  auto take = [&](const std::vector<OutputPiece>& pieces) {
    for (const OutputPiece& p : pieces) {
      if (p.kind == OutputPiece::Kind::Reasoning) got.reasoning += p.text;
      if (p.kind == OutputPiece::Kind::Content) got.content += p.text;
      if (p.kind == OutputPiece::Kind::ToolCall) got.calls.push_back(p.call);
    }
  };
  for (std::string_view c : chunks) take(parser.push(c));
  take(parser.finish());
  return got;
}

// Whole, split in two at every byte, and byte by byte: all must read back `expected`.
void expect_reads_back(const OutputParserOptions& options, const std::string& text, const Expected& expected) {
  std::vector<std::vector<std::string_view>> chunkings;
  const std::string_view all(text);
  for (size_t cut = 0; cut <= text.size(); ++cut) chunkings.push_back({all.substr(0, cut), all.substr(cut)});
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(all.substr(i, 1));
  chunkings.push_back(bytes);
  int failures = 0;
  for (size_t k = 0; k < chunkings.size() && failures < 3; ++k) {
    SCOPED_TRACE(k + 1 == chunkings.size() ? std::string("byte by byte") : "cut at byte " + std::to_string(k));
    const Got got = parse_pieces(options, chunkings[k]);
    bool ok = got.reasoning == expected.reasoning && got.content == expected.content &&
              got.calls.size() == expected.calls.size();
    EXPECT_EQ(got.reasoning, expected.reasoning);
    EXPECT_EQ(got.content, expected.content);
    EXPECT_EQ(got.calls.size(), expected.calls.size()) << "in:\n" << text;
    for (size_t i = 0; i < std::min(got.calls.size(), expected.calls.size()); ++i) {
      EXPECT_EQ(got.calls[i].name, expected.calls[i].first);
      // Compared as JSON objects (key order is not part of a call).
      const nlohmann::json args = nlohmann::json::parse(got.calls[i].arguments);
      EXPECT_EQ(args, nlohmann::json::parse(expected.calls[i].second.dump())) << got.calls[i].arguments;
      ok = ok && got.calls[i].name == expected.calls[i].first && args == nlohmann::json::parse(expected.calls[i].second.dump());
    }
    if (!ok) ++failures;
  }
}

const Expected kBothCalls{.reasoning = "", .content = "", .calls = {{"get_weather", kWeatherArgs}, {"search", kSearchArgs}}};

Expected with(std::string reasoning, std::string content, Expected e = kBothCalls) {
  e.reasoning = std::move(reasoning);
  e.content = std::move(content);
  return e;
}

// ---- which format each template teaches ----------------------------------------------------

TEST(OutputFormats, EachTemplateChoosesItsFamilysFormat) {
  const std::pair<const char*, ToolCallFormat> families[] = {
      {"Qwen-Qwen3-0.6B", ToolCallFormat::Hermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ToolCallFormat::Hermes},
      {"deepseek-ai-DeepSeek-V3.1", ToolCallFormat::DeepSeekV31},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", ToolCallFormat::DeepSeekV3},
      {"moonshotai-Kimi-K2", ToolCallFormat::KimiK2},
      {"zai-org-GLM-4.6", ToolCallFormat::Glm45},
      {"openai-gpt-oss-120b", ToolCallFormat::Harmony},
      {"spill-tiny", ToolCallFormat::Hermes},
  };
  for (const auto& [name, format] : families) {
    SCOPED_TRACE(name);
    const ChatPrompt p = family_prompt(name);
    EXPECT_EQ(p.tool_call_format(), format) << tool_call_format_name(p.tool_call_format());
    EXPECT_EQ(p.render(chat(Json::array({kUser}), true)).parser.format, format);
  }
  EXPECT_TRUE(family_prompt("zai-org-GLM-4.6").thinks());
  EXPECT_TRUE(family_prompt("openai-gpt-oss-120b").thinks());
  EXPECT_FALSE(family_prompt("moonshotai-Kimi-K2").thinks());
  EXPECT_FALSE(family_prompt("moonshotai-Kimi-K2").hermes_tools());
  EXPECT_FALSE(family_prompt("zai-org-GLM-4.6").hermes_tools()) << "GLM's <tool_call> holds no JSON";
}

// ---- each family's turn, read back ------------------------------------------------------------

TEST(OutputFormats, Qwen3ReasoningContentAndCalls) {
  const ChatPrompt p = family_prompt("Qwen-Qwen3-0.6B");
  const Turn t = render_turn(p, assistant_turn("Let me check.", kReasoning));
  const std::string text = without_suffix(t.text, "<|im_end|>\n");
  EXPECT_NE(text.find("<think>"), std::string::npos) << text;
  expect_reads_back(t.prompt.parser, text, with(kReasoning, "Let me check."));
}

TEST(OutputFormats, Hermes3Calls) {
  const ChatPrompt p = family_prompt("NousResearch-Hermes-3-Llama-3.1-8B-tool_use");
  // Hermes-3's template leaves an assistant turn's content out when it has tool calls.
  const Turn t = render_turn(p, assistant_turn("Let me check.", ""));
  expect_reads_back(t.prompt.parser, without_suffix(t.text, "<|im_end|>\n"), with("", ""));
}

TEST(OutputFormats, DeepSeekV31Calls) {
  const ChatPrompt p = family_prompt("deepseek-ai-DeepSeek-V3.1");
  const Turn t = render_turn(p, assistant_turn("Let me check.", ""));
  EXPECT_TRUE(t.prompt.text.ends_with("<｜Assistant｜></think>"));
  EXPECT_FALSE(t.prompt.parser.starts_in_reasoning);
  const std::string text = without_suffix(t.text, "<｜end▁of▁sentence｜>");
  EXPECT_NE(text.find("<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"), std::string::npos) << text;
  expect_reads_back(t.prompt.parser, text, with("", "Let me check."));
}

TEST(OutputFormats, DeepSeekV31ThinkingStartsInsideReasoning) {
  // thinking=true: the prompt opens <think>; the model reasons, closes it, then answers. The
  // template writes the turn's answer after "</think>" (and drops the reasoning from history).
  const ChatPrompt p = family_prompt("deepseek-ai-DeepSeek-V3.1");
  const Json kwargs = {{"thinking", true}};
  const Turn t = render_turn(p, assistant_turn("Let me check.", ""), "<｜Assistant｜>", kwargs);
  EXPECT_TRUE(t.prompt.text.ends_with("<think>"));
  EXPECT_TRUE(t.prompt.parser.starts_in_reasoning);
  ASSERT_TRUE(t.text.starts_with("</think>")) << t.text;
  const std::string text = kReasoning + without_suffix(t.text, "<｜end▁of▁sentence｜>");
  expect_reads_back(t.prompt.parser, text, with(kReasoning, "Let me check."));
}

TEST(OutputFormats, DeepSeekR1ReasoningThenFencedCalls) {
  // R1's template ends the prompt with "<think>\n" and renders a call turn (content none) from its
  // own "<｜Assistant｜>" without the reasoning; the model's output is the reasoning, "\n</think>\n\n"
  // (R1's documented layout), then that turn.
  const ChatPrompt p = family_prompt("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B");
  const Turn t = render_turn(p, assistant_turn("", ""), "<｜Assistant｜>");
  EXPECT_TRUE(t.prompt.parser.starts_in_reasoning);
  EXPECT_NE(t.text.find("<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"), std::string::npos) << t.text;
  const std::string text = kReasoning + "\n</think>\n\n" + without_suffix(t.text, "<｜end▁of▁sentence｜>");
  expect_reads_back(t.prompt.parser, text, with(kReasoning, ""));
}

TEST(OutputFormats, KimiK2Calls) {
  const ChatPrompt p = family_prompt("moonshotai-Kimi-K2");
  const Turn t = render_turn(p, assistant_turn("Let me check.", ""));
  const std::string text = without_suffix(t.text, "<|im_end|>");
  // The arguments go in as an object, so the template writes them as JSON, not as a quoted string.
  EXPECT_NE(text.find("<|tool_call_argument_begin|>{\"city\": \"Paris\""), std::string::npos) << text;
  EXPECT_NE(text.find("functions.search:1<|tool_call_argument_begin|>"), std::string::npos) << text;
  expect_reads_back(t.prompt.parser, text, with("", "Let me check."));
}

TEST(OutputFormats, Glm46ReasoningContentAndKeyValueCalls) {
  const ChatPrompt p = family_prompt("zai-org-GLM-4.6");
  const Turn t = render_turn(p, assistant_turn("Let me check.", kReasoning));
  // The template writes strings bare and everything else as JSON.
  EXPECT_NE(t.text.find("<arg_key>query</arg_key>\n<arg_value>42</arg_value>"), std::string::npos) << t.text;
  EXPECT_NE(t.text.find("<arg_key>max_results</arg_key>\n<arg_value>3</arg_value>"), std::string::npos) << t.text;
  expect_reads_back(t.prompt.parser, t.text, with(kReasoning, "Let me check."));
}

// gpt-oss: the turn with its analysis and one message per call.
TEST(OutputFormats, GptOssAnalysisAndOneMessagePerCall) {
  const ChatPrompt p = family_prompt("openai-gpt-oss-120b");
  Turn t;
  t.prompt = p.render(chat(Json::array({kUser}), true));
  // This copy of the template ends the generation prompt inside the final channel; the history
  // writes the turn as new messages, read from after the conversation before it.
  EXPECT_EQ(t.prompt.parser.harmony_prompt_tail, "assistant<|channel|>final<|message|>");
  const std::string before = p.render(chat(Json::array({kUser}), false)).text;
  const std::string full = p.render(chat(Json::array({kUser, assistant_turn("", kReasoning)}), false)).text;
  ASSERT_TRUE(full.starts_with(before));
  const std::string turn = full.substr(before.size());
  EXPECT_NE(turn.find("<|start|>assistant to=functions.search<|channel|>commentary json<|message|>"), std::string::npos)
      << "the second call has its own message:\n" << turn;
  OutputParserOptions between = t.prompt.parser;
  between.harmony_prompt_tail.clear();
  const Expected expected = with(kReasoning, "");
  expect_reads_back(between, turn, expected);
  // <|call|> ends generation (an EOS id): the text usually stops before it.
  expect_reads_back(between, without_suffix(turn, "<|call|>"), expected);
  // After the generation prompt "<|start|>assistant" (transformers' gpt-oss template), the reply
  // continues that header.
  OutputParserOptions after_start = t.prompt.parser;
  after_start.harmony_prompt_tail = "assistant";
  ASSERT_TRUE(turn.starts_with("<|start|>assistant"));
  expect_reads_back(after_start, turn.substr(std::string_view("<|start|>assistant").size()), expected);
}

TEST(OutputFormats, GptOssFinalAnswerAfterAnalysis) {
  const ChatPrompt p = family_prompt("openai-gpt-oss-120b");
  const Json answer = {{"role", "assistant"}, {"content", "It is 18 °C and cloudy."}, {"reasoning_content", kReasoning}};
  const std::string before = p.render(chat(Json::array({kUser}), false)).text;
  // The last turn of a conversation rendered without a generation prompt keeps its analysis.
  const std::string full = p.render(chat(Json::array({kUser, answer}), false)).text;
  ASSERT_TRUE(full.starts_with(before));
  const std::string turn = without_suffix(full.substr(before.size()), "<|return|>");
  EXPECT_NE(turn.find("<|channel|>analysis<|message|>" + kReasoning + "<|end|>"), std::string::npos)
      << "reasoning_content goes in as gpt-oss's `thinking`:\n" << turn;
  OutputParserOptions options = p.render(chat(Json::array({kUser}), true)).parser;
  options.harmony_prompt_tail.clear();
  expect_reads_back(options, turn, Expected{.reasoning = kReasoning, .content = "It is 18 °C and cloudy.", .calls = {}});
  // The stored template's own generation prompt opens the final channel: the reply is the answer.
  expect_reads_back(p.render(chat(Json::array({kUser}), true)).parser, "It is 18 °C and cloudy.",
                    Expected{.reasoning = "", .content = "It is 18 °C and cloudy.", .calls = {}});
}

TEST(OutputFormats, GptOssChannelFirstLayout) {
  // The layout of the harmony format's documentation (the recipient after the channel, a
  // <|constrain|> type), which gpt-oss emits as often as the template's recipient-first one.
  OutputParserOptions options = family_prompt("openai-gpt-oss-120b").render(chat(Json::array({kUser}), true)).parser;
  options.harmony_prompt_tail = "assistant";
  const std::string text = "<|channel|>analysis<|message|>" + kReasoning +
                           "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                           "<|message|>" + kWeatherArgs.dump() + "<|call|>";
  expect_reads_back(options, text,
                    Expected{.reasoning = kReasoning, .content = "", .calls = {{"get_weather", kWeatherArgs}}});
}

// ---- the history in the fields each template reads ---------------------------------------------

TEST(OutputFormats, GptOssToolResultsFollowTheirOwnCall) {
  const ChatPrompt p = family_prompt("openai-gpt-oss-120b");
  const Json messages = Json::array({kUser, assistant_turn("", kReasoning),
                                     {{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", "search results"}},
                                     {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}}});
  const std::string text = p.render(chat(messages, true)).text;
  const size_t weather_result = text.find("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"18 C\"");
  const size_t search_result =
      text.find("<|start|>functions.search to=assistant<|channel|>commentary<|message|>\"search results\"");
  ASSERT_NE(weather_result, std::string::npos) << text;
  ASSERT_NE(search_result, std::string::npos) << text;
  EXPECT_LT(text.find("to=functions.get_weather"), weather_result);
  EXPECT_LT(weather_result, text.find("to=functions.search"));
  EXPECT_LT(text.find("to=functions.search"), search_result);
}

TEST(OutputFormats, DeepSeekTemplatesGetArgumentsAsText) {
  // DeepSeek's templates concatenate the arguments: an object there is a TypeError (a 400).
  for (const char* name : {"deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"}) {
    SCOPED_TRACE(name);
    const ChatPrompt p = family_prompt(name);
    const Json messages =
        Json::array({kUser, assistant_turn("", ""), {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}}});
    std::string text;
    EXPECT_NO_THROW(text = p.render(chat(messages, true)).text);
    EXPECT_NE(text.find(kWeatherArgs.dump()), std::string::npos) << text;
  }
}

// ---- calls that do not parse -----------------------------------------------------------------

TEST(OutputFormats, CallsThatDoNotParseAreReturnedAsTextAndRecorded) {
  struct Case {
    ToolCallFormat format;
    std::string text;
  };
  const Case cases[] = {
      {ToolCallFormat::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par</tool_call>"},
      {ToolCallFormat::DeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {ToolCallFormat::DeepSeekV31,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>[1, 2]<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {ToolCallFormat::KimiK2,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 {\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>"},
      {ToolCallFormat::Glm45, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</tool_call>"},
      {ToolCallFormat::Harmony, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(tool_call_format_name(c.format));
    const OutputParserOptions options{.parse_reasoning = true, .parse_tool_calls = true, .format = c.format};
    OutputParser parser(options);
    std::string content;
    int calls = 0;
    for (const auto& pieces : {parser.push(c.text), parser.finish()})
      for (const OutputPiece& p : pieces) {
        if (p.kind == OutputPiece::Kind::Content) content += p.text;
        calls += p.kind == OutputPiece::Kind::ToolCall;
      }
    EXPECT_EQ(calls, 0);
    EXPECT_NE(content.find("get_weather"), std::string::npos) << "the model's text comes back: " << content;
    ASSERT_EQ(parser.unparsed_tool_calls().size(), 1u) << "and is recorded for the log";
    EXPECT_NE(parser.unparsed_tool_calls()[0].find("get_weather"), std::string::npos);
    EXPECT_LE(parser.unparsed_tool_calls()[0].size(), OutputParser::kUnparsedExcerptBytes);
  }
  // The whole text of a broken Hermes call, markers included, is the answer.
  OutputParser hermes({.parse_tool_calls = true});
  std::string content;
  for (const auto& pieces : {hermes.push(cases[0].text), hermes.finish()})
    for (const OutputPiece& p : pieces) content += p.text;
  EXPECT_EQ(content, cases[0].text);
}

TEST(OutputFormats, GlmValuesFollowTheSchema) {
  const std::string body = "search\n<arg_key>query</arg_key>\n<arg_value>42</arg_value>\n"
                           "<arg_key>max_results</arg_key>\n<arg_value>3</arg_value>\n"
                           "<arg_key>note</arg_key>\n<arg_value>not json {</arg_value>\n";
  OutputParserOptions options{.parse_tool_calls = true, .format = ToolCallFormat::Glm45};
  ParsedToolCall call;
  ASSERT_TRUE(parse_tool_call(options, body, call));
  EXPECT_EQ(Json::parse(call.arguments), Json::parse(R"({"query": 42, "max_results": 3, "note": "not json {"})"))
      << "without a schema, what reads as JSON is JSON";
  options.string_parameters["search"] = {"query"};
  ASSERT_TRUE(parse_tool_call(options, body, call));
  EXPECT_EQ(Json::parse(call.arguments), Json::parse(R"({"query": "42", "max_results": 3, "note": "not json {"})"));
  EXPECT_FALSE(parse_tool_call(options, "two words\n<arg_key>a</arg_key><arg_value>1</arg_value>", call));
  EXPECT_FALSE(parse_tool_call(options, "f\n<arg_key>a</arg_key>stray<arg_value>1</arg_value>", call));
}

// ---- special-token markers are kept in the reply -------------------------------------------------

// A model folder with `template` and a tokenizer whose added tokens include `markers` (special or not).
ChatPrompt load_with_markers(const std::string& template_name, const std::vector<std::string>& markers, bool special) {
  Json tok = Json::parse(read_file(fs::path(SPILL_TEST_DATA) / "tokenizer/split_behaviors/tokenizer.json"));
  int id = 3000;
  for (const std::string& m : markers)
    tok["added_tokens"].push_back({{"id", id++}, {"content", m}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", special}});
  const Tokenizer tokenizer = Tokenizer::from_json(tok.dump(), "test tokenizer.json");
  const fs::path dir = fs::temp_directory_path() / ("spill-output-formats-" + template_name + (special ? "-s" : "-n"));
  fs::create_directories(dir);
  std::ofstream(dir / "chat_template.jinja", std::ios::binary) << read_file(kTemplateDir / (template_name + ".jinja"));
  ChatPrompt p = ChatPrompt::load(dir.string(), &tokenizer);
  fs::remove_all(dir);
  return p;
}

TEST(OutputFormats, SpecialTokenMarkersAreDetokenizedForTheParser) {
  const std::vector<std::string> harmony = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>"};
  const std::vector<std::string> kimi = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                         "<|tool_call_begin|>", "<|tool_call_end|>"};
  const ChatInput c = chat(Json::array({kUser}), true);
  EXPECT_TRUE(load_with_markers("openai-gpt-oss-120b", harmony, true).render(c).keep_special_tokens);
  EXPECT_TRUE(load_with_markers("moonshotai-Kimi-K2", kimi, true).render(c).keep_special_tokens);
  EXPECT_FALSE(load_with_markers("moonshotai-Kimi-K2", kimi, false).render(c).keep_special_tokens);
  // Qwen's <tool_call> and <think> are added tokens but not special: nothing changes for it.
  EXPECT_FALSE(load_with_markers("Qwen-Qwen3-0.6B", {"<tool_call>", "</tool_call>", "<think>", "</think>"}, false)
                   .render(c)
                   .keep_special_tokens);
}

// ---- GLM-4.6's template renders as jinja2 does ---------------------------------------------------

TEST(OutputFormats, Glm46TemplateRendersAsJinja2) {
  // cases-zai-org-GLM-4.6-jinja2.json: tools/fixtures/make_chat_template_fixtures.py --jinja2-only
  // --only zai-org-GLM-4.6 (transformers' environment rebuilt on jinja2 3.1.6: transformers does
  // not run here).
  const Json fixture = Json::parse(read_file(kTemplateDir / "cases-zai-org-GLM-4.6-jinja2.json"));
  const ChatTemplate t = ChatTemplate::from_templates({{"default", read_file(kTemplateDir / "zai-org-GLM-4.6.jinja")}},
                                                      special_tokens("zai-org-GLM-4.6"), "zai-org-GLM-4.6.jinja");
  ASSERT_GE(fixture["cases"].size(), 10u);
  for (const Json& c : fixture["cases"]) {
    SCOPED_TRACE(c["scenario"].get<std::string>());
    auto render = [&] { return t.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["extra_kwargs"]); };
    if (c.contains("expected")) {
      EXPECT_EQ(render(), c["expected"].get<std::string>());
    } else {
      try {
        (void)render();
        ADD_FAILURE() << "expected " << c["expected_error"].dump();
      } catch (const spill::Error& e) {
        EXPECT_TRUE(std::string(e.what()).ends_with(c["expected_error"]["type"].get<std::string>() + ": " +
                                                    c["expected_error"]["message"].get<std::string>()))
            << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace spill::server
