// GPT-2's byte-level BPE tokenizer: the byte map, the pre-tokenisation pattern, merges by rank on
// a small table worked by hand, special tokens, round trips, and the refusals of bad files and
// bad text. (The comparison with GPT-2's own files and encoder is python/tests/test_tokenizer.py.)
#define BOOST_TEST_MODULE tokenizer
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "datasets/bpe_tokenizer.h"
#include "datasets/task.h"
#include "lib/fileutil.h"
#include "tests/fixtures.h"

using namespace hl;
using hl::test::error_of;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The pieces of GPT-2's pre-tokenisation as strings.
std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out;
  for (std::string_view p : gpt2_pretokenize(text)) out.emplace_back(p);
  return out;
}

// A small vocabulary: byte b's symbol has id b; then the merges below (ids 256..261, ranks 0..5)
// and <|endoftext|> (262).
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"l", "l"}, {"e", "ll"}, {"a", "a"}};

nlohmann::json small_vocab() {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) v[gpt2_byte_symbols()[b]] = b;
  int id = 256;
  for (const auto& [a, b] : kMerges) v[a + b] = id++;
  v["<|endoftext|>"] = id;
  return v;
}

std::string small_merges() {
  std::string m = "#version: 0.2\n";
  for (const auto& [a, b] : kMerges) m += a + " " + b + "\n";
  return m;
}

// A directory holding the small tokenizer under Hugging Face's names.
std::string small_dir(const std::string& name, const std::string& vocab, const std::string& merges) {
  const std::string d = test::fresh_dir(name);
  make_dirs(d);
  write_file_atomic(d + "/vocab.json", vocab);
  write_file_atomic(d + "/merges.txt", merges);
  return d;
}

using IdList = std::vector<int32_t>;

}  // namespace

BOOST_AUTO_TEST_CASE(byte_map_is_gpt2s_and_round_trips_all_256_bytes) {
  const auto& sym = gpt2_byte_symbols();
  std::set<std::string> distinct(sym.begin(), sym.end());
  BOOST_TEST(distinct.size() == 256u);
  BOOST_TEST(sym['A'] == "A");
  BOOST_TEST(sym['!'] == "!");
  BOOST_TEST(sym[0xE9] == "\u00e9");   // printable Latin-1 maps to itself
  BOOST_TEST(sym[0] == "\u0100");      // Ā: the first other byte
  BOOST_TEST(sym[' '] == "\u0120");    // Ġ
  BOOST_TEST(sym['\n'] == "\u010a");   // Ċ
  BOOST_TEST(sym[0x7F] == "\u0121");   // the 34th other byte
  BOOST_TEST(sym[0xAD] == "\u0143");   // soft hyphen: the last other byte
  for (int b = 0; b < 256; ++b) {
    // the symbol is one character whose code point maps back to b
    const unsigned char c0 = static_cast<unsigned char>(sym[b][0]);
    const uint32_t cp = sym[b].size() == 1 ? c0 : (c0 & 0x1F) << 6 | (static_cast<unsigned char>(sym[b][1]) & 0x3F);
    BOOST_TEST(sym[b].size() <= 2u);
    BOOST_TEST(gpt2_byte_of(cp) == b);
  }
  BOOST_TEST(gpt2_byte_of(0x20) == -1);  // a space is not in the alphabet (bytes map to Ġ)
  BOOST_TEST(gpt2_byte_of(0x144) == -1);
  // through a tokenizer: every single byte decodes to itself
  const BpeTokenizer t = BpeTokenizer::from_strings(small_vocab().dump(), small_merges(), "vocab.json", "merges.txt");
  for (int b = 0; b < 256; ++b) BOOST_TEST(t.decode({b}) == std::string(1, static_cast<char>(b)));
}

