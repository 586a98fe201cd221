// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2, Llama-3, Qwen2/3,
// DeepSeek-V3, gpt-oss, GLM-4.5), producing the same ids as HF `tokenizers` for the same file; also
// from a GGUF vocabulary (from_parts) or a tiktoken file (from_tiktoken, Kimi-K2).
//
// Encode follows HF's pipeline step by step:
//   1. added tokens with normalized=false are split out of the raw text (leftmost-longest match);
//   2. each remaining piece is normalized (normalizer: null, NFC/NFD/NFKC/NFKD, or a Sequence);
//   3. added tokens with normalized=true are split out of the normalized pieces;
//   4. the pre-tokenizer as declared: Split (Regex or String pattern, any behavior, invert),
//      ByteLevel (add_prefix_space, use_regex with GPT-2's regex), Digits, or a Sequence of them;
//   5. the BPE model: merge ranks, ignore_merges, unk_token/fuse_unk, a bounded word cache.
// Added tokens honour lstrip/rstrip/single_word like HF does; "special" only matters for decode
// (skip_special) and is_special: non-special added tokens are split out of the text too.
//
// Refused with spill::Error naming the file and the field: SentencePiece-style files (Metaspace,
// byte_fallback, Replace/Prepend normalizers, Unigram/WordPiece/WordLevel models), BPE dropout,
// continuing_subword_prefix/end_of_word_suffix, normalizers/pre-tokenizers/decoders outside the
// list above (decode is always byte-level), and token ids above 2^24. truncation and padding are
// ignored (batching options, not text); a post-processor other than ByteLevel, TemplateProcessing,
// Bert/RobertaProcessing or a Sequence of them is refused only by encode(add_special=true).
//
// Known differences from HF, all in corners real chat tokenizers do not reach: regexes run on
// PCRE2 instead of Oniguruma (same syntax for \p{..}, (?i:..), lookahead; Oniguruma's \uHHHH is
// translated, other Oniguruma-only escapes are not), empty regex matches are ignored, and the
// "word character" of single_word is approximated with Unicode categories (L, M, Nd, Nl, Pc).
// Checked against HF tokenizers 0.23 by tests/tokenizer_test.cpp on the fixtures that
// tools/fixtures/make_tokenizer_fixtures.py writes.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/text_span.h"

namespace spill {

// A byte-level BPE tokenizer as a GGUF file lists it (tokenizer.ggml.*), for Tokenizer::from_parts.
struct TokenizerParts {
  std::string origin;                // names the source in error messages
  std::vector<std::string> tokens;   // by id: byte-level spelling ("Ġthe"); control/user-defined tokens as their text
  std::vector<int32_t> token_types;  // by id, GGUF's: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
                                     // 6 byte; empty means all normal
  std::vector<std::string> merges;   // "left right", by rank
  std::string pre;                   // tokenizer.ggml.pre: qwen2, llama-bpe, deepseek-v3, gpt-2, olmo, ...
  int32_t bos_id = -1, eos_id = -1;
  bool add_bos = false, add_eos = false;
  // A piece that is itself a token becomes that token before any merge (tiktoken does this);
  // otherwise the pre-tokenizer's own setting applies.
  bool ignore_merges = false;
};

// A tiktoken vocabulary and what the model's folder says about it, for Tokenizer::from_tiktoken.
struct TiktokenSource {
  std::string_view model_text;   // tiktoken.model: one "<base64 token> <rank>" line per token
  std::string_view config_text;  // tokenizer_config.json: added_tokens_decoder (special tokens), bos/eos
  std::string pre;               // the tokenizer.ggml.pre name of the model's regex (Kimi-K2: "kimi-k2")
  std::string origin;            // names the source in error messages
};

// GPT-2's byte-level spelling of raw bytes, each byte one printable character ("\n" -> "Ċ",
// " the" -> "Ġthe"): how tokenizer.json and tokenizer.ggml.tokens write tokens.
std::string byte_level_spelling(std::string_view bytes);

// Immutable after loading; copies share the loaded tables. All methods are thread-safe.
class Tokenizer {
 public:
  // Reads and validates a tokenizer.json; throws spill::Error naming the file and the problem.
  static Tokenizer from_file(const std::string& path);
  // Same from JSON text already in memory; `origin` names it in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& origin = "tokenizer.json");
  // From a GGUF-style vocabulary (text/tokenizer_parts.cpp): the parts become the tokenizer.json the
  // Hugging Face original has for that pre-tokenizer (its normalizer, Split regexes, ByteLevel step
  // and merges options), so encoding runs the same code as from_file. Control (special) and
  // user-defined tokens become added tokens. Throws spill::Error naming `parts.origin` for an
  // unknown pre-tokenizer or an inconsistent vocabulary.
  static Tokenizer from_parts(const TokenizerParts& parts);
  // From a tiktoken vocabulary (text/tokenizer_tiktoken.cpp). The ranks become BPE merges as
  // llama.cpp's converter makes them, so ids equal tiktoken's. Throws spill::Error naming
  // `source.origin` and the line or field.
  static Tokenizer from_tiktoken(const TiktokenSource& source);

  // Text -> ids. The post-processor is ignored unless add_special: then the tokens its
  // TemplateProcessing (or Bert/Roberta processor) declares around a single sequence are added,
  // e.g. Llama-3's <|begin_of_text|>. Throws spill::Error if the text is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;
  // Same, where `untrusted` (sorted byte ranges of text, e.g. the message content inside a
  // rendered chat prompt) is text a client wrote: no added token marked "special" is matched
  // where it would overlap them, so "<|im_end|>" typed in a message is tokenized as plain text
  // and cannot close the turn. Everything else (non-special added tokens, pre-tokenizer, BPE
  // across the boundaries) is as without spans, so benign text gets exactly HF's ids.
  std::vector<int32_t> encode(std::string_view text, bool add_special, std::span<const TextSpan> untrusted) const;

  // Ids -> text: token bytes through the ByteLevel table, concatenated, invalid UTF-8 replaced
  // by U+FFFD per maximal invalid subsequence (as Rust's from_utf8_lossy does). Added tokens
  // render as their content (normalized=true ones in normalized form, as HF 0.23 does);
  // skip_special drops added tokens marked special. Ids that name no token are skipped, as HF does.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The raw bytes one token decodes to; may be part of a UTF-8 character. "" for unknown ids.
  std::string token_text(int32_t id) const;
  // Exact lookup of an added token's content (e.g. "<|im_end|>") or of a vocab entry in its
  // byte-level spelling (e.g. "Ġthe"). Added tokens win, as in HF.
  std::optional<int32_t> token_id(std::string_view token) const;
  // Max id + 1 over vocab and added tokens (ids may have gaps).
  int32_t vocab_size() const;
  // True for added tokens marked "special" in the file.
  bool is_special(int32_t id) const;

  struct Impl;  // opaque; defined in tokenizer.cpp

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

// Incremental decode for streaming responses: push ids one at a time, get back only complete
// UTF-8 text. Bytes of a character split across tokens are held until it completes; bytes that
// can never form a character are replaced by U+FFFD right away, so the concatenation of all
// push() results and finish() equals Tokenizer::decode of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special = false);
  std::string push(int32_t id);
  // Flushes held bytes (an unfinished character becomes U+FFFD) and starts over.
  std::string finish();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;  // at most 3 bytes: the start of a character still being completed
};

}  // namespace spill
