// Hugging Face's tokenizer.json (the `tokenizers` library's file), giving the same ids as that
// library for the tokenizers of GPT-NeoX/Pythia, Qwen2/3, SmolLM2, Llama 3 (byte-level BPE) and
// TinyLlama/Llama 2, Gemma (SentencePiece-style BPE with byte fallback). docs/tokenizers.md.
//
//   text -> split out the added tokens (those not `normalized` on the raw text)
//        -> normalizer on each other piece (NFC, NFKC, NFD, NFKD, Replace, Prepend, Sequence)
//        -> split out the `normalized` added tokens
//        -> pre-tokenizer (Split(regex or string, any behavior, invert), ByteLevel, Metaspace,
//           Sequence)
//        -> BPE on each piece (merges by rank; unk_token, fuse_unk, byte_fallback,
//           ignore_merges)
//        -> with add_special: the post-processor's tokens (TemplateProcessing, Roberta/Bert,
//           ByteLevel, Sequence), or tokenizer_config.json's add_bos_token/add_eos_token for
//           the Llama and Gemma tokenizer classes.
// decode applies the decoder (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
// Sequence). A type headlab does not implement is refused naming the field and the type.
#pragma once
#include <memory>
#include <string>

#include "datasets/tokenizer.h"

namespace hl {

class HfTokenizer : public Tokenizer {
 public:
  // From a directory with tokenizer.json (and tokenizer_config.json, if any, for BOS/EOS).
  static HfTokenizer load(const std::string& dir);
  // From the files' contents; `name` names tokenizer.json in messages; config_json may be "".
  static HfTokenizer from_json(const std::string& tokenizer_json, const std::string& name, const std::string& config_json = "",
                               const std::string& config_name = "tokenizer_config.json");

  std::vector<int32_t> encode(std::string_view text, const std::string& what = "text", bool add_special = false) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  int vocab_size() const override;
  bool has_id(int32_t id) const override;
  const std::string& token_bytes(int32_t id) const override;
  const std::vector<std::string>& special_tokens() const override;
  int32_t id_of(const std::string& token) const override;
  int32_t bos_id() const override;
  const std::string& source() const override;
  std::string describe() const override;

  struct Impl;

 private:
  explicit HfTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after loading (copies share it)
};

}  // namespace hl
