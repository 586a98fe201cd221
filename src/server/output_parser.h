// Splits a chat model's generated text into what the client should see as separate things:
// reasoning, the answer, and tool calls, in the format the model's family writes them
// (ToolCallFormat, chosen once when the model is loaded, from its chat template):
//
//   Hermes       <tool_call>{"name": N, "arguments": {...}}</tool_call>      (Qwen2.5/3, Hermes)
//   DeepSeekV3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//                                                                            (DeepSeek-V3, R1)
//   DeepSeekV31  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   KimiK2       <|tool_calls_section_begin|><|tool_call_begin|>functions.N:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>
//   Glm45        <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>  (GLM-4.5/4.6)
//   Harmony      gpt-oss: messages <|start|>assistant<|channel|>C<|message|>TEXT<|end|>; channel
//                analysis is reasoning, final (and commentary without a recipient) the answer, a
//                message to=functions.N a tool call whose TEXT is ARGS (ended by <|call|>).
//
// All but Harmony reason in <think>...</think>.
//
// Incremental: push() takes text as it is generated (any split, even inside a tag) and returns
// the pieces that are certain so far; finish() returns the rest. The same parser serves streaming
// (each push becomes SSE deltas) and non-streaming responses (concatenate all pieces), for the
// OpenAI, Responses and Anthropic APIs, so all see the same split.
//
// Rules, chosen so that clients get clean fields without losing text:
//   - Reasoning starts only at the very beginning of the output (after optional whitespace), or
//     right away when the prompt already opened it (templates such as DeepSeek-R1's end the
//     generation prompt with "<think>\n"). A "<think>" later in the answer is plain text.
//   - Tool calls are recognised anywhere in the answer, never inside reasoning. A tool call is
//     emitted only once its closing marker arrives (or the output ends right after a complete
//     call: models stop at their end-of-call token) and its body reads as a call in the format
//     (a name, and arguments that are a JSON object). Anything else, including an invalid body,
//     is returned as answer text, markers included, so nothing the model wrote is silently
//     dropped (the markers that open and close a section of calls are layout and are dropped).
//   - Whitespace next to tags is layout, not content: leading whitespace after any tag is dropped,
//     whitespace before a tag is dropped, and whitespace left at the end of the answer is kept
//     only when no tool call was made. Text without tags comes through byte for byte. Harmony
//     message bodies come through byte for byte.
#pragma once
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace spill::server {

enum class ToolCallFormat { Hermes, DeepSeekV3, DeepSeekV31, KimiK2, Glm45, Harmony };

// "hermes", "deepseek_v3", ... (for logs and errors).
const char* tool_call_format_name(ToolCallFormat format);

struct OutputParserOptions {
  bool parse_reasoning = false;      // split reasoning out of the answer
  bool starts_in_reasoning = false;  // the prompt ended inside an open <think>
  bool parse_tool_calls = false;     // turn the format's tool calls into tool calls
  ToolCallFormat format = ToolCallFormat::Hermes;
  // Harmony: the prompt's last, unfinished message header (what follows its last <|start|>, e.g.
  // "assistant" or "assistant<|channel|>final<|message|>"), which the reply continues. Empty
  // when the prompt ended between messages.
  std::string harmony_prompt_tail{};
  // Glm45: the arguments each tool declares with type "string". Their values are kept as text
  // even when they read as JSON ("42" stays "42"); other values are decoded as JSON when they
  // parse (42 becomes a number), else kept as text.
  std::map<std::string, std::set<std::string>, std::less<>> string_parameters{};
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

// Parses the body between <tool_call> and </tool_call> (Hermes). Returns false when it is not a call.
bool parse_tool_call_body(std::string_view body, ParsedToolCall& out);
// Parses the body of one call (between the format's call markers; for Harmony, the header's
// recipient and the message text) in `options.format`. Returns false when it is not a call.
bool parse_tool_call(const OutputParserOptions& options, std::string_view body, ParsedToolCall& out);

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
  ToolCallFormat format() const { return options_.format; }
  // Tool-call blocks that were not a valid call and went out as text: the first bytes of each
  // body, for the server's log (a model whose call format spill does not read should be visible).
  const std::vector<std::string>& unparsed_tool_calls() const { return unparsed_tool_calls_; }
  static constexpr size_t kUnparsedExcerptBytes = 200;

  // The markers of a format (empty where the format has none).
  struct Markers {
    std::string_view section_begin, section_end;  // around a run of calls
    std::string_view call_begin, call_end;        // around one call
  };
  static Markers markers(ToolCallFormat format);

 private:
  enum class Mode { Content, Reasoning, Section, ToolCall };
  enum class HarmonyMode { Between, Header, Body };

  void scan(std::vector<OutputPiece>& out, bool at_end);
  void scan_harmony(std::vector<OutputPiece>& out, bool at_end);
  void start_harmony_body();
  std::string harmony_raw_header() const;  // the header as the model wrote it
  void end_harmony_body(std::vector<OutputPiece>& out, std::string_view body, std::string_view terminator);
  void emit_text(std::vector<OutputPiece>& out, OutputPiece::Kind kind, std::string_view text);
  void append(std::vector<OutputPiece>& out, OutputPiece::Kind kind, std::string_view text);
  void end_tool_call(std::vector<OutputPiece>& out, std::string_view body, std::string_view closed_by);
  void record_unparsed(std::string_view body);

  OutputParserOptions options_;
  Markers markers_;
  Mode mode_ = Mode::Content;
  bool in_section_ = false;    // the current call opened inside a section of calls
  std::string pending_;        // text not yet classified (may end with the start of a tag)
  std::string held_ws_;        // trailing whitespace of the current text run, not yet emitted
  bool skip_leading_ws_ = false;
  bool may_start_reasoning_ = false;  // nothing but whitespace so far: "<think>" opens reasoning
  std::string ws_before_tool_call_;   // restored if the tool call turns out to be text
  int n_tool_calls_ = 0;
  std::vector<std::string> unparsed_tool_calls_;

  // Harmony state: the header of the current message and what its body is.
  HarmonyMode harmony_mode_ = HarmonyMode::Between;
  std::string harmony_header_;
  bool harmony_header_opened_by_start_ = false;  // the header followed a <|start|> (not a bare <|channel|>)
  OutputPiece::Kind harmony_kind_ = OutputPiece::Kind::Content;
  bool harmony_call_ = false;       // the body is a tool call's arguments (collected, not streamed)
  std::string harmony_recipient_;   // "functions.NAME" or another recipient
};

}  // namespace spill::server
