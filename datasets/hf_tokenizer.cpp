#include "datasets/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <functional>
#include <tuple>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "datasets/bpe_tokenizer.h"
#include "lib/core.h"
#include "lib/fileutil.h"
#include "lib/stop.h"

namespace hl {

namespace {

using json = nlohmann::json;

// Token ids are 0 .. kMaxTokenId - 1, as everywhere in headlab (a vocabulary of at most 2^24).
constexpr int64_t kMaxTokenId = 1 << 24;

// The byte offset of the first byte that is not valid UTF-8, or npos.
size_t invalid_utf8_at(std::string_view s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + n > s.size() || !code_points(s.substr(i, n), cps)) return i;
    i += n;
  }
  return std::string_view::npos;
}

size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// Whether s[b, e) is one character of Unicode's White_Space (Rust's char::is_whitespace, which
// the library's lstrip/rstrip use): the characters of kWhiteSpaceClass.
bool white_space_at(const std::string& s, size_t b, size_t e) {
  std::vector<uint32_t> cp;
  if (!code_points(std::string_view(s).substr(b, e - b), cp) || cp.size() != 1) return false;
  const uint32_t c = cp[0];
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t at = 0;
  for (size_t p; (p = s.find(from, at)) != std::string::npos; at = p + from.size()) out.append(s, at, p - at), out += to;
  return out.append(s, at, std::string::npos);
}

// A compiled pattern: Oniguruma's (the tokenizers library's) syntax read by PCRE2 in UTF + UCP
// mode, with \s and \S spelled as Unicode's White_Space (Oniguruma's meaning), or a literal.
struct Pattern {
  std::shared_ptr<pcre2_code> re;  // null: literal
  std::string literal;

  static Pattern from_json(const json& p, const std::string& where) {
    Pattern out;
    if (!p.is_object()) fail(where, ": expected {\"String\": ...} or {\"Regex\": ...}, got ", p.dump().substr(0, 80));
    if (p.contains("String") && p["String"].is_string()) {
      out.literal = p["String"].get<std::string>();
      if (out.literal.empty()) fail(where, ": an empty String pattern");
      return out;
    }
    if (!p.contains("Regex") || !p["Regex"].is_string())
      fail(where, ": expected {\"String\": ...} or {\"Regex\": ...}, got ", p.dump().substr(0, 80));
    const std::string src = p["Regex"].get<std::string>(), w = kWhiteSpaceClass;
    std::string pat;
    bool in_class = false;
    for (size_t i = 0; i < src.size(); ++i) {
      const char c = src[i];
      if (c == '\\' && i + 1 < src.size()) {
        const char d = src[++i];
        if (d == 's') pat += in_class ? w : "[" + w + "]";
        else if (d == 'S' && !in_class) pat += "[^" + w + "]";
        else pat += c, pat += d;
        continue;
      }
      if (c == '[' && !in_class) in_class = true;
      else if (c == ']' && in_class) in_class = false;
      pat += c;
    }
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.c_str()), pat.size(), PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(where, ": the regex ", src, " does not compile (", reinterpret_cast<char*>(msg), ")");
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    out.re.reset(code, &pcre2_code_free);
    return out;
  }

  // The [start, end) byte spans of the non-overlapping matches, left to right (find_iter).
  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    if (!re) {
      for (size_t p = s.find(literal); p != std::string_view::npos; p = s.find(literal, p + literal.size()))
        out.emplace_back(p, p + literal.size());
      return out;
    }
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(pcre2_match_data_create_from_pattern(re.get(), nullptr),
                                                                           &pcre2_match_data_free);
    for (size_t at = 0; at <= s.size();) {
      const int rc = pcre2_match(re.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      if (ov[1] == ov[0]) {  // empty: no piece; go on after the next character
        if (ov[0] >= s.size()) break;
        at = ov[0] + utf8_len(static_cast<unsigned char>(s[ov[0]]));
        continue;
      }
      out.emplace_back(ov[0], ov[1]);
      at = ov[1];
    }
    return out;
  }

  std::string replace(const std::string& s, const std::string& content) const {
    std::string out;
    size_t at = 0;
    for (const auto& [b, e] : matches(s)) out.append(s, at, b - at), out += content, at = e;
    return out.append(s, at, std::string::npos);
  }
};

// A piece of the text on its way through the pipeline: its text, the id when it is an added
// token (-1: not yet tokenized), and whether it starts the text (Metaspace's prepend "first").
struct Piece {
  std::string text;
  int32_t id = -1;
  bool at_start = false;
};

