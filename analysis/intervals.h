// Intervals for the numbers a study reports: a 95% Student-t interval of a mean over a few runs
// (seeds), and a percentile-bootstrap interval of a mean over many examples (prompts). Both
// return {lo, hi}; with fewer than two values there is no interval (both NaN).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace hl {

struct Interval {
  double lo, hi;
  bool defined() const { return lo == lo && hi == hi; }  // not NaN
};

// mean +- t_{0.975, n-1} s / sqrt(n): covers the true mean 95% of the time for normal values.
// A t-interval knows no bounds: a metric that has them (a loss >= 0, a fraction in [0, 1]) gives
// them as lo_bound and hi_bound, and the interval is clipped to them.
Interval t_interval95(const std::vector<double>& values, double lo_bound = -INFINITY, double hi_bound = INFINITY);
// The 2.5th and 97.5th percentiles of the means of `resamples` resamples (with replacement, from
// `seed`) of the values: for a mean over many examples of any distribution.
Interval bootstrap_interval95(const std::vector<double>& values, int resamples = 2000, uint64_t seed = 1);
// The same for any statistic of n items (a ratio of means, a paired difference): `statistic`
// computes it from a resample given as indices into the items.
Interval bootstrap_interval95(size_t n, const std::function<double(const std::vector<size_t>& idx)>& statistic,
                              int resamples = 2000, uint64_t seed = 1);
// Student's t quantile t_{0.975, df} (df >= 1).
double t_quantile975(int df);

}  // namespace hl
