// A move-only callable stored inline (no heap): every op attaches a backward closure, and a
// std::function would allocate for most of them. Closures must fit in kBytes; a static_assert
// says so at compile time.
#pragma once
#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace hl {

template <class Sig, size_t kBytes = 192>
class InlineFunction;

template <class R, class... Args, size_t kBytes>
class InlineFunction<R(Args...), kBytes> {
 public:
  InlineFunction() = default;
  InlineFunction(const InlineFunction&) = delete;
  InlineFunction& operator=(const InlineFunction&) = delete;
  ~InlineFunction() { reset(); }

  template <class F>
  void set(F&& f) {
    using Fn = std::decay_t<F>;
    static_assert(sizeof(Fn) <= kBytes, "backward closure too large: capture less");
    static_assert(alignof(Fn) <= alignof(std::max_align_t), "closure over-aligned");
    reset();
    new (buf_) Fn(std::forward<F>(f));
    call_ = [](void* p, Args... a) -> R { return (*static_cast<Fn*>(p))(std::forward<Args>(a)...); };
    destroy_ = [](void* p) { static_cast<Fn*>(p)->~Fn(); };
  }
  void reset() {
    if (destroy_) destroy_(buf_);
    call_ = nullptr;
    destroy_ = nullptr;
  }
  explicit operator bool() const { return call_ != nullptr; }
  R operator()(Args... a) { return call_(buf_, std::forward<Args>(a)...); }

 private:
  alignas(std::max_align_t) unsigned char buf_[kBytes];
  R (*call_)(void*, Args...) = nullptr;
  void (*destroy_)(void*) = nullptr;
};

}  // namespace hl
