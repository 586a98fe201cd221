// The output parser must give the same split whatever way the text arrives: whole, one byte at a
// time, or in chunks that cut tags anywhere. Each case below is run under every chunking.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/output_parser.h"

namespace spill::server {
namespace {

struct Split {
  std::string reasoning{};
  std::string content{};
  std::vector<ParsedToolCall> calls{};
  // The order in which piece kinds appeared (merged runs), e.g. "RCT" = reasoning, content, tool.
  std::string order{};
};

void collect(const std::vector<OutputPiece>& pieces, Split& s) {
  for (const OutputPiece& p : pieces) {
    char k = p.kind == OutputPiece::Kind::Reasoning ? 'R' : p.kind == OutputPiece::Kind::Content ? 'C' : 'T';
    if (s.order.empty() || s.order.back() != k || k == 'T') s.order.push_back(k);
    switch (p.kind) {
      case OutputPiece::Kind::Reasoning:
        EXPECT_FALSE(p.text.empty());
        s.reasoning += p.text;
        break;
      case OutputPiece::Kind::Content:
        EXPECT_FALSE(p.text.empty());
        s.content += p.text;
        break;
      case OutputPiece::Kind::ToolCall:
        s.calls.push_back(p.call);
        break;
    }
  }
}

Split parse_in_chunks(const OutputParserOptions& options, std::string_view text, size_t chunk) {
  OutputParser parser(options);
  Split s;
  for (size_t i = 0; i < text.size(); i += chunk) collect(parser.push(text.substr(i, chunk)), s);
  collect(parser.finish(), s);
  return s;
}

// Runs the parser with chunk sizes 1..n and whole, and checks they all agree with `expected`.
void expect_split(const OutputParserOptions& options, std::string_view text, const Split& expected) {
  std::vector<size_t> chunks;
  for (size_t c = 1; c <= 13; ++c) chunks.push_back(c);
  chunks.push_back(text.size() + 1);
  for (size_t chunk : chunks) {
    SCOPED_TRACE("chunk size " + std::to_string(chunk));
    const Split got = parse_in_chunks(options, text, chunk);
    EXPECT_EQ(got.reasoning, expected.reasoning);
    EXPECT_EQ(got.content, expected.content);
    ASSERT_EQ(got.calls.size(), expected.calls.size());
    for (size_t i = 0; i < got.calls.size(); ++i) {
      EXPECT_EQ(got.calls[i].name, expected.calls[i].name);
      EXPECT_EQ(got.calls[i].arguments, expected.calls[i].arguments);
    }
    if (!expected.order.empty()) {
      EXPECT_EQ(got.order, expected.order);
    }
  }
}

const OutputParserOptions kAll{.parse_reasoning = true, .parse_tool_calls = true};
const OutputParserOptions kNothing{};

TEST(OutputParser, PlainTextComesThroughByteForByte) {
  const std::string text = "  Hello, <b>world</b>!\n\n  def f():\n\treturn 1 < 2 \n";
  expect_split(kAll, text, {.content = text, .order = "C"});
  expect_split(kNothing, text, {.content = text, .order = "C"});
}

TEST(OutputParser, TagsAreTextWhenParsingIsOff) {
  const std::string text = "<think>hm</think>ok<tool_call>{\"name\":\"f\"}</tool_call>";
  expect_split(kNothing, text, {.content = text});
}

TEST(OutputParser, ReasoningThenAnswer) {
  expect_split(kAll, "<think>\nLet me think.\nStep 2.\n</think>\n\nThe answer is 4.",
               {.reasoning = "Let me think.\nStep 2.", .content = "The answer is 4.", .order = "RC"});
}

TEST(OutputParser, ReasoningAfterLeadingWhitespace) {
  expect_split(kAll, "\n <think>a</think>b", {.reasoning = "a", .content = "b", .order = "RC"});
}

TEST(OutputParser, ThinkTagLaterInTheAnswerIsText) {
  expect_split(kAll, "Use <think> tags like <think>x</think>.",
               {.content = "Use <think> tags like <think>x</think>.", .order = "C"});
}

TEST(OutputParser, PromptOpenedReasoning) {
  OutputParserOptions o = kAll;
  o.starts_in_reasoning = true;
  expect_split(o, "\nThinking...\n</think>\n\nDone.", {.reasoning = "Thinking...", .content = "Done.", .order = "RC"});
  // A second <think> after the reasoning closed is text.
  expect_split(o, "a</think><think>b", {.reasoning = "a", .content = "<think>b"});
}

TEST(OutputParser, UnterminatedReasoningStaysReasoning) {
  expect_split(kAll, "<think>I was cut off by max_tok", {.reasoning = "I was cut off by max_tok", .order = "R"});
  // A partial closing tag at the very end is what the model wrote: reasoning text.
  expect_split(kAll, "<think>abc</thi", {.reasoning = "abc</thi"});
}

TEST(OutputParser, EmptyReasoning) {
  expect_split(kAll, "<think>\n\n</think>\n\nHi", {.content = "Hi", .order = "C"});
}

TEST(OutputParser, ToolCallHermesStyle) {
  expect_split(kAll,
               "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
               {.calls = {{"get_weather", R"({"city":"Paris","days":3})"}}, .order = "T"});
}

TEST(OutputParser, TextBeforeToolCallsAndMultipleCalls) {
  expect_split(kAll,
               "I'll check both.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
               "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
               {.content = "I'll check both.", .calls = {{"a", "{}"}, {"b", R"({"x":[1,2]})"}}, .order = "CTT"});
}

TEST(OutputParser, ReasoningThenToolCall) {
  expect_split(kAll,
               "<think>\nneed the tool\n</think>\n\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"path\": \"/\"}}\n"
               "</tool_call>",
               {.reasoning = "need the tool", .calls = {{"ls", R"({"path":"/"})"}}, .order = "RT"});
}

TEST(OutputParser, TextAfterToolCallIsKept) {
  expect_split(kAll, "<tool_call>{\"name\":\"a\"}</tool_call>\nand then more",
               {.content = "and then more", .calls = {{"a", "{}"}}, .order = "TC"});
}

TEST(OutputParser, ToolCallInsideReasoningIsReasoning) {
  expect_split(kAll, "<think>maybe <tool_call>{\"name\":\"a\"}</tool_call></think>no",
               {.reasoning = "maybe <tool_call>{\"name\":\"a\"}</tool_call>", .content = "no"});
}

TEST(OutputParser, InvalidJsonInToolCallIsReturnedAsText) {
  const std::string bad = "<tool_call>\n{\"name\": \"a\", \"arguments\": {oops}\n</tool_call>";
  expect_split(kAll, "Before. " + bad, {.content = "Before. " + bad, .order = "C"});
  // Valid JSON that is not a call (no name) is text too.
  expect_split(kAll, "<tool_call>[1, 2]</tool_call>", {.content = "<tool_call>[1, 2]</tool_call>"});
  expect_split(kAll, "<tool_call>{\"arguments\": {}}</tool_call>", {.content = "<tool_call>{\"arguments\": {}}</tool_call>"});
  // Arguments that are neither an object nor a JSON-object string.
  expect_split(kAll, "<tool_call>{\"name\": \"a\", \"arguments\": 5}</tool_call>",
               {.content = "<tool_call>{\"name\": \"a\", \"arguments\": 5}</tool_call>"});
}

TEST(OutputParser, UnparsedToolCallsAreRecordedForTheLog) {
  OutputParser parser(kAll);
  std::vector<OutputPiece> pieces = parser.push("<tool_call>{\"name\": \"a\"}</tool_call> <tool_call>not json</tool_call>");
  for (OutputPiece& p : parser.finish()) pieces.push_back(std::move(p));
  EXPECT_EQ(parser.n_tool_calls(), 1);
  ASSERT_EQ(parser.unparsed_tool_calls().size(), 1u);
  EXPECT_EQ(parser.unparsed_tool_calls()[0], "not json");
  // A huge bad body is kept only as an excerpt.
  OutputParser big(kAll);
  (void)big.push("<tool_call>" + std::string(1000, 'x') + "</tool_call>");
  ASSERT_EQ(big.unparsed_tool_calls().size(), 1u);
  EXPECT_EQ(big.unparsed_tool_calls()[0].size(), OutputParser::kUnparsedExcerptBytes);
}

TEST(OutputParser, InvalidCallBetweenValidCalls) {
  expect_split(kAll,
               "<tool_call>{\"name\":\"a\"}</tool_call>\n<tool_call>nope</tool_call>\n<tool_call>{\"name\":\"b\"}</tool_call>",
               {.content = "<tool_call>nope</tool_call>", .calls = {{"a", "{}"}, {"b", "{}"}}, .order = "TCT"});
}

TEST(OutputParser, UnterminatedToolCallAtMaxTokensIsText) {
  const std::string cut = "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"content\": \"def f(";
  expect_split(kAll, cut, {.content = cut, .order = "C"});
  expect_split(kAll, "Sure. " + cut, {.content = "Sure. " + cut});
}

TEST(OutputParser, UnterminatedButCompleteToolCallIsAccepted) {
  expect_split(kAll, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": 1}}\n",
               {.calls = {{"a", R"({"k":1})"}}});
  // Cut inside the closing tag.
  expect_split(kAll, "<tool_call>{\"name\": \"a\", \"arguments\": {}}\n</tool_", {.calls = {{"a", "{}"}}});
}

TEST(OutputParser, ArgumentsAsJsonStringAndParametersKey) {
  expect_split(kAll, R"(<tool_call>{"name": "a", "arguments": "{\"q\": \"x\"}"}</tool_call>)",
               {.calls = {{"a", R"({"q":"x"})"}}});
  expect_split(kAll, R"(<tool_call>{"name": "a", "parameters": {"q": 1}}</tool_call>)", {.calls = {{"a", R"({"q":1})"}}});
}

TEST(OutputParser, ArgumentsKeepUnicodeAndTagLikeStrings) {
  expect_split(kAll, "<tool_call>{\"name\": \"say\", \"arguments\": {\"t\": \"héllo <think> 日本\"}}</tool_call>",
               {.calls = {{"say", "{\"t\":\"héllo <think> 日本\"}"}}});
}

TEST(OutputParser, ToolCallsOffLeavesTagsInTheAnswer) {
  OutputParserOptions o{.parse_reasoning = true, .parse_tool_calls = false};
  expect_split(o, "<think>x</think><tool_call>{\"name\":\"a\"}</tool_call>",
               {.reasoning = "x", .content = "<tool_call>{\"name\":\"a\"}</tool_call>"});
}

TEST(OutputParser, AlmostTagsAreText) {
  expect_split(kAll, "a <tool_cal b <think c </think> d <", {.content = "a <tool_cal b <think c </think> d <"});
  expect_split(kAll, "<<tool_call>{\"name\":\"x\"}</tool_call>", {.content = "<", .calls = {{"x", "{}"}}});
}

TEST(OutputParser, TrailingWhitespaceOfPlainAnswerIsKept) {
  expect_split(kAll, "<think>r</think>answer\n\n", {.reasoning = "r", .content = "answer\n\n"});
}

TEST(OutputParser, PushReturnsTextAsSoonAsItIsCertain) {
  OutputParser p(kAll);
  // "Hel" cannot start a tag: out at once.
  auto out = p.push("Hel");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].text, "Hel");
  // "<tool" might: held.
  EXPECT_TRUE(p.push("lo <tool").size() == 1);
  EXPECT_TRUE(p.push("_").empty());
  out = p.push("x");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].text, " <tool_x");
}

TEST(OutputParser, ParseToolCallBody) {
  ParsedToolCall c;
  EXPECT_TRUE(parse_tool_call_body(" {\"name\": \"n\", \"arguments\": null} ", c));
  EXPECT_EQ(c.arguments, "{}");
  EXPECT_FALSE(parse_tool_call_body("{\"name\": \"\"}", c));
  EXPECT_FALSE(parse_tool_call_body("{\"name\": 3}", c));
  EXPECT_FALSE(parse_tool_call_body("{\"name\": \"n\"} trailing", c));
  EXPECT_FALSE(parse_tool_call_body("", c));
}

}  // namespace
}  // namespace spill::server
