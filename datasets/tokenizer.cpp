#include "datasets/tokenizer.h"

#include <cstdio>
#include <queue>
#include <filesystem>

#include "datasets/bpe_tokenizer.h"
#include "datasets/hf_tokenizer.h"
#include "lib/core.h"
#include "lib/fileutil.h"

namespace hl {

const char* const kWhiteSpaceClass =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | cp >> 6), s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | cp >> 12), s += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | cp >> 18), s += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
    s += static_cast<char>(0x80 | (cp >> 6 & 0x3F)), s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

bool code_points(std::string_view s, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) n = 0, cp = c;
    else if (c >= 0xC2 && c < 0xE0) n = 1, cp = c & 0x1F;
    else if (c >= 0xE0 && c < 0xF0) n = 2, cp = c & 0x0F;
    else if (c >= 0xF0 && c < 0xF5) n = 3, cp = c & 0x07;
    else return false;
    if (i + n >= s.size()) return false;  // truncated
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = cp << 6 | (d & 0x3F);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
      return false;
    out.push_back(cp);
    i += n + 1;
  }
  return true;
}

std::string Tokenizer::token_text(int32_t id) const {
  const std::string& b = token_bytes(id);
  std::string out;
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < b.size();) {
    const unsigned char c = static_cast<unsigned char>(b[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c >= 0x80 && i + n <= b.size() && code_points(std::string_view(b).substr(i, n), cps)) {
      out.append(b, i, n);
      i += n;
      continue;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c >= 0x20 && c < 0x7F) out += static_cast<char>(c);
    else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
    ++i;
  }
  return out;
}

bool has_tokenizer_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  const auto has = [&](const char* f) { return file_exists((fs::path(dir) / f).string()); };
  return has("tokenizer.json") || (has("vocab.json") && has("merges.txt")) || (has("encoder.json") && has("vocab.bpe"));
}

std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(dir, ec) && file_exists((fs::path(dir) / "tokenizer.json").string()))
    return std::make_shared<HfTokenizer>(HfTokenizer::load(dir));
  if (fs::is_directory(dir, ec) && !has_tokenizer_files(dir))
    fail(dir, ": no tokenizer files (expected tokenizer.json, as Hugging Face writes it, vocab.json + merges.txt, or "
              "encoder.json + vocab.bpe, as OpenAI names them)");
  return std::make_shared<BpeTokenizer>(BpeTokenizer::load(dir));  // names what is missing
}

void check_tokenizer_fits(const Tokenizer& tok, int64_t vocab, const std::string& named) {
  if (tok.vocab_size() > vocab) fail(named, ": its vocabulary has ", tok.vocab_size(), " tokens, more than the model's ", vocab);
}

std::shared_ptr<const Tokenizer> tokenizer_for_directory(const std::string& dir) {
  return has_tokenizer_files(dir) ? load_tokenizer(dir) : nullptr;
}

void apply_bpe_merges(const BpeMerges& merges, const std::vector<int32_t>& symbols, std::vector<int32_t>& out) {
  struct Sym {
    int32_t id;
    int prev, next;
  };
  std::vector<Sym> s(symbols.size());
  for (size_t i = 0; i < symbols.size(); ++i)
    s[i] = {symbols[i], static_cast<int>(i) - 1, i + 1 < symbols.size() ? static_cast<int>(i) + 1 : -1};
  struct Cand {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || s[pos].next < 0) return;
    const auto it = merges.find(bpe_pair_key(s[pos].id, s[s[pos].next].id));
    if (it != merges.end()) heap.push({it->second.first, pos, s[pos].id, s[s[pos].next].id});
  };
  for (size_t i = 0; i + 1 < s.size(); ++i) push(static_cast<int>(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& left = s[c.pos];
    if (left.id != c.left || left.next < 0 || s[left.next].id != c.right) continue;  // stale
    const int gone = left.next;
    left.id = merges.at(bpe_pair_key(c.left, c.right)).second;
    left.next = s[gone].next;
    if (left.next >= 0) s[left.next].prev = c.pos;
    s[gone].id = -1;
    push(left.prev);
    push(c.pos);
  }
  if (!s.empty())
    for (int i = 0; i >= 0; i = s[i].next) out.push_back(s[i].id);
}

}  // namespace hl