BOOST_AUTO_TEST_CASE(pretokenisation_follows_gpt2s_pattern) {
  using V = std::vector<std::string>;
  BOOST_TEST(pieces("I'm don't they're we've you'll he'd it's") ==
             (V{"I", "'m", " don", "'t", " they", "'re", " we", "'ve", " you", "'ll", " he", "'d", " it", "'s"}));
  BOOST_TEST(pieces("IT'S") == (V{"IT", "'", "S"}));  // contractions are lower case only
  BOOST_TEST(pieces("a  b") == (V{"a", " ", " b"}));  // a run of spaces leaves the last to the word
  BOOST_TEST(pieces("a b   ") == (V{"a", " b", "   "}));  // trailing spaces: one piece
  BOOST_TEST(pieces("x\n\n y") == (V{"x", "\n\n", " y"}));
  BOOST_TEST(pieces("\t\tif") == (V{"\t", "\t", "if"}));  // only a space (" ?") joins the word
  BOOST_TEST(pieces("123 4567 x1") == (V{"123", " 4567", " x", "1"}));  // digits are not split
  BOOST_TEST(pieces("Hello!!! ...") == (V{"Hello", "!!!", " ..."}));
  BOOST_TEST(pieces("hi 👋🌍 ok") == (V{"hi", " 👋🌍", " ok"}));  // emoji: neither letter nor number
  BOOST_TEST(pieces("café naïve") == (V{"café", " naïve"}));
  BOOST_TEST(pieces("cafe\u0301 x") == (V{"cafe", "\u0301", " x"}));  // a combining accent is not a letter
  BOOST_TEST(pieces("Привет мир") == (V{"Привет", " мир"}));
  BOOST_TEST(pieces("你好世界 ok") == (V{"你好世界", " ok"}));
  BOOST_TEST(pieces("مرحبا بالعالم") == (V{"مرحبا", " بالعالم"}));
  BOOST_TEST(pieces("x²½") == (V{"x", "²½"}));  // \p{N} takes other numbers too
  // \s is Unicode White_Space: U+0085 (NEL) and U+3000 are space, not punctuation
  BOOST_TEST(pieces("x\u0085!") == (V{"x", "\u0085", "!"}));
  BOOST_TEST(pieces("x\u3000\u3000y") == (V{"x", "\u3000", "\u3000", "y"}));
  BOOST_TEST(pieces("").empty());
  // the pieces cover the text
  const std::string mixed = "  Hello,\tworld!  It's 2024... 👋 naïve Привет  \n";
  std::string joined;
  for (const std::string& p : pieces(mixed)) joined += p;
  BOOST_TEST(joined == mixed);
}

