#include "safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "file_ranges.h"
#include "fileutil.h"

namespace hl {

using json = nlohmann::json;

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

namespace {
size_t dtype_size(DType d) {
  switch (d) {
    case DType::I64: return 8;
    case DType::BF16:
    case DType::F16: return 2;
    default: return 4;
  }
}

// bfloat16 is float32's upper half: shifting it back is exact.
float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// IEEE half -> float: normals and subnormals exactly, infinities and NaNs kept.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero): mant * 2^-24, exact
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const uint32_t bits = sign | (exp == 31 ? (0xffu << 23) | (mant << 13) : ((exp + 112) << 23) | (mant << 13));
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace

namespace {
// A file of `size` bytes read through `read`: the header first, then each tensor's bytes into its
// own buffer, so a file read from disk is never held whole beside its tensors.
SafetensorsFile parse_from(uint64_t size, const ReadRange& read, const std::string& source, const SkipTensor& skip) {
  auto bad = [&](auto&&... why) { fail(source, ": not a valid safetensors file: ", why...); };
  if (size < 8) bad("truncated (", size, " bytes, the 8-byte header length is missing)");
  unsigned char length[8];
  read(0, 8, reinterpret_cast<char*>(length));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > size - 8)
    bad("header length ", n, " runs past the end of the file (", size, " bytes)");
  std::string text(n, '\0');
  read(8, n, text.data());
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    bad("header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) bad("header is not a JSON object");
  const uint64_t data_size = size - 8 - n, data = 8 + n;

  SafetensorsFile f;
  f.source = source;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) bad("__metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__ value '", m.key(), "' is not a string");
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (skip && skip(name)) continue;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      bad("tensor '", name, "' needs dtype, shape and data_offsets");
    StTensor t;
    const json& dt = e["dtype"];
    if (!dt.is_string()) bad("tensor '", name, "': dtype is not a string");
    const std::string d = dt.get<std::string>();
    if (d == "F32") t.dtype = DType::F32;
    else if (d == "I64") t.dtype = DType::I64;
    else if (d == "I32") t.dtype = DType::I32;
    else if (d == "BF16") t.dtype = DType::BF16;
    else if (d == "F16") t.dtype = DType::F16;
    else bad("tensor '", name, "': unsupported dtype '", d, "' (expected F32, BF16, F16, I64 or I32)");
    const json& sh = e["shape"];
    if (!sh.is_array() || sh.size() > kMaxDims) bad("tensor '", name, "': shape must be an array of at most ", kMaxDims, " sizes");
    uint64_t count = 1;
    for (const json& v : sh) {
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
        bad("tensor '", name, "': shape entries must be non-negative integers");
      const uint64_t dim = v.get<uint64_t>();
      if (dim && count > std::numeric_limits<uint64_t>::max() / 16 / dim) bad("tensor '", name, "': shape too large");
      count *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("tensor '", name, "': data_offsets must be two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      bad("tensor '", name, "': data_offsets [", begin, ", ", end, "] outside the data section (",
          data_size, " bytes; the file is truncated or corrupt)");
    if (end - begin != count * dtype_size(t.dtype))
      bad("tensor '", name, "': shape ", t.shape.str(), " of ", d, " needs ",
          count * dtype_size(t.dtype), " bytes but data_offsets span ", end - begin);
    t.bytes.resize(end - begin);
    read(data + begin, end - begin, t.bytes.data());
    ranges.push_back({begin, end});
    f.tensors[name] = std::move(t);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      bad("tensor data ranges overlap (bytes ", ranges[i].first, " to ", ranges[i - 1].second, ")");
  return f;
}

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source, const SkipTensor& skip) {
  return parse_from(bytes.size(), [&](uint64_t offset, uint64_t length, char* to) { std::memcpy(to, bytes.data() + offset, length); },
                    source, skip);
}

SafetensorsFile read_safetensors(const std::string& path, const SkipTensor& skip) {
  SafetensorsFile f;
  read_file_ranges(path, [&](uint64_t size, const ReadRange& read) {
    const double bytes = static_cast<double>(size);  // its tensors, one at a time
    check_fits_in_memory(bytes, path + " (" + format_bytes(bytes) + ")");
    f = parse_from(size, read, path, skip);
  });
  return f;
}

const StTensor& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail(source, ": missing tensor '", name, "'");
  return it->second;
}

namespace {
// t's values as float32 into out (t.shape.numel() floats): F32 copied, BF16/F16 widened exactly;
// an integer tensor is refused naming `name` and `source`.
void widen_into(const StTensor& t, const std::string& name, const std::string& source, float* out) {
  const int64_t n = t.shape.numel();
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    fail(source, ": tensor '", name, "' is ", dtype_name(t.dtype), ", expected F32, BF16 or F16");
  const size_t width = dtype_size(t.dtype);
  if (t.bytes.size() != width * static_cast<size_t>(n))  // parse_safetensors checks this; a hand-made StTensor may not
    fail(source, ": tensor '", name, "' of ", dtype_name(t.dtype), " shape ", t.shape.str(), " needs ", width * n,
         " bytes but holds ", t.bytes.size());
  if (t.dtype == DType::F32) {
    std::memcpy(out, t.bytes.data(), t.bytes.size());
    return;
  }
  const bool bf16 = t.dtype == DType::BF16;
  const char* in = t.bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
}
}  // namespace

StTensor as_f32(const StTensor& t, const std::string& name, const std::string& source) {
  if (t.dtype == DType::F32) return t;
  StTensor out;
  out.dtype = DType::F32;
  out.shape = t.shape;
  out.bytes.resize(static_cast<size_t>(4 * t.shape.numel()));
  widen_into(t, name, source, reinterpret_cast<float*>(out.bytes.data()));
  return out;
}

void SafetensorsFile::f32_into(const std::string& name, const Shape& expect, float* out) const {
  const StTensor& stored = get(name);
  if (expect != stored.shape)
    fail(source, ": tensor '", name, "' has shape ", stored.shape.str(), ", expected ", expect.str());
  widen_into(stored, name, source, out);
}

Tensor SafetensorsFile::f32(const std::string& name, const Shape* expect) const {
  const StTensor& stored = get(name);
  Tensor out = Tensor::empty(stored.shape);
  f32_into(name, expect ? *expect : stored.shape, out.data());
  return out;
}

Ids SafetensorsFile::ids(const std::string& name) const {
  const StTensor& t = get(name);
  Ids out(t.shape);
  const int64_t n = t.shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t v;
    if (t.dtype == DType::I64) {
      std::memcpy(&v, t.bytes.data() + 8 * i, 8);
    } else if (t.dtype == DType::I32) {
      int32_t w;
      std::memcpy(&w, t.bytes.data() + 4 * i, 4);
      v = w;
    } else {
      fail(source, ": tensor '", name, "' is ", dtype_name(t.dtype), ", expected I64 or I32 indices");
    }
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      fail(source, ": tensor '", name, "' value ", v, " does not fit in 32 bits");
    out.data[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return out;
}

std::string SafetensorsFile::meta(const std::string& key) const {
  auto it = metadata.find(key);
  if (it == metadata.end()) fail(source, ": metadata key '", key, "' is missing");
  return it->second;
}

void SafetensorsWriter::add(const std::string& name, const Tensor& t) {
  StTensor e;
  e.dtype = DType::F32;
  e.shape = t.shape();
  e.bytes.assign(reinterpret_cast<const char*>(t.data()), sizeof(float) * t.numel());
  entries_.push_back({name, std::move(e)});
}

void SafetensorsWriter::add_ids(const std::string& name, const Ids& ids, DType dtype) {
  if (dtype == DType::I64) {
    add_i64(name, ids.shape, std::vector<int64_t>(ids.data.begin(), ids.data.end()));
    return;
  }
  StTensor e;
  e.dtype = DType::I32;
  e.shape = ids.shape;
  e.bytes.assign(reinterpret_cast<const char*>(ids.data.data()), 4 * ids.data.size());
  entries_.push_back({name, std::move(e)});
}

void SafetensorsWriter::add_i64(const std::string& name, const Shape& shape,
                                const std::vector<int64_t>& values) {
  HL_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "safetensors: '", name, "' has ",
           values.size(), " values for shape ", shape.str());
  StTensor e;
  e.dtype = DType::I64;
  e.shape = shape;
  e.bytes.assign(reinterpret_cast<const char*>(values.data()), 8 * values.size());
  entries_.push_back({name, std::move(e)});
}

std::string SafetensorsWriter::serialize() const {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, e] : entries_) {
    header[name] = {{"dtype", dtype_name(e.dtype)},
                    {"shape", e.shape.vec()},
                    {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';  // align the data section to 8 bytes
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  for (const auto& [name, e] : entries_) out += e.bytes;
  return out;
}

void SafetensorsWriter::write(const std::string& path) const { write_file_atomic(path, serialize()); }

}  // namespace hl
