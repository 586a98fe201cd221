// Every malformed request must come back as a 400 ApiError, never as another exception (which the
// server would report as a 500) or a crash. Each value anywhere in realistic requests is replaced
// by values of every JSON type, and random byte-level damage is applied to the bodies.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "server/anthropic_api.h"
#include "server/api_common.h"
#include "server/openai_api.h"
#include "server/output_parser.h"

namespace spill::server {
namespace {

const char* kChat = R"({"model": "m", "messages": [
  {"role": "system", "content": "s"},
  {"role": "user", "content": [{"type": "text", "text": "hi"}]},
  {"role": "assistant", "content": null, "reasoning_content": "r", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
  {"role": "tool", "tool_call_id": "c", "content": "ok"}],
  "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
  "tool_choice": {"type": "function", "function": {"name": "f"}},
  "max_tokens": 5, "max_completion_tokens": 6, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3,
  "stop": ["x"], "stop_token_ids": [1], "presence_penalty": 0.1, "frequency_penalty": 0.1, "repetition_penalty": 1.1,
  "logprobs": true, "top_logprobs": 2, "ignore_eos": false, "skip_special_tokens": true, "n": 2, "stream": true,
  "stream_options": {"include_usage": true}, "parallel_tool_calls": true, "chat_template_kwargs": {"enable_thinking": true},
  "add_generation_prompt": true, "response_format": {"type": "text"}, "logit_bias": {}, "min_tokens": 0})";

const char* kCompletion = R"({"model": "m", "prompt": ["a", "b"], "max_tokens": 3, "echo": true, "logprobs": 1, "suffix": "",
  "best_of": 1, "n": 1, "stream": false, "stop": "x", "seed": 1})";

const char* kMessages = R"({"model": "claude", "max_tokens": 10, "system": [{"type": "text", "text": "s"}],
  "messages": [
    {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "document", "source": {"type": "text", "data": "doc"}}]},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "x"}, {"type": "text", "text": "a"},
      {"type": "tool_use", "id": "u", "name": "f", "input": {"q": 1}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u", "content": [{"type": "text", "text": "r"}], "is_error": false}]},
    {"role": "assistant", "content": "prefill"}],
  "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
  "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": false},
  "thinking": {"type": "enabled", "budget_tokens": 100}, "stop_sequences": ["x"], "temperature": 0.5, "top_p": 0.5,
  "top_k": 3, "stream": true})";

const std::vector<Json>& replacements() {
  static const std::vector<Json> values = {nullptr, true, false, 0, -1, 1.5, 1e308, -1e308, 18446744073709551615ull,
                                           "", "s", Json::array(), Json::array({1}), Json::array({"a"}),
                                           Json::object(), Json{{"a", 1}}, Json{{"type", "text"}}};
  return values;
}

using Parser = std::function<void(const Json&)>;

// Runs parse on body; anything but success or a 400 ApiError fails the test.
void expect_clean(const Parser& parse, const Json& body, const std::string& what) {
  try {
    parse(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << what << ": " << e.message;
    EXPECT_FALSE(e.message.empty()) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": escaped as " << typeid(e).name() << ": " << e.what();
  }
}

// Replaces the value at every position in the document (recursively) by every replacement.
void swap_every_value(Json& root, const Parser& parse) {
  std::function<void(Json&, const std::string&)> visit = [&](Json& node, const std::string& path) {
    if (node.is_object()) {
      for (auto it = node.begin(); it != node.end(); ++it) {
        Json saved = it.value();
        for (const Json& v : replacements()) {
          it.value() = v;
          expect_clean(parse, root, path + "." + it.key() + " = " + v.dump());
        }
        it.value() = saved;
        visit(it.value(), path + "." + it.key());
      }
    } else if (node.is_array()) {
      for (size_t i = 0; i < node.size(); ++i) {
        Json saved = node[i];
        for (const Json& v : replacements()) {
          node[i] = v;
          expect_clean(parse, root, path + "[" + std::to_string(i) + "] = " + v.dump());
        }
        node[i] = saved;
        visit(node[i], path + "[" + std::to_string(i) + "]");
      }
    }
  };
  // Mutated in place and restored: every parse sees the whole document with one value changed.
  visit(root, "");
}

TEST(ServerRobustness, EveryValueOfEveryTypeInChatRequests) {
  Json body = parse_json_body(kChat);
  ASSERT_NO_THROW(parse_chat_completion_request(body));
  swap_every_value(body, [](const Json& b) { (void)parse_chat_completion_request(b); });
  swap_every_value(body, [](const Json& b) { (void)parse_chat_input(b); });
}

TEST(ServerRobustness, EveryValueOfEveryTypeInCompletionRequests) {
  Json body = parse_json_body(kCompletion);
  ASSERT_NO_THROW(parse_completion_request(body));
  swap_every_value(body, [](const Json& b) { (void)parse_completion_request(b); });
}

TEST(ServerRobustness, EveryValueOfEveryTypeInMessagesRequests) {
  Json body = parse_json_body(kMessages);
  ASSERT_NO_THROW(parse_messages_request(body));
  swap_every_value(body, [](const Json& b) { (void)parse_messages_request(b); });
  swap_every_value(body, [](const Json& b) { (void)parse_count_tokens_request(b); });
}

TEST(ServerRobustness, DamagedBodies) {
  std::mt19937_64 rng(12345);
  const std::vector<std::string> seeds = {kChat, kCompletion, kMessages};
  const Parser parsers[] = {[](const Json& b) { (void)parse_chat_completion_request(b); },
                            [](const Json& b) { (void)parse_completion_request(b); },
                            [](const Json& b) { (void)parse_messages_request(b); }};
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t which = rng() % seeds.size();
    std::string text = seeds[which];
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t pos = rng() % text.size();
      switch (rng() % 4) {
        case 0: text[pos] = char(rng() % 256); break;             // flip a byte
        case 1: text.erase(pos, 1 + rng() % 8); break;            // drop some
        case 2: text.insert(pos, 1, "{}[]\",:0-e\\"[rng() % 11]); break;  // insert syntax
        case 3: text.resize(pos); break;                          // truncate
      }
    }
    Json body;
    try {
      body = parse_json_body(text);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      continue;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "parse_json_body escaped: " << e.what();
      continue;
    }
    for (const Parser& p : parsers) expect_clean(p, body, "damaged body " + std::to_string(iter));
  }
}

TEST(ServerRobustness, OutputParserOnRandomText) {
  std::mt19937_64 rng(7);
  const std::vector<std::string> atoms = {"<think>", "</think>", "<tool_call>", "</tool_call>", "{", "}", "\"name\"", ":",
                                          "\"f\"", ",", "\"arguments\"", " ", "\n", "<", "/", "x", "\xff", "é"};
  for (int iter = 0; iter < 2000; ++iter) {
    OutputParser parser({.parse_reasoning = true, .starts_in_reasoning = bool(rng() % 2), .parse_tool_calls = true});
    std::string all, seen;
    for (int k = 0; k < 40; ++k) {
      std::string chunk;
      for (int a = 0, n = int(rng() % 3); a <= n; ++a) chunk += atoms[rng() % atoms.size()];
      all += chunk;
      for (const OutputPiece& p : parser.push(chunk)) seen += p.text;
    }
    for (const OutputPiece& p : parser.finish()) seen += p.text;
    // Never more text out than went in.
    EXPECT_LE(seen.size(), all.size());
  }
}

}  // namespace
}  // namespace spill::server
