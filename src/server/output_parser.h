// Splits a chat model's generated text into what the client should see as separate things:
// reasoning (<think>...</think>), the answer, and tool calls (Qwen/Hermes style
// <tool_call>{"name": ..., "arguments": {...}}</tool_call>).
//
// Incremental: push() takes text as it is generated (any split, even inside a tag) and returns
// the pieces that are certain so far; finish() returns the rest. The same parser serves streaming
// (each push becomes SSE deltas) and non-streaming responses (concatenate all pieces), for both
// the OpenAI and the Anthropic API, so both see the same split.
//
// Rules, chosen so that clients get clean fields without losing text:
//   - Reasoning starts only at the very beginning of the output (after optional whitespace), or
//     right away when the prompt already opened it (templates such as DeepSeek-R1's end the
//     generation prompt with "<think>\n"). A "<think>" later in the answer is plain text.
//   - Tool calls are recognised anywhere in the answer, never inside reasoning. A tool call is
//     emitted only once its closing tag arrives and its body is a JSON object with a string
//     "name" (and "arguments" or "parameters": an object, or a string holding JSON). Anything
//     else, including an invalid body, is returned as answer text, tags included, so nothing the
//     model wrote is silently dropped.
//   - At finish(), an unterminated tool call whose body is already a complete, valid call is
//     accepted (models sometimes stop right after the JSON); otherwise its text is answer text.
//   - Whitespace next to tags is layout, not content: leading whitespace after any tag is dropped,
//     whitespace before a tag is dropped, and whitespace left at the end of the answer is kept
//     only when no tool call was made. Text without tags comes through byte for byte.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace spill::server {

struct OutputParserOptions {
  bool parse_reasoning = false;      // split <think>...</think> out of the answer
  bool starts_in_reasoning = false;  // the prompt ended inside an open <think>
  bool parse_tool_calls = false;     // turn <tool_call>...</tool_call> into tool calls
  std::string reasoning_start = "<think>";
  std::string reasoning_end = "</think>";
  std::string tool_call_start = "<tool_call>";
  std::string tool_call_end = "</tool_call>";
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // the arguments object as compact JSON text
};

struct OutputPiece {
  enum class Kind { Reasoning, Content, ToolCall };
  Kind kind = Kind::Content;
  std::string text;       // Reasoning, Content
  ParsedToolCall call;    // ToolCall
};

// Parses the body between <tool_call> and </tool_call>. Returns false when it is not a call.
bool parse_tool_call_body(std::string_view body, ParsedToolCall& out);

class OutputParser {
 public:
  explicit OutputParser(const OutputParserOptions& options);

  // Feeds generated text; returns the pieces now known, in order. Adjacent pieces of the same
  // kind are merged, so one push yields at most a few pieces.
  std::vector<OutputPiece> push(std::string_view text);
  // The output ended (stop, length, cancel): returns everything still held back.
  std::vector<OutputPiece> finish();

  int n_tool_calls() const { return n_tool_calls_; }
  bool in_reasoning() const { return mode_ == Mode::Reasoning; }
  // Tool-call blocks that were not a valid call and went out as text: the first bytes of each
  // body, for the server's log (a model whose call format spill does not read should be visible).
  const std::vector<std::string>& unparsed_tool_calls() const { return unparsed_tool_calls_; }
  static constexpr size_t kUnparsedExcerptBytes = 200;

 private:
  enum class Mode { Content, Reasoning, ToolCall };

  void scan(std::vector<OutputPiece>& out, bool at_end);
  void emit_text(std::vector<OutputPiece>& out, OutputPiece::Kind kind, std::string_view text);
  void flush_held_whitespace(std::vector<OutputPiece>& out);
  void append(std::vector<OutputPiece>& out, OutputPiece::Kind kind, std::string_view text);
  void end_tool_call(std::vector<OutputPiece>& out, std::string_view body, bool closed);

  OutputParserOptions options_;
  Mode mode_ = Mode::Content;
  std::string pending_;        // text not yet classified (may end with the start of a tag)
  std::string held_ws_;        // trailing whitespace of the current text run, not yet emitted
  bool skip_leading_ws_ = false;
  bool may_start_reasoning_ = false;  // nothing but whitespace so far: "<think>" opens reasoning
  std::string ws_before_tool_call_;   // restored if the tool call turns out to be text
  int n_tool_calls_ = 0;
  std::vector<std::string> unparsed_tool_calls_;
};

}  // namespace spill::server