enum class NormKind { Nfc, Nfkc, Nfd, Nfkd, Replace, Prepend };
struct NormStep {
  NormKind kind;
  Pattern pattern;
  std::string content;
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
enum class PreKind { Split, ByteLevel, Metaspace };
struct PreStep {
  PreKind kind;
  Pattern pattern;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
  std::string replacement;                          // Metaspace
  std::string prepend = "always";                   // Metaspace: always / first / never
  bool split = true;                                // Metaspace
};

enum class DecKind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace };
struct DecStep {
  DecKind kind;
  Pattern pattern;
  std::string content;  // Replace: the replacement; Strip: the character; Metaspace: the replacement
  int start = 0, stop = 0;
  std::string prepend = "always";
};

struct Added {
  std::string content;
  int32_t id;
  bool special, normalized, lstrip, rstrip;
};

// The spans of `s` split at `matches` (each marked whether it is a match), as the tokenizers
// library's Split pre-tokenizer combines them for each behavior; empty spans dropped.
std::vector<std::pair<size_t, size_t>> split_spans(size_t n, const std::vector<std::pair<size_t, size_t>>& m, Behavior behavior,
                                                   bool invert) {
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> all;
  size_t prev = 0;
  for (const auto& [b, e] : m) {
    if (b > prev) all.push_back({{prev, b}, invert});
    all.push_back({{b, e}, !invert});
    prev = e;
  }
  if (prev < n) all.push_back({{prev, n}, invert});
  std::vector<std::pair<size_t, size_t>> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::Removed:
      for (const auto& [span, is_match] : all)
        if (!is_match) out.push_back(span);
      break;
    case Behavior::Isolated:
      for (const auto& [span, is_match] : all) out.push_back(span);
      break;
    case Behavior::MergedWithPrevious:
      for (const auto& [span, is_match] : all) {
        if (is_match && !previous_match && !out.empty()) out.back().second = span.second;
        else out.push_back(span);
        previous_match = is_match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        if (it->second && !previous_match && !out.empty()) out.back().first = it->first.first;
        else out.push_back(it->first);
        previous_match = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::Contiguous:
      for (size_t i = 0; i < all.size(); ++i) {
        if (i > 0 && all[i].second == previous_match && !out.empty()) out.back().second = all[i].first.second;
        else out.push_back(all[i].first);
        previous_match = all[i].second;
      }
      break;
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const auto& s) { return s.first == s.second; }), out.end());
  return out;
}

std::string icu_normalize(const std::string& s, NormKind kind) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = kind == NormKind::Nfc    ? icu::Normalizer2::getNFCInstance(status)
                              : kind == NormKind::Nfkc ? icu::Normalizer2::getNFKCInstance(status)
                              : kind == NormKind::Nfd  ? icu::Normalizer2::getNFDInstance(status)
                                                       : icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status)) fail("the Unicode normalizer (ICU) is not available: ", u_errorName(status));
  icu::UnicodeString out = n->normalize(icu::UnicodeString::fromUTF8(s), status);
  if (U_FAILURE(status)) fail("Unicode normalization failed: ", u_errorName(status));
  std::string r;
  return out.toUTF8String(r);
}

const json* field(const json& j, const char* name) {
  const auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}
std::string str_field(const json& j, const char* name, const std::string& where, const std::string& dflt = "") {
  const json* f = field(j, name);
  if (!f) return dflt;
  if (!f->is_string()) fail(where, ".", name, ": expected a string, got ", f->dump().substr(0, 60));
  return f->get<std::string>();
}
bool bool_field(const json& j, const char* name, const std::string& where, bool dflt) {
  const json* f = field(j, name);
  if (!f) return dflt;
  if (!f->is_boolean()) fail(where, ".", name, ": expected true or false, got ", f->dump().substr(0, 60));
  return f->get<bool>();
}
std::string type_of(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) fail(where, ": expected an object with a \"type\"");
  return j["type"].get<std::string>();
}

}  // namespace

struct HfTokenizer::Impl {
  std::string source, name;
  std::vector<std::string> token;  // per id: the entry as written
  std::vector<std::string> bytes;  // per id: the bytes it stands for, for display
  std::vector<bool> present, special;
  std::unordered_map<std::string, int32_t> ids;        // model.vocab: what the BPE looks up
  std::unordered_map<std::string, int32_t> all_ids;    // model.vocab and the added tokens
  std::vector<std::string> specials;
  std::vector<Added> added;  // longest first (leftmost-longest matching)
  std::array<std::vector<size_t>, 256> added_by_first;  // per first byte: indices into `added`
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
  std::vector<DecStep> dec;
  bool has_decoder = false;
  // the model: BPE
  BpeMerges merge;  // (left, right) -> (rank, merged)
  size_t merge_count = 0;
  int32_t unk = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<int32_t, 256> fallback_id{};  // <0xXX> tokens' ids (-1: absent)
  // the post-processor: the ids before and after the text (single sequence)
  std::vector<int32_t> before, after;
  int32_t bos = -1;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;


