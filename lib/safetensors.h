// safetensors reader and writer (format in docs/formats.md):
//   u64 little-endian N | N bytes of JSON header | raw little-endian C-contiguous data.
// The reader validates everything a corrupt or truncated file can get wrong and throws an
// hl::Error naming the file and the problem; it never reads out of bounds.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ops.h"
#include "tensor.h"

namespace hl {

// BF16 and F16 are read (Hugging Face checkpoints are stored in them) and converted to F32
// exactly (every bfloat16 and float16 value is a float32 value); they are never written.
enum class DType { F32, I64, I32, BF16, F16 };
const char* dtype_name(DType d);

struct StTensor {
  DType dtype = DType::F32;
  Shape shape;
  std::string bytes;  // raw little-endian data
};

class SafetensorsFile {
 public:
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string source;  // file name, for messages

  bool has(const std::string& name) const { return tensors.count(name) > 0; }
  const StTensor& get(const std::string& name) const;  // throws if missing
  // F32 tensor (a BF16 or F16 one converted exactly); with `expect` given, a different shape is
  // an error naming both shapes.
  Tensor f32(const std::string& name, const Shape* expect = nullptr) const;
  // The same values written straight into `out` (numel of `expect` floats, e.g. a model's
  // parameter): no tensor in between, a BF16/F16 tensor widened on the way; a different shape is
  // the same error as f32's.
  void f32_into(const std::string& name, const Shape& expect, float* out) const;
  Ids ids(const std::string& name) const;  // I64 or I32, values must fit in int32
  std::string meta(const std::string& key) const;  // throws if missing
};

// t as F32: itself, or a BF16/F16 tensor widened exactly; an integer tensor is refused naming
// `name` and `source`.
StTensor as_f32(const StTensor& t, const std::string& name, const std::string& source);

// Tensors whose names pass `skip` are left out unread and unchecked (buffers of foreign
// checkpoints, e.g. GPT-2's causal-mask "attn.bias", whatever their dtype).
using SkipTensor = std::function<bool(const std::string&)>;
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source, const SkipTensor& skip = {});
SafetensorsFile read_safetensors(const std::string& path, const SkipTensor& skip = {});

class SafetensorsWriter {
 public:
  void add(const std::string& name, const Tensor& t);
  void add_ids(const std::string& name, const Ids& ids, DType dtype = DType::I64);
  void add_i64(const std::string& name, const Shape& shape, const std::vector<int64_t>& values);
  void set_meta(const std::string& key, const std::string& value) { metadata_[key] = value; }
  std::string serialize() const;
  void write(const std::string& path) const;  // atomic

 private:
  std::vector<std::pair<std::string, StTensor>> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace hl
