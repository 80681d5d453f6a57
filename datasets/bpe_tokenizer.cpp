#include "datasets/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "lib/core.h"
#include "lib/fileutil.h"
#include "lib/stop.h"

namespace hl {

namespace {

// Token ids are 0 .. kMaxTokenId - 1, as everywhere in headlab (a vocabulary of at most 2^24).
constexpr int64_t kMaxTokenId = 1 << 24;

// The symbols' vocabulary entries as bytes: each character of the byte alphabet back to its byte;
// false when some character is not in the alphabet.
bool alphabet_bytes(const std::vector<uint32_t>& cps, std::string& out) {
  out.clear();
  for (uint32_t cp : cps) {
    const int b = gpt2_byte_of(cp);
    if (b < 0) return false;
    out += static_cast<char>(b);
  }
  return true;
}

// The first character of `s` outside the byte alphabet, for messages.
std::string first_outside_alphabet(const std::vector<uint32_t>& cps) {
  for (uint32_t cp : cps)
    if (gpt2_byte_of(cp) < 0) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "U+%04X", cp);
      return "'" + utf8_of(cp) + "' (" + buf + ")";
    }
  return "";
}

const pcre2_code* gpt2_pattern() {
  static const pcre2_code* code = [] {
    const std::string w = kWhiteSpaceClass;  // \s as Unicode's White_Space
    const std::string pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + w + "\\p{L}\\p{N}]+|[" + w + "]+(?![^" + w +
                                "])|[" + w + "]+";
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                                  &at, nullptr);
    if (!c) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("GPT-2's pre-tokenisation pattern does not compile in PCRE2 at ", at, ": ", reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // faster when the platform has a JIT; else interpreted
    return c;
  }();
  return code;
}

// Appends the pieces of `text` (which starts at byte `base` of the whole text) to `out`.
void pretokenize_into(std::string_view text, size_t base, const std::string& what, std::vector<std::string_view>& out) {
  if (text.empty()) return;
  const pcre2_code* re = gpt2_pattern();
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(pcre2_match_data_create_from_pattern(re, nullptr),
                                                                         &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  uint32_t options = 0;  // the first match checks the whole subject is UTF-8; the others need not
  for (size_t at = 0; at < text.size();) {
    const int rc = pcre2_match(re, subject, text.size(), at, options, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
        fail(what, ": not valid UTF-8 at byte ", base + pcre2_get_startchar(md.get()), " (", reinterpret_cast<char*>(msg), ")");
      fail(what, ": pre-tokenisation failed at byte ", base + at, " (", reinterpret_cast<char*>(msg), ")");
    }
    options = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[1] <= ov[0]) break;  // no alternative matches empty; guard against looping anyway
    out.push_back(text.substr(ov[0], ov[1] - ov[0]));
    at = ov[1];
  }
}

}  // namespace

const std::array<std::string, 256>& gpt2_byte_symbols() {
  static const std::array<std::string, 256> symbols = [] {
    std::array<std::string, 256> s;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      s[b] = utf8_of(printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
    }
    return s;
  }();
  return symbols;
}

int gpt2_byte_of(uint32_t cp) {
  static const std::unordered_map<uint32_t, int> inverse = [] {
    std::unordered_map<uint32_t, int> m;
    std::vector<uint32_t> cps;
    for (int b = 0; b < 256; ++b) {
      code_points(gpt2_byte_symbols()[b], cps);
      m[cps.at(0)] = b;
    }
    return m;
  }();
  const auto it = inverse.find(cp);
  return it == inverse.end() ? -1 : it->second;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text, const std::string& what) {
  std::vector<std::string_view> out;
  pretokenize_into(text, 0, what, out);
  return out;
}

struct BpeTokenizer::Impl {
  std::string source;
  std::vector<std::string> bytes;       // per id: the bytes it stands for
  std::vector<bool> present;            // per id: whether the vocabulary has it
  std::unordered_map<std::string, int32_t> ids;  // vocabulary entry as written -> id
  std::array<int32_t, 256> byte_id{};   // each byte's symbol's id
  // (left id, right id) -> (rank, merged id)
  BpeMerges merge;
  size_t merge_count = 0;
  std::vector<std::string> specials;
  std::vector<int32_t> special_ids;
  // The specials as a trie over their bytes: node 0 is the root; (node << 8 | byte) -> child;
  // special_at[node] is the special that ends there (-1: none). Finding the next special walks
  // the trie from each "<|" once, so a text costs its length times the longest special's, not
  // the number of specials times the text (which made many specials cubic).
  std::unordered_map<uint64_t, int32_t> special_trie;
  std::vector<int32_t> special_at{-1};

  void add_special(const std::string& s, size_t index) {
    int32_t node = 0;
    for (unsigned char c : s) {
      const auto [it, added] = special_trie.try_emplace(static_cast<uint64_t>(node) << 8 | c, static_cast<int32_t>(special_at.size()));
      if (added) special_at.push_back(-1);
      node = it->second;
    }
    special_at[static_cast<size_t>(node)] = static_cast<int32_t>(index);
  }