  int32_t id_or(const std::string& t, int32_t dflt) const {
    const auto it = all_ids.find(t);
    return it == all_ids.end() ? dflt : it->second;
  }

  std::string normalize(std::string s) const {
    for (const NormStep& n : norm) {
      switch (n.kind) {
        case NormKind::Replace: s = n.pattern.replace(s, n.content); break;
        case NormKind::Prepend: if (!s.empty()) s = n.content + s; break;
        default: s = icu_normalize(s, n.kind);
      }
    }
    return s;
  }

  // Splits each unencoded piece at the added tokens of the set (normalized or not), leftmost-longest.
  void split_added(std::vector<Piece>& pieces, bool normalized) const {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      if (p.id >= 0) {
        out.push_back(std::move(p));
        continue;
      }
      const std::string& s = p.text;
      size_t from = 0;  // text not yet emitted
      bool at_start = p.at_start;
      for (size_t i = 0; i < s.size();) {
        const Added* hit = nullptr;
        for (size_t k : added_by_first[static_cast<unsigned char>(s[i])]) {  // longest first
          const Added& a = added[k];
          if (a.normalized == normalized && s.compare(i, a.content.size(), a.content) == 0) {
            hit = &a;
            break;
          }
        }
        if (!hit) {
          ++i;
          continue;
        }
        size_t b = i, e = i + hit->content.size();
        if (hit->lstrip)  // the white space before it, back to the text not yet emitted
          for (size_t k = b; k > from;) {
            do --k;
            while (k > from && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80);
            if (!white_space_at(s, k, b)) break;
            b = k;
          }
        if (hit->rstrip)
          while (e < s.size()) {
            const size_t n = std::min(utf8_len(static_cast<unsigned char>(s[e])), s.size() - e);
            if (!white_space_at(s, e, e + n)) break;
            e += n;
          }
        if (b > from) out.push_back({s.substr(from, b - from), -1, at_start});
        out.push_back({hit->content, hit->id, false});
        at_start = false;
        from = i = e;
      }
      if (from < s.size()) out.push_back({s.substr(from), -1, from == 0 ? at_start : false});
    }
    pieces = std::move(out);
  }

  void pre_tokenize(std::vector<Piece>& pieces) const {
    for (const PreStep& step : pre) {
      std::vector<Piece> out;
      for (Piece& p : pieces) {
        if (p.id >= 0) {
          out.push_back(std::move(p));
          continue;
        }
        std::string s = std::move(p.text);
        std::vector<std::pair<size_t, size_t>> spans;
        if (step.kind == PreKind::Split) {
          spans = split_spans(s.size(), step.pattern.matches(s), step.behavior, step.invert);
        } else if (step.kind == PreKind::ByteLevel) {
          if (step.add_prefix_space && !s.empty() && s[0] != ' ') s = " " + s;
          if (step.use_regex) {
            for (std::string_view w : gpt2_pretokenize(s)) spans.emplace_back(static_cast<size_t>(w.data() - s.data()), w.data() - s.data() + w.size());
          } else if (!s.empty()) {
            spans.emplace_back(0, s.size());
          }
          std::string mapped;  // each piece's bytes as the byte alphabet's characters
          std::vector<std::pair<size_t, size_t>> mapped_spans;
          for (const auto& [b, e] : spans) {
            const size_t start = mapped.size();
            for (size_t i = b; i < e; ++i) mapped += gpt2_byte_symbols()[static_cast<unsigned char>(s[i])];
            mapped_spans.emplace_back(start, mapped.size());
          }
          s = std::move(mapped), spans = std::move(mapped_spans);
        } else {  // Metaspace
          s = replace_all(s, " ", step.replacement);
          const bool prepend = step.prepend == "always" || (step.prepend == "first" && p.at_start);
          if (prepend && s.compare(0, step.replacement.size(), step.replacement) != 0) s = step.replacement + s;
          if (step.split) {
            Pattern lit;
            lit.literal = step.replacement;
            spans = split_spans(s.size(), lit.matches(s), Behavior::MergedWithNext, false);
          } else if (!s.empty()) {
            spans.emplace_back(0, s.size());
          }
        }
        for (size_t k = 0; k < spans.size(); ++k)
          out.push_back({s.substr(spans[k].first, spans[k].second - spans[k].first), -1, p.at_start && spans[k].first == 0});
      }
      pieces = std::move(out);
    }
  }

  // The model on one pre-token: its characters as symbols (or their bytes' <0xXX> tokens, or
  // unk), then merges by rank, lowest first, leftmost first among equals.
  void bpe(const std::string& word, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      const auto it = ids.find(word);
      if (it != ids.end()) return out.push_back(it->second), void();
    }
    // As the library's merge_word: unknown characters become one pending unk (several fused
    // into one with fuse_unk), emitted before the next known character or at the end; a byte
    // fallback does not emit it.
    std::vector<int32_t> sym;
    bool pending_unk = false;
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::min(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
      const auto it = ids.find(word.substr(i, n));
      i += n;
      if (it != ids.end()) {
        if (pending_unk) sym.push_back(unk), pending_unk = false;
        sym.push_back(it->second);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (size_t k = i - n; k < i; ++k) all = all && fallback_id[static_cast<unsigned char>(word[k])] >= 0;
        if (all) {
          for (size_t k = i - n; k < i; ++k) sym.push_back(fallback_id[static_cast<unsigned char>(word[k])]);
          continue;
        }
      }
      if (unk >= 0) {
        if (pending_unk && !fuse_unk) sym.push_back(unk);
        pending_unk = true;
      }
    }
    if (pending_unk) sym.push_back(unk);
    apply_bpe_merges(merge, sym, out);
  }

  void encode_word(const std::string& w, std::vector<int32_t>& out) const {
    if (w.size() > 64) return bpe(w, out);
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      const auto it = cache.find(w);
      if (it != cache.end()) return out.insert(out.end(), it->second.begin(), it->second.end()), void();
    }
    std::vector<int32_t> ids_of_word;
    bpe(w, ids_of_word);
    out.insert(out.end(), ids_of_word.begin(), ids_of_word.end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= 100000) cache.clear();
    cache.emplace(w, std::move(ids_of_word));
  }

  // The decoder over the tokens' strings (the tokenizers library's decode_chain, step by step).
  std::string run_decoder(std::vector<std::string> toks, bool for_display) const {
    if (!has_decoder) {
      std::string out;
      for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
      return out;
    }
    for (const DecStep& d : dec) {
      std::vector<std::string> next;
      switch (d.kind) {
        case DecKind::ByteLevel: {
          std::string all;
          std::vector<uint32_t> cps;
          for (const std::string& t : toks) {
            code_points(t, cps);
            std::string b;
            bool ok = true;
            for (uint32_t cp : cps) {
              const int v = gpt2_byte_of(cp);
              if (v < 0) {
                ok = false;
                break;
              }
              b += static_cast<char>(v);
            }
            all += ok ? b : t;
          }
          next.push_back(std::move(all));
          break;
        }
        case DecKind::Replace:
          for (const std::string& t : toks) next.push_back(d.pattern.replace(t, d.content));
          break;
        case DecKind::ByteFallback: {
          std::string run;  // consecutive <0xXX> tokens' bytes
          size_t run_len = 0;
          auto flush = [&] {
            if (run_len == 0) return;
            if (for_display || invalid_utf8_at(run) == std::string::npos) next.push_back(run);
            else
              for (size_t k = 0; k < run_len; ++k) next.push_back("\xEF\xBF\xBD");  // U+FFFD per byte
            run.clear(), run_len = 0;
          };
          for (const std::string& t : toks) {
            if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
                std::isxdigit(static_cast<unsigned char>(t[4]))) {
              run += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)), ++run_len;
              continue;
            }
            flush();
            next.push_back(t);
          }
          flush();
          break;
        }
        case DecKind::Fuse: {
          std::string all;
          for (const std::string& t : toks) all += t;
          next.push_back(std::move(all));
          break;
        }
        case DecKind::Strip:
          if (for_display) return run_decoder_rest(toks);
          for (std::string t : toks) {
            for (int k = 0; k < d.start && t.compare(0, d.content.size(), d.content) == 0; ++k) t.erase(0, d.content.size());
            for (int k = 0; k < d.stop && t.size() >= d.content.size() &&
                            t.compare(t.size() - d.content.size(), d.content.size(), d.content) == 0;
                 ++k)
              t.erase(t.size() - d.content.size());
            next.push_back(std::move(t));
          }
          break;
        case DecKind::Metaspace:  // the replacement is a space, except in the first token, where
                                  // the library drops it (wherever it is) unless prepend is never
          for (size_t i = 0; i < toks.size(); ++i)
            next.push_back(replace_all(toks[i], d.content, !for_display && i == 0 && d.prepend != "never" ? "" : " "));
          break;
      }
      toks = std::move(next);
    }
    return run_decoder_rest(toks);
  }
  static std::string run_decoder_rest(const std::vector<std::string>& toks) {
    std::string out;
    for (const std::string& t : toks) out += t;
    return out;
  }
};

