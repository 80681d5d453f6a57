// safetensors round trips and one rejection test per reader rule of docs/formats.md.
#define BOOST_TEST_MODULE safetensors
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lib/fileutil.h"
#include "lib/safetensors.h"

using namespace hl;

namespace {
std::string message_of_parse(const std::string& bytes) {
  try {
    parse_safetensors(bytes, "f.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}
// A file from a raw header string and data section.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_is_exact) {
  Rng rng(1);
  Tensor a = Tensor::randn({3, 4}, rng), s = Tensor::scalar(2.5f);
  Ids ids(Shape{2, 3}, {1, -1, 5, 7, 0, 2});
  SafetensorsWriter w;
  w.add("a", a);
  w.add("s", s);
  w.add_ids("ids64", ids, DType::I64);
  w.add_ids("ids32", ids, DType::I32);
  w.set_meta("format", "headlab-checkpoint");
  const std::string path = (std::filesystem::temp_directory_path() / "hl_st_roundtrip.safetensors").string();
  w.write(path);
  SafetensorsFile f = read_safetensors(path);
  BOOST_TEST(f.f32("a").to_vector() == a.to_vector());
  BOOST_TEST(f.f32("a").shape() == a.shape());
  BOOST_TEST(f.f32("s").ndim() == 0);
  BOOST_TEST(f.ids("ids64").data == ids.data);
  BOOST_TEST(f.ids("ids32").data == ids.data);
  BOOST_TEST(f.meta("format") == "headlab-checkpoint");
  BOOST_TEST(std::string(dtype_name(f.get("ids64").dtype)) == "I64");
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(known_bytes_layout) {
  // The header is JSON padded to 8 bytes, data little-endian: 1.0f = 00 00 80 3f.
  SafetensorsWriter w;
  w.add("x", Tensor::from({1}, {1.f}));
  const std::string b = w.serialize();
  const uint64_t n = static_cast<unsigned char>(b[0]);
  BOOST_TEST(n % 8 == 0u);
  BOOST_TEST(b.substr(8, n).find("\"x\":{\"data_offsets\":[0,4],\"dtype\":\"F32\",\"shape\":[1]}") != std::string::npos);
  BOOST_TEST(b.substr(8 + n) == std::string("\x00\x00\x80\x3f", 4));
}

BOOST_AUTO_TEST_CASE(rejects_truncated_length) {
  BOOST_TEST(contains(message_of_parse("abc"), "truncated"));
}
BOOST_AUTO_TEST_CASE(rejects_header_past_end) {
  std::string f = make_file("{}", "");
  f[0] = 100;
  BOOST_TEST(contains(message_of_parse(f), "header length 100 runs past the end of the file"));
}
BOOST_AUTO_TEST_CASE(rejects_invalid_json) {
  BOOST_TEST(contains(message_of_parse(make_file("{\"a\": [1,", "")), "header is not valid JSON"));
}
BOOST_AUTO_TEST_CASE(rejects_unknown_dtype) {
  const std::string h = R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})";
  BOOST_TEST(contains(message_of_parse(make_file(h, std::string(2, '\0'))), "unsupported dtype 'F8_E4M3'"));
}
// Little-endian bytes of 16-bit values.
std::string halves(const std::vector<uint16_t>& v) {
  std::string out;
  for (uint16_t h : v) out += std::string{static_cast<char>(h & 0xff), static_cast<char>(h >> 8)};
  return out;
}
BOOST_AUTO_TEST_CASE(bf16_and_f16_read_as_exact_float32) {
  // bf16: 1.0 = 0x3f80, -2.5 = 0xc020, 0x0001 = 2^-133 (the smallest subnormal), 0x7f80 = +inf. f16: 1.0 = 0x3c00, -2.5 = 0xc100,
  // 65504 = 0x7bff (the largest), 2^-24 = 0x0001 (the smallest subnormal), -0 = 0x8000, 0x7c00 = +inf.
  const std::string h = R"({"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
                        R"("f":{"dtype":"F16","shape":[6],"data_offsets":[8,20]}})";
  const std::string data = halves({0x3f80, 0xc020, 0x0001, 0x7f80}) + halves({0x3c00, 0xc100, 0x7bff, 0x0001, 0x8000, 0x7c00});
  const SafetensorsFile f = parse_safetensors(make_file(h, data), "m.safetensors");
  const std::vector<float> b = f.f32("b").to_vector(), x = f.f32("f").to_vector();
  BOOST_TEST(f.f32("b").shape() == Shape({2, 2}));
  BOOST_TEST(b[0] == 1.f);
  BOOST_TEST(b[1] == -2.5f);
  BOOST_TEST(b[2] == std::ldexp(1.f, -133));
  BOOST_TEST((std::isinf(b[3]) && b[3] > 0));
  BOOST_TEST(x[0] == 1.f);
  BOOST_TEST(x[1] == -2.5f);
  BOOST_TEST(x[2] == 65504.f);
  BOOST_TEST(x[3] == std::ldexp(1.f, -24));
  BOOST_TEST((x[4] == 0.f && std::signbit(x[4])));
  BOOST_TEST((std::isinf(x[5]) && x[5] > 0));
  // every f16 value (NaNs aside) widens to the float that rounds back to it: the exact value
  for (uint32_t v = 0; v < 0x10000; ++v) {
    StTensor t;
    t.dtype = DType::F16;
    t.shape = Shape{1};
    t.bytes = halves({static_cast<uint16_t>(v)});
    float got;
    std::memcpy(&got, as_f32(t, "t", "s").bytes.data(), 4);
    const uint32_t exp = (v >> 10) & 0x1f, mant = v & 0x3ff;
    if (exp == 31) {
      BOOST_TEST((mant ? std::isnan(got) : std::isinf(got)));
      continue;
    }
    const double want = (v & 0x8000 ? -1.0 : 1.0) * (exp ? std::ldexp(1024.0 + mant, static_cast<int>(exp) - 25) : std::ldexp(double(mant), -24));
    if (static_cast<double>(got) != want) BOOST_FAIL("f16 " << v << " read as " << got << ", expected " << want);
  }
}
BOOST_AUTO_TEST_CASE(bf16_with_the_wrong_byte_count_is_refused_naming_the_tensor) {
  const std::string h = R"({"model.embed.weight":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})";
  BOOST_TEST(message_of_parse(make_file(h, std::string(4, '\0'))) ==
             "f.safetensors: not a valid safetensors file: tensor 'model.embed.weight': shape (3) of BF16 needs 6 bytes "
             "but data_offsets span 4");
  BOOST_CHECK_EXCEPTION(parse_safetensors(make_file(R"({"n":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')), "m")
                            .f32("n"),
                        Error, [](const Error& e) { return std::string(e.what()) == "m: tensor 'n' is I32, expected F32, BF16 or F16"; });
}
BOOST_AUTO_TEST_CASE(rejects_offsets_outside_data) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  BOOST_TEST(contains(message_of_parse(make_file(h, std::string(4, '\0'))), "outside the data section"));
}
BOOST_AUTO_TEST_CASE(rejects_overlapping_offsets) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  BOOST_TEST(contains(message_of_parse(make_file(h, std::string(12, '\0'))), "overlap"));
}
BOOST_AUTO_TEST_CASE(rejects_count_size_mismatch) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  BOOST_TEST(contains(message_of_parse(make_file(h, std::string(8, '\0'))), "needs 12 bytes but data_offsets span 8"));
}
BOOST_AUTO_TEST_CASE(rejects_missing_and_wrongly_shaped_tensors) {
  SafetensorsWriter w;
  w.add("a", Tensor::zeros({2, 3}));
  SafetensorsFile f = parse_safetensors(w.serialize(), "m.safetensors");
  BOOST_CHECK_EXCEPTION(f.f32("b"), Error, [](const Error& e) {
    return std::string(e.what()) == "m.safetensors: missing tensor 'b'";
  });
  Shape expect{3, 2};
  BOOST_CHECK_EXCEPTION(f.f32("a", &expect), Error, [](const Error& e) {
    return std::string(e.what()) == "m.safetensors: tensor 'a' has shape (2,3), expected (3,2)";
  });
}
BOOST_AUTO_TEST_CASE(rejects_malformed_entries) {
  BOOST_TEST(contains(message_of_parse(make_file(R"({"a":{"dtype":"F32"}})", "")), "needs dtype, shape and data_offsets"));
  BOOST_TEST(contains(message_of_parse(make_file(R"([1,2])", "")), "not a JSON object"));
  BOOST_TEST(contains(message_of_parse(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "")),
                      "non-negative integers"));
  BOOST_TEST(contains(message_of_parse(make_file(R"({"__metadata__":{"k":1}})", "")), "is not a string"));
}
BOOST_AUTO_TEST_CASE(every_truncation_of_a_valid_file_is_rejected_cleanly) {
  SafetensorsWriter w;
  w.add("a", Tensor::ones({4, 4}));
  w.add("b", Tensor::ones({3}));
  const std::string full = w.serialize();
  for (size_t len = 0; len < full.size(); ++len)
    BOOST_TEST(message_of_parse(full.substr(0, len)) != "(accepted)");
}
BOOST_AUTO_TEST_CASE(missing_file_names_the_path) {
  BOOST_CHECK_EXCEPTION(read_safetensors("/nonexistent/x.safetensors"), Error, [](const Error& e) {
    return contains(e.what(), "/nonexistent/x.safetensors: cannot open");
  });
}
