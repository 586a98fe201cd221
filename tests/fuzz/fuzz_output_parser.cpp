// The parser of model output (reasoning, content, tool calls in each family's format): a model's
// text is as untrusted as a client's. The first byte sets the options and the chunk size the text
// arrives in, the second the format (and, for Harmony, the prompt's unfinished header; for GLM, a
// schema that declares some parameters strings); the same text must parse to the same pieces
// whatever the chunking.
#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "server/output_parser.h"

namespace {

using spill::server::OutputParser;
using spill::server::OutputParserOptions;
using spill::server::OutputPiece;
using spill::server::ToolCallFormat;

constexpr ToolCallFormat kFormats[] = {ToolCallFormat::Hermes, ToolCallFormat::DeepSeekV3, ToolCallFormat::DeepSeekV31,
                                       ToolCallFormat::KimiK2, ToolCallFormat::Glm45,      ToolCallFormat::Harmony};
constexpr const char* kHarmonyTails[] = {"", "assistant", "assistant<|channel|>final<|message|>",
                                         "assistant<|channel|>analysis<|message|>"};

// Pieces merged by kind, so that chunkings that split a run differently compare equal.
std::vector<std::pair<int, std::string>> run(const OutputParserOptions& options, std::string_view text, size_t chunk) {
  OutputParser parser(options);
  std::vector<OutputPiece> pieces;
  for (size_t i = 0; i < text.size(); i += chunk) {
    auto got = parser.push(text.substr(i, chunk));
    pieces.insert(pieces.end(), got.begin(), got.end());
  }
  auto rest = parser.finish();
  pieces.insert(pieces.end(), rest.begin(), rest.end());
  std::vector<std::pair<int, std::string>> merged;
  for (const OutputPiece& p : pieces) {
    const int kind = int(p.kind);
    const std::string body = p.kind == OutputPiece::Kind::ToolCall ? p.call.name + "\x01" + p.call.arguments : p.text;
    if (!merged.empty() && merged.back().first == kind && p.kind != OutputPiece::Kind::ToolCall)
      merged.back().second += body;
    else
      merged.emplace_back(kind, body);
  }
  return merged;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text = spill::fuzz::as_text(data, size);
  const uint8_t selector = spill::fuzz::take_byte(text);
  OutputParserOptions options;
  options.parse_reasoning = selector & 1;
  options.starts_in_reasoning = options.parse_reasoning && (selector & 2);
  options.parse_tool_calls = selector & 4;
  const size_t chunk = 1 + (selector >> 3);
  const uint8_t format = spill::fuzz::take_byte(text);
  options.format = kFormats[(format & 7) % std::size(kFormats)];
  if (options.format == ToolCallFormat::Harmony) options.harmony_prompt_tail = kHarmonyTails[(format >> 3) & 3];
  if (options.format == ToolCallFormat::Glm45 && (format & 8)) options.string_parameters["f"] = {"a", "query"};
  if (run(options, text, std::max<size_t>(text.size(), 1)) != run(options, text, chunk)) std::abort();
  return 0;
}