namespace {

void read_normalizer(const json& j, const std::string& where, std::vector<NormStep>& out) {
  const std::string t = type_of(j, where);
  if (t == "Sequence") {
    const json* list = field(j, "normalizers");
    if (!list || !list->is_array()) fail(where, ".normalizers: expected a list");
    for (size_t i = 0; i < list->size(); ++i) read_normalizer((*list)[i], where + ".normalizers[" + std::to_string(i) + "]", out);
  } else if (t == "NFC") out.push_back({NormKind::Nfc, {}, ""});
  else if (t == "NFKC") out.push_back({NormKind::Nfkc, {}, ""});
  else if (t == "NFD") out.push_back({NormKind::Nfd, {}, ""});
  else if (t == "NFKD") out.push_back({NormKind::Nfkd, {}, ""});
  else if (t == "Replace") out.push_back({NormKind::Replace, Pattern::from_json(j.value("pattern", json()), where + ".pattern"), str_field(j, "content", where)});
  else if (t == "Prepend") out.push_back({NormKind::Prepend, {}, str_field(j, "prepend", where)});
  else
    fail(where, ": the normalizer type \"", t, "\" is not supported (headlab reads NFC, NFKC, NFD, NFKD, Replace, Prepend, Sequence)");
}

Behavior behavior_of(const std::string& b, const std::string& where) {
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail(where, ".behavior: \"", b, "\" is not a split behavior (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

std::string prepend_scheme(const json& j, const std::string& where) {
  if (const json* f = field(j, "prepend_scheme")) {
    const std::string s = f->is_string() ? f->get<std::string>() : "";
    if (s != "always" && s != "first" && s != "never") fail(where, ".prepend_scheme: expected always, first or never, got ", f->dump());
    return s;
  }
  return bool_field(j, "add_prefix_space", where, true) ? "always" : "never";  // older files
}

void read_pre_tokenizer(const json& j, const std::string& where, std::vector<PreStep>& out) {
  const std::string t = type_of(j, where);
  PreStep s;
  if (t == "Sequence") {
    const json* list = field(j, "pretokenizers");
    if (!list || !list->is_array()) fail(where, ".pretokenizers: expected a list");
    for (size_t i = 0; i < list->size(); ++i) read_pre_tokenizer((*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]", out);
    return;
  } else if (t == "Split") {
    s.kind = PreKind::Split;
    s.pattern = Pattern::from_json(j.value("pattern", json()), where + ".pattern");
    s.behavior = behavior_of(str_field(j, "behavior", where, "Isolated"), where);
    s.invert = bool_field(j, "invert", where, false);
  } else if (t == "ByteLevel") {
    s.kind = PreKind::ByteLevel;
    s.add_prefix_space = bool_field(j, "add_prefix_space", where, true);
    s.use_regex = bool_field(j, "use_regex", where, true);
  } else if (t == "Metaspace") {
    s.kind = PreKind::Metaspace;
    s.replacement = str_field(j, "replacement", where, "\xE2\x96\x81");
    s.prepend = prepend_scheme(j, where);
    s.split = bool_field(j, "split", where, true);
  } else {
    fail(where, ": the pre-tokenizer type \"", t, "\" is not supported (headlab reads Split, ByteLevel, Metaspace, Sequence)");
  }
  out.push_back(std::move(s));
}

void read_decoder(const json& j, const std::string& where, std::vector<DecStep>& out) {
  const std::string t = type_of(j, where);
  DecStep d;
  if (t == "Sequence") {
    const json* list = field(j, "decoders");
    if (!list || !list->is_array()) fail(where, ".decoders: expected a list");
    for (size_t i = 0; i < list->size(); ++i) read_decoder((*list)[i], where + ".decoders[" + std::to_string(i) + "]", out);
    return;
  } else if (t == "ByteLevel") d.kind = DecKind::ByteLevel;
  else if (t == "ByteFallback") d.kind = DecKind::ByteFallback;
  else if (t == "Fuse") d.kind = DecKind::Fuse;
  else if (t == "Replace") {
    d.kind = DecKind::Replace;
    d.pattern = Pattern::from_json(j.value("pattern", json()), where + ".pattern");
    d.content = str_field(j, "content", where);
  } else if (t == "Strip") {
    d.kind = DecKind::Strip;
    d.content = str_field(j, "content", where, " ");
    d.start = j.value("start", 0), d.stop = j.value("stop", 0);
  } else if (t == "Metaspace") {
    d.kind = DecKind::Metaspace;
    d.content = str_field(j, "replacement", where, "\xE2\x96\x81");
    d.prepend = prepend_scheme(j, where);
  } else {
    fail(where, ": the decoder type \"", t, "\" is not supported (headlab reads ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)");
  }
  out.push_back(std::move(d));
}

}  // namespace

HfTokenizer HfTokenizer::from_json(const std::string& text, const std::string& name, const std::string& config_text,
                                   const std::string& config_name) {
  auto impl = std::make_shared<Impl>();
  Impl& t = *impl;
  t.source = t.name = name;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(name, ": not JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(name, ": not a JSON object (found a ", j.type_name(), ")");
  // ---- the model
  const json* model = field(j, "model");
  if (!model || !model->is_object()) fail(name, ": no \"model\" object");
  const std::string mtype = model->contains("type") ? model->value("type", std::string("?")) : std::string("BPE");
  if (mtype != "BPE")
    fail(name, ": the model type \"", mtype, "\" is not supported (headlab reads BPE tokenizers: byte-level as GPT-NeoX, Qwen2, "
         "Llama 3; SentencePiece-style as Llama 2, Gemma)");
  const std::string m = name + ": model";
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!str_field(*model, f, m).empty()) fail(m, ".", f, ": \"", str_field(*model, f, m), "\" is not supported (headlab reads BPE without it)");
  if (const json* d = field(*model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
    fail(m, ".dropout: ", d->dump(), " is not supported (an encoding with dropout is random)");
  t.fuse_unk = bool_field(*model, "fuse_unk", m, false);
  t.byte_fallback = bool_field(*model, "byte_fallback", m, false);
  t.ignore_merges = bool_field(*model, "ignore_merges", m, false);
  const json* vocab = field(*model, "vocab");
  if (!vocab || !vocab->is_object()) fail(m, ".vocab: expected an object of token -> id");
  if (vocab->empty()) fail(m, ".vocab: the vocabulary is empty");
  int64_t top = -1;
  const auto check_id = [&](const json& id, const std::string& tok, const std::string& where) {
    if (!id.is_number_integer()) fail(where, ": the token \"", tok, "\" has the id ", id.dump(), ", not a whole number");
    const int64_t v = id.get<int64_t>();
    if (v < 0 || v >= kMaxTokenId) fail(where, ": the token \"", tok, "\" has the id ", v, ", outside 0..", kMaxTokenId - 1);
    top = std::max(top, v);
    return v;
  };
  for (const auto& [tok, id] : vocab->items()) check_id(id, tok, m + ".vocab");
  const json* added = field(j, "added_tokens");
  if (added && !added->is_array()) fail(name, ": added_tokens: expected a list");
  if (added)
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      const std::string where = name + ": added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string())
        fail(where, ": expected {\"id\": ..., \"content\": ...}");
      check_id(a["id"], a["content"].get<std::string>(), where);
    }
  const size_t n = static_cast<size_t>(top + 1);
  t.token.resize(n), t.bytes.resize(n), t.present.assign(n, false), t.special.assign(n, false);
  for (const auto& [tok, id] : vocab->items()) {
    const auto v = static_cast<size_t>(id.get<int64_t>());
    if (t.present[v]) fail(m, ".vocab: the id ", v, " is given to both \"", t.token[v], "\" and \"", tok, "\"");
    t.present[v] = true, t.token[v] = tok, t.ids[tok] = t.all_ids[tok] = static_cast<int32_t>(v);
  }
  // ---- the merges: "a b" strings or ["a", "b"] pairs, in rank order
  const json* merges = field(*model, "merges");
  if (merges && !merges->is_array()) fail(m, ".merges: expected a list");
  if (merges)
    for (size_t i = 0; i < merges->size(); ++i) {
      const json& e = (*merges)[i];
      const std::string where = m + ".merges[" + std::to_string(i) + "]";
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail(where, ": \"", s.substr(0, 80), "\" is not two tokens separated by one space");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>(), b = e[1].get<std::string>();
      } else {
        fail(where, ": expected \"a b\" or [\"a\", \"b\"], got ", e.dump().substr(0, 80));
      }
      for (const std::string& part : {a, b})
        if (!t.ids.count(part)) fail(where, ": the token \"", part, "\" is not in model.vocab");
      const auto made = t.ids.find(a + b);
      if (made == t.ids.end()) fail(where, ": the merge \"", a, " ", b, "\" makes \"", a + b, "\", which is not in model.vocab");
      const uint64_t k = bpe_pair_key(t.ids.at(a), t.ids.at(b));
      if (!t.merge.count(k)) t.merge[k] = {static_cast<int32_t>(t.merge_count), made->second};  // the first rank counts
      ++t.merge_count;
    }
  if (const json* u = field(*model, "unk_token")) {
    if (!u->is_string()) fail(m, ".unk_token: expected a string");
    t.unk = t.id_or(u->get<std::string>(), -1);
    if (t.unk < 0) fail(m, ".unk_token: \"", u->get<std::string>(), "\" is not in model.vocab");
  }
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    t.fallback_id[static_cast<size_t>(b)] = t.id_or(buf, -1);
  }
  // ---- added tokens: their own ids; special ones are skipped by decode(skip_special)
  if (added)
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      const std::string where = name + ": added_tokens[" + std::to_string(i) + "]";
      const auto v = static_cast<size_t>(a["id"].get<int64_t>());
      const std::string content = a["content"].get<std::string>();
      if (content.empty()) fail(where, ": an empty token");
      if (bool_field(a, "single_word", where, false)) fail(where, ": single_word is not supported (\"", content, "\")");
      if (t.present[v] && t.token[v] != content)
        fail(where, ": the id ", v, " is \"", content, "\" here but \"", t.token[v], "\" in model.vocab");
      t.present[v] = true, t.token[v] = content, t.all_ids[content] = static_cast<int32_t>(v);
      const bool special = bool_field(a, "special", where, false);
      t.special[v] = special;
      if (special) t.specials.push_back(content);
      t.added.push_back({content, static_cast<int32_t>(v), special, bool_field(a, "normalized", where, !special),
                         bool_field(a, "lstrip", where, false), bool_field(a, "rstrip", where, false)});
    }
  // ---- the pipeline's steps
  if (const json* nz = field(j, "normalizer")) read_normalizer(*nz, name + ": normalizer", t.norm);
  if (const json* pt = field(j, "pre_tokenizer")) read_pre_tokenizer(*pt, name + ": pre_tokenizer", t.pre);
  if (const json* d = field(j, "decoder")) read_decoder(*d, name + ": decoder", t.dec), t.has_decoder = true;
  // a normalized added token is matched in its normalized form
  for (Added& a : t.added)
    if (a.normalized) a.content = t.normalize(a.content);
  std::stable_sort(t.added.begin(), t.added.end(), [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
  for (size_t k = 0; k < t.added.size(); ++k)
    if (!t.added[k].content.empty()) t.added_by_first[static_cast<unsigned char>(t.added[k].content[0])].push_back(k);
  // ---- the post-processor (single sequence): the ids around the text
  std::function<void(const json&, const std::string&)> read_post = [&](const json& p, const std::string& where) {
    const std::string pt = type_of(p, where);
    if (pt == "Sequence") {
      const json* list = field(p, "processors");
      if (!list || !list->is_array()) fail(where, ".processors: expected a list");
      for (size_t i = 0; i < list->size(); ++i) read_post((*list)[i], where + ".processors[" + std::to_string(i) + "]");
    } else if (pt == "ByteLevel") {  // offsets only
    } else if (pt == "TemplateProcessing") {
      const json* single = field(p, "single");
      const json* sp = field(p, "special_tokens");
      if (!single || !single->is_array()) fail(where, ".single: expected a list");
      bool seen_text = false;
      for (const json& item : *single) {
        if (item.contains("Sequence")) {
          seen_text = true;
          continue;
        }
        const std::string id = item.contains("SpecialToken") ? item["SpecialToken"].value("id", std::string()) : "";
        if (id.empty() || !sp || !sp->contains(id) || !(*sp)[id].contains("ids"))
          fail(where, ".single: ", item.dump().substr(0, 80), " is not a special token listed in special_tokens");
        for (const json& v : (*sp)[id]["ids"]) {
          const int32_t x = v.get<int32_t>();
          if (x < 0 || static_cast<size_t>(x) >= t.present.size() || !t.present[static_cast<size_t>(x)])
            fail(where, ".special_tokens.", id, ": the id ", x, " is not in the vocabulary");
          (seen_text ? t.after : t.before).push_back(x);
        }
      }
    } else if (pt == "RobertaProcessing" || pt == "BertProcessing") {
      const json* cls = field(p, "cls");
      const json* sep = field(p, "sep");
      if (!cls || !sep || !cls->is_array() || !sep->is_array() || cls->size() != 2 || sep->size() != 2)
        fail(where, ": expected cls and sep as [token, id]");
      t.before.push_back((*cls)[1].get<int32_t>()), t.after.push_back((*sep)[1].get<int32_t>());
    } else {
      fail(where, ": the post-processor type \"", pt, "\" is not supported (headlab reads TemplateProcessing, ByteLevel, "
           "RobertaProcessing, BertProcessing, Sequence)");
    }
  };
  if (const json* pp = field(j, "post_processor")) read_post(*pp, name + ": post_processor");
  // ---- tokenizer_config.json: add_bos_token / add_eos_token, as transformers' Llama and Gemma
  // tokenizer classes rebuild their post-processor from them; bos_token for prepend_bos
  json cfg;
  if (!config_text.empty()) {
    try {
      cfg = json::parse(config_text);
    } catch (const json::exception& e) {
      fail(config_name, ": not JSON (", e.what(), ")");
    }
  }
  const auto config_token = [&](const char* key) -> int32_t {
    if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return -1;
    const json& v = cfg[key];
    const std::string s = v.is_string() ? v.get<std::string>() : v.is_object() ? v.value("content", std::string()) : "";
    const int32_t id = t.id_or(s, -1);
    if (id < 0) fail(config_name, ": ", key, " \"", s, "\" is not in the vocabulary of ", name);
    return id;
  };
  // only the tokenizer classes that rebuild their post-processor from the flags read them
  const std::string cls = cfg.is_object() && cfg.contains("tokenizer_class") && cfg["tokenizer_class"].is_string()
                              ? cfg["tokenizer_class"].get<std::string>() : "";
  if (cls.rfind("Llama", 0) == 0 || cls.rfind("CodeLlama", 0) == 0 || cls.rfind("Gemma", 0) == 0) {
    for (const auto& [flag, key, ids] : {std::tuple{"add_bos_token", "bos_token", &t.before}, std::tuple{"add_eos_token", "eos_token", &t.after}}) {
      if (!cfg.contains(flag) || !cfg[flag].is_boolean()) continue;
      ids->clear();
      if (cfg[flag].get<bool>()) {
        const int32_t id = config_token(key);
        if (id < 0) fail(config_name, ": ", flag, " is true but ", key, " is not given");
        ids->push_back(id);
      }
    }
  }
  t.bos = !t.before.empty() ? t.before.front() : config_token("bos_token");
  // ---- each token's bytes, for display: the decoder on the token alone, not stripping spaces
  for (size_t v = 0; v < n; ++v) {
    if (!t.present[v]) continue;
    const bool is_added = std::any_of(t.added.begin(), t.added.end(), [&](const Added& a) { return a.id == static_cast<int32_t>(v); });
    t.bytes[v] = is_added ? t.token[v] : t.run_decoder({t.token[v]}, true);
  }
  return HfTokenizer(std::move(impl));
}

HfTokenizer HfTokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "tokenizer.json").string(), cfg = (fs::path(dir) / "tokenizer_config.json").string();
  HfTokenizer tok = from_json(read_file(path), path, file_exists(cfg) ? read_file(cfg) : "", cfg);
  std::const_pointer_cast<Impl>(tok.impl_)->source = dir;
  return tok;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, const std::string& what, bool add_special) const {
  const Impl& t = *impl_;
  if (const size_t bad = invalid_utf8_at(text); bad != std::string_view::npos) fail(what, ": not valid UTF-8 at byte ", bad);
  std::vector<Piece> pieces{{std::string(text), -1, true}};
  t.split_added(pieces, false);
  for (Piece& p : pieces)
    if (p.id < 0) p.text = t.normalize(p.text);
  t.split_added(pieces, true);
  t.pre_tokenize(pieces);
  std::vector<int32_t> out;
  if (add_special) out = t.before;
  size_t since_check = 0;
  for (const Piece& p : pieces) {
    if (++since_check == 4096) since_check = 0, throw_if_stopped();
    if (p.id >= 0) out.push_back(p.id);
    else if (!p.text.empty()) t.encode_word(p.text, out);
  }
  if (add_special) out.insert(out.end(), t.after.begin(), t.after.end());
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> toks;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!has_id(ids[i]))
      fail("decode: the id ", ids[i], " at position ", i, " is not in the vocabulary of ", impl_->source, " (ids 0..", vocab_size() - 1, ")");
    if (skip_special && impl_->special[static_cast<size_t>(ids[i])]) continue;
    toks.push_back(impl_->token[static_cast<size_t>(ids[i])]);
  }
  return impl_->run_decoder(std::move(toks), false);
}

int HfTokenizer::vocab_size() const { return static_cast<int>(impl_->token.size()); }
bool HfTokenizer::has_id(int32_t id) const { return id >= 0 && id < vocab_size() && impl_->present[static_cast<size_t>(id)]; }
const std::string& HfTokenizer::token_bytes(int32_t id) const {
  if (!has_id(id)) fail("token ", id, " is not in the vocabulary of ", impl_->source, " (ids 0..", vocab_size() - 1, ")");
  return impl_->bytes[static_cast<size_t>(id)];
}
const std::vector<std::string>& HfTokenizer::special_tokens() const { return impl_->specials; }
int32_t HfTokenizer::id_of(const std::string& token) const { return impl_->id_or(token, -1); }
int32_t HfTokenizer::bos_id() const { return impl_->bos; }
const std::string& HfTokenizer::source() const { return impl_->source; }
std::string HfTokenizer::describe() const {
  return "tokenizer.json BPE, " + std::to_string(vocab_size()) + " tokens, " + std::to_string(impl_->merge_count) + " merges";
}

}  // namespace hl