  // The longest special that starts at `p` (-1: none).
  int32_t special_starting_at(std::string_view text, size_t p) const {
    int32_t node = 0, found = -1;
    for (size_t i = p; i < text.size(); ++i) {
      const auto it = special_trie.find(static_cast<uint64_t>(node) << 8 | static_cast<unsigned char>(text[i]));
      if (it == special_trie.end()) break;
      node = it->second;
      if (special_at[static_cast<size_t>(node)] >= 0) found = special_at[static_cast<size_t>(node)];
    }
    return found;
  }
  // words already encoded (cleared when full); encode() is const and may run on several threads
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // BPE on one word's bytes (apply_bpe_merges)
  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    std::vector<int32_t> symbols(word.size());
    for (size_t i = 0; i < word.size(); ++i) symbols[i] = byte_id[static_cast<unsigned char>(word[i])];
    apply_bpe_merges(merge, symbols, out);
  }

  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.size() > 64) return bpe(word, out);  // long words are rare: not worth caching
    const std::string w(word);
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      const auto it = cache.find(w);
      if (it != cache.end()) return out.insert(out.end(), it->second.begin(), it->second.end()), void();
    }
    std::vector<int32_t> ids_of_word;
    bpe(word, ids_of_word);
    out.insert(out.end(), ids_of_word.begin(), ids_of_word.end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= 100000) cache.clear();
    cache.emplace(w, std::move(ids_of_word));
  }
};

BpeTokenizer BpeTokenizer::from_strings(const std::string& vocab_json, const std::string& merges_text,
                                        const std::string& vocab_name, const std::string& merges_name,
                                        const std::string& source) {
  auto impl = std::make_shared<Impl>();
  Impl& t = *impl;
  t.source = source.empty() ? vocab_name + " + " + merges_name : source;
  // ---- the vocabulary: {"token": id, ...}
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(vocab_json);
  } catch (const nlohmann::json::exception& e) {
    fail(vocab_name, ": not JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(vocab_name, ": not a JSON object of token -> id (found a ", j.type_name(), ")");
  if (j.empty()) fail(vocab_name, ": the vocabulary is empty");
  int64_t top = -1;
  for (const auto& [token, id] : j.items()) {
    if (!id.is_number_integer())
      fail(vocab_name, ": the token \"", token, "\" has the id ", id.dump(), ", not a whole number (expected token -> id)");
    const int64_t v = id.get<int64_t>();
    if (v < 0 || v >= kMaxTokenId) fail(vocab_name, ": the token \"", token, "\" has the id ", v, ", outside 0..", kMaxTokenId - 1);
    if (token.empty()) fail(vocab_name, ": an empty token (id ", v, ")");
    top = std::max(top, v);
  }
  t.bytes.resize(static_cast<size_t>(top + 1));
  t.present.assign(static_cast<size_t>(top + 1), false);
  std::vector<uint32_t> cps;
  std::vector<std::string> text_of(static_cast<size_t>(top + 1));
  for (const auto& [token, id] : j.items()) {
    const auto v = static_cast<size_t>(id.get<int64_t>());
    if (t.present[v]) fail(vocab_name, ": the id ", v, " is given to both \"", text_of[v], "\" and \"", token, "\"");
    t.present[v] = true;
    text_of[v] = token;
    t.ids[token] = static_cast<int32_t>(v);
    code_points(token, cps);  // JSON strings are valid UTF-8
    // an entry outside the byte alphabet (an added token) stands for its own text
    if (!alphabet_bytes(cps, t.bytes[v])) t.bytes[v] = token;
  }
  const auto& symbols = gpt2_byte_symbols();
  for (int b = 0; b < 256; ++b) {
    const auto it = t.ids.find(symbols[b]);
    if (it == t.ids.end()) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "0x%02x", b);
      fail(vocab_name, ": the byte ", buf, "'s symbol \"", symbols[b], "\" is not in the vocabulary (a byte-level vocabulary has all 256)");
    }
    t.byte_id[b] = it->second;
  }
  // ---- the merges: an optional "#version" line, then "a b" per line, in rank order
  std::vector<bool> made(t.bytes.size(), false);
  size_t start = 0;
  int lineno = 0;
  int32_t rank = 0;
  while (start < merges_text.size()) {
    size_t end = merges_text.find('\n', start);
    if (end == std::string::npos) end = merges_text.size();
    std::string line = merges_text.substr(start, end - start);
    start = end + 1;
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() || line.find(' ', sp + 1) != std::string::npos)
      fail(merges_name, ":", lineno, ": expected two symbols separated by one space, got \"", line.substr(0, 80), "\"");
    const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    std::string scratch;
    for (const std::string& part : {a, b}) {
      if (!code_points(part, cps)) fail(merges_name, ":", lineno, ": not valid UTF-8");
      if (!alphabet_bytes(cps, scratch))
        fail(merges_name, ":", lineno, ": the symbol \"", part, "\" holds ", first_outside_alphabet(cps),
             ", which is not in GPT-2's byte alphabet");
      if (!t.ids.count(part)) fail(merges_name, ":", lineno, ": the symbol \"", part, "\" is not in ", vocab_name);
    }
    const auto result = t.ids.find(a + b);
    if (result == t.ids.end())
      fail(merges_name, ":", lineno, ": the merge \"", a, " ", b, "\" makes \"", a + b, "\", which is not in ", vocab_name);
    // a repeated pair keeps its last rank, as in the reference (a dict built from the list)
    t.merge[bpe_pair_key(t.ids.at(a), t.ids.at(b))] = {rank++, result->second};
    made[static_cast<size_t>(result->second)] = true;
  }
  t.merge_count = static_cast<size_t>(rank);
  // ---- special tokens: "<|...|>" entries that no byte and no merge makes
  for (size_t v = 0; v < t.bytes.size(); ++v) {
    const std::string& s = text_of[v];
    if (!t.present[v] || made[v] || s.size() < 5 || s.rfind("<|", 0) != 0 || s.compare(s.size() - 2, 2, "|>") != 0) continue;
    t.add_special(s, t.specials.size());
    t.specials.push_back(s);
    t.special_ids.push_back(static_cast<int32_t>(v));
    t.bytes[v] = s;
  }
  return BpeTokenizer(std::move(impl));
}

