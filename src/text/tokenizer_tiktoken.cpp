// Tokenizer::from_tiktoken: a tiktoken vocabulary (one "base64-of-the-token's-bytes rank" line per
// token, as Kimi-K2's tiktoken.model is) rebuilt as GGUF-style parts, the way llama.cpp's converter
// turns it into BPE: tokens by rank in byte-level spelling, and for each token the pair that
// tiktoken's byte-pair merge reaches just before it (run on the token's own bytes with only the
// lower ranks) as its merge, ranked by the token's rank. The model's special tokens come from
// tokenizer_config.json's added_tokens_decoder. tiktoken first looks a whole piece up in the
// vocabulary, so merges are ignored for pieces that are tokens (ignore_merges), which makes
// tokens no merge sequence reaches come out as tiktoken gives them.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/json_limits.h"
#include "text/tokenizer.h"

namespace spill {

namespace {

using json = nlohmann::json;

// Standard base64 (RFC 4648, "=" padding optional); nullopt for anything else.
std::optional<std::string> decode_base64(std::string_view s) {
  static const std::array<int8_t, 256> value = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) v[uint8_t(alphabet[i])] = int8_t(i);
    return v;
  }();
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  if (s.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(s.size() * 3 / 4);
  uint32_t bits = 0;
  int n = 0;
  for (char c : s) {
    const int8_t v = value[uint8_t(c)];
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | uint32_t(v);
    n += 6;
    if (n >= 8) {
      n -= 8;
      out += char((bits >> n) & 0xFF);
    }
  }
  return out;
}

// tiktoken's byte-pair merge of `bytes` using only ranks below `max_rank`: the adjacent pair whose
// concatenation has the lowest rank merges first (leftmost on ties) until none is below max_rank.
// Pair ranks are kept and only the two next to a merge recomputed: O(n^2) for an n-byte token,
// counted into `work` (the caller bounds the total).
std::vector<std::string> merge_below(const std::string& bytes, int32_t max_rank,
                                     const std::unordered_map<std::string, int32_t>& rank_of, uint64_t& work) {
  std::vector<std::string> parts;
  parts.reserve(bytes.size());
  for (char c : bytes) parts.emplace_back(1, c);
  std::string joined;
  auto pair_rank = [&](size_t i) {
    joined.assign(parts[i]).append(parts[i + 1]);
    auto it = rank_of.find(joined);
    return it != rank_of.end() && it->second < max_rank ? it->second : max_rank;
  };
  std::vector<int32_t> ranks;  // ranks[i]: of parts[i] + parts[i + 1]
  for (size_t i = 0; i + 1 < parts.size(); ++i) ranks.push_back(pair_rank(i));
  while (!ranks.empty()) {
    work += ranks.size();
    const auto best = std::min_element(ranks.begin(), ranks.end());  // the first of the lowest
    if (*best == max_rank) break;
    const auto at = size_t(best - ranks.begin());
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + std::ptrdiff_t(at) + 1);
    ranks.erase(ranks.begin() + std::ptrdiff_t(at));
    if (at < ranks.size()) ranks[at] = pair_rank(at);
    if (at > 0) ranks[at - 1] = pair_rank(at - 1);
  }
  return parts;
}

// A token named in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string token_name(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j.at("content").is_string()) return j.at("content").get<std::string>();
  return "";
}

}  // namespace

