// Hugging Face GPT-2 in and out (models/hf_gpt2.h): export then read gives the same model bit for
// bit, the layouts' transpositions are the documented ones, and the reader refuses what it cannot
// represent naming the field. The comparison with an independent PyTorch forward is
// python/tests/test_interop.py.
#define BOOST_TEST_MODULE interop
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <functional>
#include <filesystem>

#include "fixtures.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "models/hf_gpt2.h"

using namespace hl;
using hl::test::error_of;
using hl::test::test_model;
using hl::test::temp_path;

namespace {
ModelConfig gpt2_like() {
  return test_model({.vocab = 17, .d_model = 12, .heads = 3, .d_ff = 20, .max_seq_len = 9, .attn_bias = true});
}
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(float) * a.numel()) == 0;
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

BOOST_AUTO_TEST_CASE(export_then_read_is_bit_exact_and_transposes) {
  TransformerLM m(gpt2_like(), 4);
  m.head.weight.copy_from(m.tok_emb.weight);  // tied
  const std::string dir = temp_path("hf_gpt2_roundtrip");
  std::filesystem::remove_all(dir);
  BOOST_TEST(write_hf_gpt2(m, dir));  // tied: no lm_head.weight
  const SafetensorsFile hf = read_safetensors(dir + "/model.safetensors");
  BOOST_TEST(!hf.has("lm_head.weight"));
  // c_attn (d, 3d): column d + 5 is row 5 of W_K
  const Tensor qkv = hf.f32("transformer.h.1.attn.c_attn.weight");
  const Tensor wk = m.blocks[1]->attn.W_K.weight;
  for (int64_t i = 0; i < 12; ++i) BOOST_TEST(qkv.data()[i * 36 + 12 + 5] == wk.data()[5 * 12 + i]);
  auto loaded = load_model(dir);
  BOOST_TEST(loaded->cfg.to_json() == m.cfg.to_json());
  auto a = m.named_parameters(), b = loaded->named_parameters();
  BOOST_REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) BOOST_TEST(same_bits(a[i].second, b[i].second), a[i].first);
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(config_refusals_name_the_field) {
  const std::string base = R"({"vocab_size": 5, "n_positions": 4, "n_embd": 6, "n_layer": 1, "n_head": 2)";
  BOOST_TEST(hf_gpt2_config(base + "}", "c").d_ff == 24);
  BOOST_TEST(contains(error_of([&] { hf_gpt2_config(base + R"(, "activation_function": "silu"})", "c"); }), "activation_function"));
  BOOST_TEST(contains(error_of([&] { hf_gpt2_config(base + R"(, "scale_attn_by_inverse_layer_idx": true})", "c"); }),
                      "scale_attn_by_inverse_layer_idx"));
  BOOST_TEST(contains(error_of([&] { hf_gpt2_config(R"({"vocab_size": 5})", "c"); }), "'n_positions' is missing"));
  BOOST_TEST(contains(error_of([&] { hf_gpt2_config("[1", "c"); }), "not valid JSON"));
}

BOOST_AUTO_TEST_CASE(export_refuses_post_norm) {
  ModelConfig c = gpt2_like();
  c.norm = Norm::Post;
  TransformerLM m(c, 1);
  const std::string dir = temp_path("hf_gpt2_refused");
  std::filesystem::remove_all(dir);
  BOOST_TEST(contains(error_of([&] { write_hf_gpt2(m, dir); }), "post-norm"));
  BOOST_TEST(!std::filesystem::exists(dir));
}

BOOST_AUTO_TEST_CASE(skipped_tensors_are_not_read) {
  SafetensorsWriter w;
  w.add("h.0.attn.bias", Tensor::zeros(Shape{2, 2}));
  w.add("wte.weight", Tensor::zeros(Shape{3}));
  std::string bytes = w.serialize();
  // corrupt the skipped entry's dtype: the reader never looks at it
  const size_t at = bytes.find("\"F32\"");
  bytes.replace(at, 5, "\"U8\" ");
  const SafetensorsFile f = parse_safetensors(bytes, "f", [](const std::string& n) { return n == "h.0.attn.bias"; });
  BOOST_TEST(!f.has("h.0.attn.bias"));
  BOOST_TEST(f.has("wte.weight"));
}
