#include "gradcheck.h"

#include <cmath>
#include <sstream>

namespace hl {

namespace {
double weighted_sum(const Tensor& out, const Tensor& upstream) {
  double s = 0;
  const float *o = out.data(), *u = upstream.data();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) s += static_cast<double>(o[i]) * u[i];
  return s;
}
}  // namespace

GradcheckResult gradcheck(const GradFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opts) {
  GradcheckResult res;
  for (const Tensor& t : inputs)
    if (t.defined()) t.impl()->grad.reset();
  Tensor out = fn(inputs);
  Rng rng(opts.seed);
  Tensor upstream = Tensor::randn(out.shape(), rng);
  out.backward(upstream);

  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    Tensor analytic = x.grad();
    float* p = x.data();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const float orig = p[i];
      const float h = opts.step * std::max(1.f, std::fabs(orig));
      p[i] = orig + h;
      const double lp = weighted_sum(fn(inputs), upstream);
      p[i] = orig - h;
      const double lm = weighted_sum(fn(inputs), upstream);
      p[i] = orig;
      const double numeric = (lp - lm) / (2.0 * h);
      const double a = analytic.defined() ? analytic.data()[i] : 0.0;
      const double err = std::fabs(a - numeric);
      res.max_abs_err = std::max(res.max_abs_err, err);
      ++res.checked;
      if (!(err <= opts.atol + opts.rtol * std::fabs(numeric)) && res.ok) {
        res.ok = false;
        std::ostringstream os;
        os << "input " << k << " " << x.shape().str() << " element " << i << ": analytic " << a
           << " vs numeric " << numeric;
        res.message = os.str();
      }
    }
  }
  return res;
}

}  // namespace hl
