#include "analysis/intervals.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core.h"
#include "lib/rng.h"
#include "lib/stop.h"

namespace hl {

double t_quantile975(int df) {
  if (df < 1) fail("t_quantile975: degrees of freedom must be at least 1, got ", df);
  static const double table[30] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                   2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                   2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df <= 30) return table[df - 1];
  // Cornish-Fisher expansion around the normal quantile: within 1e-4 of the exact value past 30
  const double z = 1.959964, n = df;
  return z + (z * z * z + z) / (4 * n) + (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * n * n);
}

Interval t_interval95(const std::vector<double>& v, double lo_bound, double hi_bound) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (v.size() < 2) return {nan, nan};
  const double n = static_cast<double>(v.size());
  double mean = 0;
  for (double x : v) mean += x;
  mean /= n;
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  const double half = t_quantile975(static_cast<int>(v.size()) - 1) * std::sqrt(ss / (n - 1) / n);
  return {std::max(mean - half, lo_bound), std::min(mean + half, hi_bound)};
}

Interval bootstrap_interval95(size_t n, const std::function<double(const std::vector<size_t>& idx)>& statistic,
                              int resamples, uint64_t seed) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (n < 2) return {nan, nan};
  if (resamples < 40) fail("bootstrap_interval95: at least 40 resamples, got ", resamples);
  Rng rng(seed);
  std::vector<size_t> idx(n);
  std::vector<double> stats(static_cast<size_t>(resamples));
  for (double& st : stats) {
    throw_if_stopped();  // resamples of many items take seconds (dla --examples 100000: 8 s)
    for (size_t& i : idx) i = static_cast<size_t>(rng.next_u64() % n);
    st = statistic(idx);
  }
  std::sort(stats.begin(), stats.end());
  auto at = [&](double q) {  // linear interpolation between order statistics
    const double pos = q * static_cast<double>(resamples - 1);
    const size_t i = static_cast<size_t>(pos);
    const double f = pos - static_cast<double>(i);
    return i + 1 < stats.size() ? stats[i] * (1 - f) + stats[i + 1] * f : stats[i];
  };
  return {at(0.025), at(0.975)};
}

Interval bootstrap_interval95(const std::vector<double>& v, int resamples, uint64_t seed) {
  return bootstrap_interval95(
      v.size(),
      [&](const std::vector<size_t>& idx) {
        double s = 0;
        for (size_t i : idx) s += v[i];
        return s / static_cast<double>(idx.size());
      },
      resamples, seed);
}

}  // namespace hl