BOOST_AUTO_TEST_CASE(merges_apply_lowest_rank_first_as_worked_by_hand) {
  const std::string dir = small_dir("bpe-small", small_vocab().dump(), small_merges());
  const BpeTokenizer t = BpeTokenizer::load(dir);
  BOOST_TEST(t.vocab_size() == 263);
  BOOST_TEST(t.merges() == 6u);
  BOOST_TEST(t.special_tokens() == std::vector<std::string>{"<|endoftext|>"});
  // hello: h e l l o -> (he, rank 1) he l l o -> (ll, rank 3) he ll o; "e ll" (rank 4) never
  // applies, as "e" went into "he" first
  BOOST_TEST(t.encode("hello") == (IdList{257, 259, 'o'}));
  // tell: t e l l -> t e ll -> t ell
  BOOST_TEST(t.encode("tell") == (IdList{'t', 260}));
  // " the": Ġ t h e -> Ġt h e -> Ġt he -> Ġthe
  BOOST_TEST(t.encode(" the") == (IdList{258}));
  // every occurrence of the pair, left to right, without overlap
  BOOST_TEST(t.encode("aaa") == (IdList{261, 'a'}));
  BOOST_TEST(t.encode("aaaa") == (IdList{261, 261}));
  BOOST_TEST(t.encode("hello the") == (IdList{257, 259, 'o', 258}));
  BOOST_TEST(t.encode("a  b") == (IdList{'a', ' ', ' ', 'b'}));  // byte ids: a, Ġ, Ġ b
  // the special token is one id wherever it is, and the text around it is encoded apart
  BOOST_TEST(t.encode("hi<|endoftext|>the") == (IdList{'h', 'i', 262, 't', 257}));
  BOOST_TEST(t.encode("<|endoftext|><|endoftext|>") == (IdList{262, 262}));
  BOOST_TEST(t.encode("<|endoftext") == (IdList{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'}));
  // non-ASCII: the UTF-8 bytes' symbols
  BOOST_TEST(t.encode("é") == (IdList{0xC3, 0xA9}));
  BOOST_TEST(t.encode("") == IdList{});
  // decoding
  BOOST_TEST(t.decode({257, 259, 'o', 258}) == "hello the");
  BOOST_TEST(t.decode({262}) == "<|endoftext|>");
  BOOST_TEST(t.token_text(258) == " the");
  BOOST_TEST(t.token_text('\n') == "\\n");
  BOOST_TEST(t.token_text(0xC3) == "\\xc3");  // half a character
  BOOST_TEST(t.id_of("Ġthe") == 258);
  BOOST_TEST(t.id_of("nope") == -1);
  for (const std::string s : {"hello the", "  tell\n\n aaa  ", "Привет 👋 x²<|endoftext|>café", "a\u0085b\u3000c"})
    BOOST_TEST(t.decode(t.encode(s)) == s);
  // OpenAI's file names load the same tokenizer; a word seen again comes from the cache unchanged
  const std::string openai = test::fresh_dir("bpe-openai");
  make_dirs(openai);
  write_file_atomic(openai + "/encoder.json", small_vocab().dump());
  write_file_atomic(openai + "/vocab.bpe", small_merges());
  const BpeTokenizer o = BpeTokenizer::load(openai);
  for (int i = 0; i < 2; ++i) BOOST_TEST(o.encode("hello the hello") == (IdList{257, 259, 'o', 258, ' ', 257, 259, 'o'}));
}

BOOST_AUTO_TEST_CASE(long_words_merge_as_short_ones) {
  // the heap-ordered merging of one long word gives what merging its copies apart does
  const BpeTokenizer t = BpeTokenizer::from_strings(small_vocab().dump(), small_merges(), "vocab.json", "merges.txt");
  std::string word;
  IdList expect;
  for (int i = 0; i < 200; ++i) word += "hellaaa", expect.insert(expect.end(), {257, 259, 261, 'a'});
  BOOST_TEST(t.encode(word) == expect);
}

BOOST_AUTO_TEST_CASE(bad_files_and_bad_text_are_refused_naming_them) {
  const std::string vocab = small_vocab().dump(), merges = small_merges();
  const std::string empty = test::fresh_dir("bpe-empty");
  make_dirs(empty);
  BOOST_TEST(has(error_of([&] { BpeTokenizer::load(empty); }), empty + ": no tokenizer files (expected vocab.json + merges.txt"));
  BOOST_TEST(has(error_of([&] { BpeTokenizer::load(empty + "/nope"); }), empty + "/nope: not a directory"));
  write_file_atomic(empty + "/vocab.json", vocab);
  BOOST_TEST(has(error_of([&] { BpeTokenizer::load(empty); }), empty + ": has vocab.json but not merges.txt"));

  auto err = [](const std::string& v, const std::string& m) {
    return error_of([&] { BpeTokenizer::from_strings(v, m, "d/vocab.json", "d/merges.txt"); });
  };
  BOOST_TEST(has(err("{\"a\": 1,", merges), "d/vocab.json: not JSON ("));
  BOOST_TEST(has(err("[1, 2]", merges), "d/vocab.json: not a JSON object of token -> id (found a array)"));
  BOOST_TEST(has(err("{\"a\": \"x\"}", merges), "d/vocab.json: the token \"a\" has the id \"x\", not a whole number"));
  BOOST_TEST(has(err("{\"a\": -1}", merges), "d/vocab.json: the token \"a\" has the id -1, outside 0.."));
  BOOST_TEST(has(err("{\"a\": 1, \"b\": 1}", merges), "d/vocab.json: the id 1 is given to both"));
  BOOST_TEST(has(err("{\"a\": 0}", merges), "d/vocab.json: the byte 0x00's symbol \"Ā\" is not in the vocabulary"));
  BOOST_TEST(has(err(vocab, merges + "a\u263a b\n"), "d/merges.txt:8: the symbol \"a☺\" holds '☺' (U+263A), which is not in GPT-2's byte alphabet"));
  BOOST_TEST(has(err(vocab, merges + "x y\n"), "d/merges.txt:8: the merge \"x y\" makes \"xy\", which is not in d/vocab.json"));
  BOOST_TEST(has(err(vocab, merges + "xy\n"), "d/merges.txt:8: expected two symbols separated by one space, got \"xy\""));
  BOOST_TEST(has(err(vocab, merges + "x  y\n"), "d/merges.txt:8: expected two symbols"));
  BOOST_TEST(has(err(vocab, merges + "x \xff\n"), "d/merges.txt:8: not valid UTF-8"));
  BOOST_TEST(has(err(vocab, merges + "xy z\n"), "d/merges.txt:8: the symbol \"xy\" is not in d/vocab.json"));

  const BpeTokenizer t = BpeTokenizer::from_strings(vocab, merges, "vocab.json", "merges.txt");
  BOOST_TEST(error_of([&] { t.decode({5, 263}); }) ==
             "decode: the id 263 at position 1 is not in the vocabulary of vocab.json + merges.txt (ids 0..262)");
  BOOST_TEST(has(error_of([&] { t.decode({-1}); }), "decode: the id -1 at position 0"));
  BOOST_TEST(has(error_of([&] { t.encode("ab\xff" "cd", "--text"); }), "--text: not valid UTF-8 at byte 2 ("));
  BOOST_TEST(has(error_of([&] { t.encode("é<|endoftext|>x\xc3", "--text"); }), "--text: not valid UTF-8 at byte 16 ("));
  BOOST_TEST(has(error_of([&] { t.encode("\xed\xa0\x80"); }), "text: not valid UTF-8 at byte 0"));  // a surrogate
  BOOST_TEST(has(error_of([&] { t.encode("\xc0\xaf"); }), "text: not valid UTF-8 at byte 0"));     // overlong
}

BOOST_AUTO_TEST_CASE(text_task_windows_are_stretches_of_the_files_tokens) {
  const std::string dir = small_dir("bpe-task", small_vocab().dump(), small_merges());
  std::string text;
  for (int i = 0; i < 40; ++i) text += "hello the tell aaa <|endoftext|> ";
  const std::string data = test::temp_path("bpe-task.txt");
  write_file_atomic(data, text);
  TaskConfig c = TaskConfig::preset("text");
  c.data = data, c.tokenizer = dir, c.max_len = 6;
  const std::unique_ptr<Task> task = make_task(c);
  BOOST_TEST(task->vocab_size() == 263);
  BOOST_TEST(task->token_text(258) == " the");
  const IdList all = BpeTokenizer::load(dir).encode(text);
  Rng rng(5);
  const Batch b = task->sample(8, rng);
  for (int64_t r = 0; r < b.size(); ++r) {
    IdList window;
    for (int64_t t = 0; t < 6; ++t) window.push_back(b.inputs.at(r, t));
    window.push_back(b.targets.at(r, 5));
    for (int64_t t = 0; t + 1 < 6; ++t) BOOST_TEST(b.targets.at(r, t) == b.inputs.at(r, t + 1));
    BOOST_TEST((std::search(all.begin(), all.end(), window.begin(), window.end()) != all.end()));
  }
  // the checkpoint's description keeps the tokenizer
  BOOST_TEST(TaskConfig::from_json(c.to_json(), "test").tokenizer == dir);
  TaskConfig copy = TaskConfig::preset("copy");
  copy.tokenizer = dir;
  BOOST_TEST(error_of([&] { copy.validate(); }) == "task copy: --tokenizer is for --task text (language modelling on its tokens)");
}

namespace {
// The ids of `text` with its specials found the slow, obvious way (at each step the earliest
// occurrence of any special, the longest of those starting there), the text between them
// encoded alone: what encode() must give, however it finds the specials.
IdList encode_by_search(const BpeTokenizer& t, const std::string& text) {
  IdList out;
  size_t at = 0;
  for (;;) {
    size_t next = text.size(), len = 0;
    for (const std::string& s : t.special_tokens()) {
      const size_t p = text.find(s, at);
      if (p != std::string::npos && (p < next || (p == next && s.size() > len))) next = p, len = s.size();
    }
    const IdList part = t.encode(text.substr(at, next - at));
    out.insert(out.end(), part.begin(), part.end());
    if (next == text.size()) return out;
    out.push_back(t.id_of(text.substr(next, len)));
    at = next + len;
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(many_specials_are_found_in_linear_time_leftmost_longest) {
  // 4000 specials <|sN|>, each used once: searching for each special in turn took 158 s
  nlohmann::json v = small_vocab();
  int id = 263;
  const int n = 4000;
  for (int i = 0; i < n; ++i) v["<|s" + std::to_string(i) + "|>"] = id++;
  // overlapping ones: a special inside another, one that another extends, one starting inside
  for (const std::string s : {"<|a|>", "<|a|>b|>", "<|<|a|>", "<|s1|>x|>"}) v[s] = id++;
  const BpeTokenizer t = BpeTokenizer::load(small_dir("bpe-many-specials", v.dump(), small_merges()));
  BOOST_TEST(t.special_tokens().size() == static_cast<size_t>(n) + 5);
  std::string text;
  for (int i = 0; i < n; ++i) text += "hello the <|s" + std::to_string(i) + "|>";
  const auto t0 = std::chrono::steady_clock::now();
  const IdList ids = t.encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST(seconds < 5.0);  // about 0.01 s; the search for each special in turn took 158 s
  IdList want;  // "hello the " is he ll o Ġthe Ġ, then the special
  for (int i = 0; i < n; ++i) {
    for (int32_t x : {257, 259, int32_t{'o'}, 258, int32_t{' '}}) want.push_back(x);
    want.push_back(t.id_of("<|s" + std::to_string(i) + "|>"));
  }
  BOOST_TEST(ids == want);
  // the overlapping cases and ordinary text, against the obvious search
  for (const std::string s : {"x<|a|>b|>y", "<|a|>b", "<|<|a|>", "<<|a|>", "<|s1|>x|>", "<|s1|>x", "<|s12|><|s1|>",
                              "<|<|<|s3|>|>", "hello the <|endoftext|>", "<|", "|>", "<|s|>", "é<|s7|>é"})
    BOOST_TEST(t.encode(s) == encode_by_search(t, s), s);
  BOOST_TEST(t.encode(text.substr(0, 2000)) == encode_by_search(t, text.substr(0, 2000)));
}
