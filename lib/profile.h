// A per-category op timer for `headlab bench --profile`. Off by default; when off a scope
// costs one branch. Categories are coarse on purpose: they answer "where does a step go".
#pragma once
#include <chrono>
#include <cstdint>

namespace hl {

enum class ProfCat : int { Matmul, Attention, LayerNorm, SoftmaxCE, Elementwise, Embedding, Optimizer, kCount };
const char* prof_cat_name(ProfCat c);

struct Profiler {
  static inline bool enabled = false;
  static inline double seconds[static_cast<int>(ProfCat::kCount)] = {};
  static inline int64_t calls[static_cast<int>(ProfCat::kCount)] = {};
  static inline int depth = 0;  // only the outermost scope counts (ops calling ops)
  static void reset() {
    for (int i = 0; i < static_cast<int>(ProfCat::kCount); ++i) seconds[i] = 0, calls[i] = 0;
  }
};

class ProfScope {
 public:
  explicit ProfScope(ProfCat c) : cat_(c), active_(Profiler::enabled) {
    if (!active_) return;
    on_ = Profiler::depth++ == 0;
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfScope() {
    if (!active_) return;
    --Profiler::depth;
    if (!on_) return;
    Profiler::seconds[static_cast<int>(cat_)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    ++Profiler::calls[static_cast<int>(cat_)];
  }
  ProfScope(const ProfScope&) = delete;
  ProfScope& operator=(const ProfScope&) = delete;

 private:
  ProfCat cat_;
  bool active_, on_ = false;
  std::chrono::steady_clock::time_point start_;
};

#define HL_PROFILE(cat) ::hl::ProfScope hl_prof_scope_(::hl::ProfCat::cat)

}  // namespace hl
