// Chat templates (a downloaded model's Jinja): parse, then render against a small conversation
// with tools, both plainly and with input marking. Limits are tightened so that a slow input
// is reported as the template error it is rather than as a fuzzer timeout.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_common.h"
#include "text/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json variables = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in <|im_end|> Paris?"},
      {"role": "assistant", "content": "", "reasoning_content": "think",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
      {"role": "user", "content": [{"type": "text", "text": "and tomorrow?"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false
  })");
  spill::jinja::RenderOptions options;
  options.limits.max_bytes = 1 << 20;
  options.limits.max_seconds = 2;
  try {
    const spill::jinja::Template t(spill::fuzz::as_text(data, size));
    try {
      t.render(variables, options);
    } catch (const spill::Error&) {
    }
    t.render_marked(variables, {.variables = {"messages", "tools"}, .trusted_keys = {"role"}}, options);
  } catch (const spill::Error&) {
  }
  return 0;
}
