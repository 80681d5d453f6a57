// The one tokenizer interface: GPT-2's files (datasets/bpe_tokenizer.h) and Hugging Face's
// tokenizer.json (datasets/hf_tokenizer.h) both implement it, and every user of a tokenizer (the
// text task, --text, the views, Python's hl.Tokenizer and model.to_tokens) takes either.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hl {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text` (valid UTF-8; `what` names it in messages). With add_special, the tokens
  // the tokenizer's files add around a text (BOS/EOS of a post-processor), as Hugging Face's
  // encode(text, add_special_tokens=True) does; GPT-2's adds none.
  virtual std::vector<int32_t> encode(std::string_view text, const std::string& what = "text", bool add_special = false) const = 0;
  // The text of ids as bytes (a UTF-8 string unless the ids cut a character apart); with
  // skip_special, special tokens are left out. Fails for an id outside the vocabulary.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int vocab_size() const = 0;  // the largest id + 1
  virtual bool has_id(int32_t id) const = 0;  // whether the vocabulary gives the id to a token
  // The bytes one token stands for in a text (e.g. " world"; special tokens: their own text).
  virtual const std::string& token_bytes(int32_t id) const = 0;
  // The special tokens' texts (recognised whole in a text, e.g. "<|endoftext|>", "<s>").
  virtual const std::vector<std::string>& special_tokens() const = 0;
  // The id of a vocabulary entry as written in the file (e.g. "Ġworld", "▁world"), or -1.
  virtual int32_t id_of(const std::string& token) const = 0;
  // The token a model's text starts with (TransformerLens's prepend_bos), or -1 for none.
  virtual int32_t bos_id() const = 0;
  virtual const std::string& source() const = 0;  // the directory (or files) it was loaded from
  virtual std::string describe() const = 0;       // its kind and size, for messages and repr

  // token_bytes for display: control characters and bytes that are no whole UTF-8 character
  // escaped ("\n", "\t", "\xf0").
  std::string token_text(int32_t id) const;
};

// UTF-8 helpers shared by the tokenizers: a code point's UTF-8; a string's code points (false
// when it is not valid UTF-8).
std::string utf8_of(uint32_t code_point);
bool code_points(std::string_view s, std::vector<uint32_t>& out);
// Unicode's White_Space characters as the inside of a PCRE2 character class: what Python's
// `regex` and Hugging Face's tokenizers (Oniguruma) mean by \s. PCRE2's own \s leaves out U+0085.
extern const char* const kWhiteSpaceClass;

// Whether `dir` holds a tokenizer's files: tokenizer.json, vocab.json + merges.txt, or
// encoder.json + vocab.bpe.
bool has_tokenizer_files(const std::string& dir);
// The tokenizer of a directory: tokenizer.json (Hugging Face) when there is one, else GPT-2's
// two files. Fails naming the directory and what is missing or wrong.
std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& dir);
// The tokenizer beside a model (a Hugging Face model directory's own files), or null when the
// directory has none: what loading a model directory calls.
std::shared_ptr<const Tokenizer> tokenizer_for_directory(const std::string& dir);
// Fails when `tok` has more tokens than a model's vocabulary of `vocab` (its ids would not embed);
// `named` is what the message calls it ("--tokenizer DIR", "the tokenizer in DIR"). Fewer is
// fine: Hugging Face models often keep spare rows.
void check_tokenizer_fits(const Tokenizer& tok, int64_t vocab, const std::string& named);

// BPE's merge table, shared by GPT-2's files and tokenizer.json: (left id, right id) as
// bpe_pair_key -> (rank, merged id).
using BpeMerges = std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>;
inline uint64_t bpe_pair_key(int32_t a, int32_t b) { return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b); }
// The reference bpe() on one word's symbols: repeatedly merge the adjacent pair of lowest rank
// (every occurrence, left to right), appending the result to out. A heap of candidate pairs
// ordered by (rank, position) merges the same pairs in the same order in O(n log n).
void apply_bpe_merges(const BpeMerges& merges, const std::vector<int32_t>& symbols, std::vector<int32_t>& out);

}  // namespace hl