BpeTokenizer BpeTokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(dir, ": not a directory (give a tokenizer directory with vocab.json + merges.txt, or encoder.json + vocab.bpe)");
  for (const auto& [vocab, merges] : {std::pair<std::string, std::string>{"vocab.json", "merges.txt"}, {"encoder.json", "vocab.bpe"}}) {
    const std::string v = (fs::path(dir) / vocab).string(), m = (fs::path(dir) / merges).string();
    const bool hv = file_exists(v), hm = file_exists(m);
    if (hv && hm) {
      return from_strings(read_file(v), read_file(m), v, m, dir);
    }
    if (hv || hm) fail(dir, ": has ", hv ? vocab : merges, " but not ", hv ? merges : vocab, " (the tokenizer needs both)");
  }
  fail(dir, ": no tokenizer files (expected vocab.json + merges.txt, as Hugging Face names them, or encoder.json + vocab.bpe, "
            "as OpenAI does)");
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, const std::string& what, bool /*add_special: GPT-2 adds none*/) const {
  const Impl& t = *impl_;
  std::vector<int32_t> out;
  std::vector<std::string_view> words;
  size_t at = 0, since_check = 0;
  while (at <= text.size()) {
    // the next special token (the longest of those starting first), or the end of the text
    size_t next = text.size(), which = 0, len = 0;
    if (!t.specials.empty()) {  // every special starts with "<|"
      for (size_t p = text.find("<|", at); p != std::string_view::npos; p = text.find("<|", p + 1)) {
        const int32_t k = t.special_starting_at(text, p);
        if (k < 0) continue;
        next = p, which = static_cast<size_t>(k), len = t.specials[static_cast<size_t>(k)].size();
        break;
      }
    }
    words.clear();
    pretokenize_into(text.substr(at, next - at), at, what, words);
    for (std::string_view w : words) {
      if (++since_check == 4096) since_check = 0, throw_if_stopped();  // a long text stops on Ctrl-C
      t.encode_word(w, out);
    }
    if (next == text.size()) break;
    out.push_back(t.special_ids[which]);
    at = next + len;
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (!has_id(id))
      fail("decode: the id ", id, " at position ", i, " is not in the vocabulary of ", impl_->source, " (ids 0..", vocab_size() - 1, ")");
    if (skip_special && std::find(impl_->special_ids.begin(), impl_->special_ids.end(), id) != impl_->special_ids.end()) continue;
    out += impl_->bytes[static_cast<size_t>(id)];
  }
  return out;
}

int BpeTokenizer::vocab_size() const { return static_cast<int>(impl_->bytes.size()); }

bool BpeTokenizer::has_id(int32_t id) const { return id >= 0 && id < vocab_size() && impl_->present[static_cast<size_t>(id)]; }

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  if (!has_id(id))
    fail("token ", id, " is not in the vocabulary of ", impl_->source, " (ids 0..", vocab_size() - 1, ")");
  return impl_->bytes[static_cast<size_t>(id)];
}

const std::vector<std::string>& BpeTokenizer::special_tokens() const { return impl_->specials; }

int32_t BpeTokenizer::id_of(const std::string& token) const {
  const auto it = impl_->ids.find(token);
  return it == impl_->ids.end() ? -1 : it->second;
}

int32_t BpeTokenizer::bos_id() const { return id_of("<|endoftext|>"); }

std::string BpeTokenizer::describe() const {
  return "GPT-2 byte-level BPE, " + std::to_string(vocab_size()) + " tokens, " + std::to_string(merges()) + " merges";
}

size_t BpeTokenizer::merges() const { return impl_->merge_count; }
const std::string& BpeTokenizer::source() const { return impl_->source; }

}  // namespace hl
