// Request bodies of every endpoint that takes JSON: OpenAI chat completions and completions,
// Anthropic messages and count_tokens. The first byte picks the endpoint.
#include "core/error.h"
#include "fuzz_common.h"
#include "server/anthropic_api.h"
#include "server/api_common.h"
#include "server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text = spill::fuzz::as_text(data, size);
  const uint8_t endpoint = spill::fuzz::take_byte(text) % 4;
  using namespace spill::server;
  try {
    const Json body = parse_json_body(text);
    switch (endpoint) {
      case 0:
        parse_chat_completion_request(body);
        break;
      case 1:
        parse_completion_request(body);
        break;
      case 2:
        parse_messages_request(body);
        break;
      default:
        parse_count_tokens_request(body);
        break;
    }
  } catch (const ApiError&) {
  } catch (const spill::Error&) {
  }
  return 0;
}
