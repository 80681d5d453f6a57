// Finite-difference gradient checking, reusable by any test or user.
//
// Checks the gradient of L = sum(fn(inputs) * U) for a random upstream U (never all-ones:
// that hides LayerNorm-style bugs) against central differences
//   dL/dx_i ~ (L(x_i + h) - L(x_i - h)) / 2h,  h = step * max(1, |x_i|).
// Precision: the forward runs in float32 but L is accumulated in double, and outputs that a
// perturbation does not touch are recomputed bit-identically, so their rounding cancels in
// the difference. What remains (~1e-4 for h = 3e-3) sits well inside the tolerance
// |analytic - numeric| <= atol + rtol |numeric|, while a wrong sign, a missing factor of 2
// or a transposed operand produces errors of the order of the gradient itself.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tensor.h"

namespace hl {

struct GradcheckOptions {
  float step = 3e-3f;
  double atol = 2e-3;
  double rtol = 1e-2;
  uint64_t seed = 1234;  // of the upstream gradient U
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_err = 0;
  int64_t checked = 0;  // elements compared
  std::string message;  // first failure: input, element, analytic vs numeric
};

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Every input that requires grad is checked element by element.
GradcheckResult gradcheck(const GradFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opts = {});

}  // namespace hl
