// Basic vocabulary of headlab: shapes, errors, and a tiny intrusive refcount pointer.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstddef>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hl {

// Every failure a user can cause (bad shape, bad axis, bad file) is an hl::Error whose
// message names the op and the shapes, e.g. "matmul: (2,3) x (4,5): inner dimensions differ".
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(os.str());
}

#define HL_CHECK(cond, ...) \
  do {                      \
    if (!(cond)) ::hl::fail(__VA_ARGS__); \
  } while (0)

constexpr int kMaxDims = 6;

// A shape stored inline (no heap): small tensors are created in the millions per run.
struct Shape {
  int64_t dims[kMaxDims] = {0, 0, 0, 0, 0, 0};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    HL_CHECK(d.size() <= kMaxDims, "shape: at most ", kMaxDims, " dimensions, got ", d.size());
    for (int64_t v : d) dims[ndim++] = v;
  }
  static Shape of(const std::vector<int64_t>& d) {
    HL_CHECK(d.size() <= kMaxDims, "shape: at most ", kMaxDims, " dimensions, got ", d.size());
    Shape s;
    for (int64_t v : d) s.dims[s.ndim++] = v;
    return s;
  }
  int size() const { return ndim; }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t& operator[](int i) { return dims[i]; }
  int64_t back() const { return dims[ndim - 1]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  void push_back(int64_t v) {
    HL_CHECK(ndim < kMaxDims, "shape: at most ", kMaxDims, " dimensions");
    dims[ndim++] = v;
  }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(dims, dims + ndim); }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? "," : "") + std::to_string(dims[i]);
    return s + ")";
  }
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

// Normalises a possibly negative axis; throws naming the op when out of range.
inline int normalize_axis(const char* op, int axis, int ndim) {
  int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim) fail(op, ": axis ", axis, " out of range for a ", ndim, "-d tensor");
  return a;
}

// Intrusive reference counting: one pointer-sized handle, no separate control block. T::refs
// is a std::atomic<int>, so handles to one object may be copied and dropped on several threads
// (a model's parameters read by two threads at once).
template <class T>
class Ref {
 public:
  Ref() = default;
  explicit Ref(T* p) : p_(p) { if (p_) p_->refs.fetch_add(1, std::memory_order_relaxed); }
  Ref(const Ref& o) : p_(o.p_) { if (p_) p_->refs.fetch_add(1, std::memory_order_relaxed); }
  Ref(Ref&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Ref& operator=(const Ref& o) { Ref(o).swap(*this); return *this; }
  Ref& operator=(Ref&& o) noexcept { Ref(std::move(o)).swap(*this); return *this; }
  ~Ref() { reset(); }
  void reset() {
    if (p_ && p_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete p_;
    p_ = nullptr;
  }
  void swap(Ref& o) noexcept { std::swap(p_, o.p_); }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  bool operator==(const Ref& o) const { return p_ == o.p_; }

 private:
  T* p_ = nullptr;
};

}  // namespace hl