Tokenizer Tokenizer::from_tiktoken(const TiktokenSource& source) {
  const std::string_view model_text = source.model_text, config_text = source.config_text;
  const std::string& origin = source.origin;
  // Ranks of one file are 0..n-1; specials sit just above them (Kimi-K2: 256 ids). The bound on
  // special ids keeps a hostile config from sizing the tables.
  constexpr int32_t kMaxRanks = 1 << 22, kMaxSpecialGap = 1 << 16;
  constexpr size_t kMaxTokenBytes = 1024;  // real vocabularies stay under a few hundred
  // Deriving the merges costs about the sum of each token's squared length: a few million steps
  // for a real vocabulary (Kimi-K2: 163,840 tokens of 7 bytes on average); a file of many long
  // tokens that would take minutes is refused instead.
  constexpr uint64_t kMaxMergeWork = 400'000'000;
  std::vector<std::pair<int32_t, std::string>> by_rank;
  size_t line_no = 0;
  for (size_t pos = 0; pos < model_text.size();) {
    size_t end = model_text.find('\n', pos);
    if (end == std::string_view::npos) end = model_text.size();
    std::string_view line = model_text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      fail("{}: line {}: expected \"<base64 token> <rank>\"", origin, line_no);
    const std::optional<std::string> bytes = decode_base64(line.substr(0, space));
    if (!bytes || bytes->empty()) fail("{}: line {}: the token is not base64 of one or more bytes", origin, line_no);
    if (bytes->size() > kMaxTokenBytes)
      fail("{}: line {}: a token of {} bytes is longer than spill accepts ({})", origin, line_no, bytes->size(),
           kMaxTokenBytes);
    const std::string_view digits = line.substr(space + 1);
    int64_t rank = 0;
    if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      fail("{}: line {}: the rank {:?} is not a number", origin, line_no, digits);
    for (char c : digits) rank = rank * 10 + (c - '0');
    if (rank >= kMaxRanks) fail("{}: line {}: rank {} is more than spill accepts ({})", origin, line_no, rank, kMaxRanks);
    by_rank.emplace_back(int32_t(rank), *bytes);
  }
  if (by_rank.empty()) fail("{}: no tokens (expected one \"<base64 token> <rank>\" line per token)", origin);
  std::sort(by_rank.begin(), by_rank.end());
  std::unordered_map<std::string, int32_t> rank_of;
  rank_of.reserve(by_rank.size());
  for (size_t i = 0; i < by_rank.size(); ++i) {
    if (by_rank[i].first != int32_t(i))
      fail("{}: ranks must run 0, 1, 2, ... without gaps or repeats; rank {} is {}", origin, i,
           by_rank[i].first < int32_t(i) ? "repeated" : "missing");
    auto [it, fresh] = rank_of.emplace(by_rank[i].second, int32_t(i));
    if (!fresh) fail("{}: ranks {} and {} are the same token", origin, it->second, i);
  }
  for (int b = 0; b < 256; ++b)
    if (!rank_of.count(std::string(1, char(b))))
      fail("{}: byte 0x{:02X} is not a token; a byte-level vocabulary needs all 256 bytes", origin, b);

  TokenizerParts parts;
  parts.origin = origin;
  parts.pre = source.pre;
  parts.ignore_merges = true;
  const auto n_ranks = int32_t(by_rank.size());
  uint64_t work = 0;
  for (const auto& [rank, bytes] : by_rank) {
    parts.tokens.push_back(byte_level_spelling(bytes));
    if (bytes.size() < 2) continue;
    const std::vector<std::string> pair = merge_below(bytes, rank, rank_of, work);
    if (work > kMaxMergeWork)
      fail("{}: its long tokens make deriving BPE merges too costly (stopped at rank {} of {}); a tiktoken "
           "vocabulary's tokens are rarely longer than a few hundred bytes",
           origin, rank, by_rank.size());
    if (pair.size() == 2) parts.merges.push_back(byte_level_spelling(pair[0]) + " " + byte_level_spelling(pair[1]));
  }
  parts.token_types.assign(parts.tokens.size(), 1);

  std::string why;
  std::optional<json> config = try_parse_json<json>(config_text, &why);
  if (!config || !config->is_object()) fail("{}: tokenizer_config.json {}", origin, config ? "is not an object" : why);
  if (config->contains("added_tokens_decoder")) {
    const json& added = config->at("added_tokens_decoder");
    if (!added.is_object()) fail("{}: tokenizer_config.json: added_tokens_decoder is not an object", origin);
    for (const auto& [key, entry] : added.items()) {
      int64_t id = -1;
      if (key.empty() || key.size() > 9 || !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
        fail("{}: tokenizer_config.json: added_tokens_decoder key {:?} is not a token id", origin, key);
      id = std::stoll(key);
      const std::string content = token_name(entry);
      if (content.empty()) fail("{}: tokenizer_config.json: added_tokens_decoder[{:?}] has no content", origin, key);
      if (id < n_ranks) fail("{}: special token {:?} has id {}, which is rank {} of the vocabulary", origin, content, id, id);
      if (id >= int64_t(n_ranks) + kMaxSpecialGap)
        fail("{}: special token {:?} has id {}, more than {} past the vocabulary's {} ranks", origin, content, id,
             kMaxSpecialGap, n_ranks);
      while (parts.tokens.size() <= size_t(id)) {
        parts.tokens.push_back(fmt::format("[PAD{}]", parts.tokens.size()));  // as the converter pads
        parts.token_types.push_back(5);
      }
      parts.tokens[size_t(id)] = content;
      parts.token_types[size_t(id)] = entry.is_object() && entry.value("special", true) == false ? 4 : 3;
    }
  }
  auto special_id = [&](const char* key) {
    if (!config->contains(key)) return -1;
    const std::string name = token_name(config->at(key));
    for (size_t id = size_t(n_ranks); id < parts.tokens.size(); ++id)
      if (parts.tokens[id] == name && parts.token_types[id] != 5) return int32_t(id);
    return -1;
  };
  parts.bos_id = special_id("bos_token");
  parts.eos_id = special_id("eos_token");
  const auto flag = [&](const char* key) { return config->contains(key) && config->at(key).is_boolean() && config->at(key).get<bool>(); };
  parts.add_bos = flag("add_bos_token") && parts.bos_id >= 0;
  parts.add_eos = flag("add_eos_token") && parts.eos_id >= 0;
  return from_parts(parts);
}

}  // namespace spill
