#include "analysis/detectors.h"

#include "lib/stop.h"

namespace hl {

std::string to_string(Detector d) {
  switch (d) {
    case Detector::PreviousToken: return "previous_token";
    case Detector::DuplicateToken: return "duplicate_token";
    case Detector::Induction: return "induction";
  }
  return "?";
}

Detector parse_detector(const std::string& name) {
  for (Detector d : {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction})
    if (to_string(d) == name) return d;
  fail("detector '", name, "' is not one of previous_token, duplicate_token, induction");
}

std::vector<float> detection_pattern(Detector kind, const std::vector<int32_t>& tok) {
  const int64_t T = static_cast<int64_t>(tok.size());
  std::vector<float> D(static_cast<size_t>(T * T), 0.f);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      bool on = false;
      switch (kind) {
        case Detector::PreviousToken: on = j == i - 1; break;
        case Detector::DuplicateToken: on = j < i && tok[j] == tok[i]; break;
        case Detector::Induction: on = j >= 1 && tok[j - 1] == tok[i] && j - 1 < i; break;
      }
      D[i * T + j] = on ? 1.f : 0.f;
    }
  return D;
}

double detection_score(const float* A, const float* D, int64_t T, const DetectorOptions& opt) {
  double on = 0, all = 0;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) {
      if ((opt.exclude_bos && j == 0) || (opt.exclude_current_token && i == j)) continue;
      const double a = A[i * T + j];
      all += a;
      on += a * D[i * T + j];
    }
  return all > 0 ? on / all : 0.0;
}

std::vector<HeadGrid> detect_heads(TransformerLM& model, const std::vector<Batch>& data, const std::vector<Detector>& kinds,
                                   const DetectorOptions& opt, const std::vector<float>& pattern, int64_t pattern_T,
                                   std::vector<std::vector<HeadGrid>>* per_sequence) {
  const int L = model.cfg.n_layers, H = model.cfg.n_heads;
  const size_t K = pattern.empty() ? kinds.size() : 1;  // a user's pattern replaces the kinds
  if (K == 0) fail("detect_heads: no detector given");
  std::vector<HeadGrid> score(K, HeadGrid(L, std::vector<double>(H, 0.0)));
  if (per_sequence) per_sequence->assign(K, {});
  int64_t sequences = 0;
  std::vector<float> A;
  std::vector<std::vector<float>> D(K);
  for (const Batch& b : data) {
    throw_if_stopped();
    // one forward per batch for every detector (a GPT-2-small forward costs far more than scoring)
    const ActivationCache cache = recorded_forward(model, b, names_ending_with("attn.hook_pattern"));
    const int64_t B = b.size(), T = b.inputs.shape[1];
    for (int64_t r = 0; r < B; ++r) {
      int64_t n = T;  // this row's length: trailing padding removed
      if (b.key_padding.defined())
        while (n > 0 && b.key_padding.at({r, n - 1}) != 0.f) --n;
      if (n == 0) continue;
      if (!pattern.empty()) {
        if (n > pattern_T) fail("detection pattern: ", pattern_T, " x ", pattern_T, " is smaller than sequences of ", n, " tokens");
        D[0].assign(static_cast<size_t>(n * n), 0.f);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) D[0][i * n + j] = pattern[i * pattern_T + j];
      } else {
        const std::vector<int32_t> tok(b.inputs.data.begin() + r * T, b.inputs.data.begin() + r * T + n);
        for (size_t k = 0; k < K; ++k) D[k] = detection_pattern(kinds[k], tok);
      }
      A.resize(static_cast<size_t>(n * n));
      if (per_sequence)
        for (auto& each : *per_sequence) each.emplace_back(L, std::vector<double>(H, 0.0));
      for (int l = 0; l < L; ++l) {
        const float* P = cache[attn_hook(l, "pattern")].data();  // (B, H, T, T)
        for (int h = 0; h < H; ++h) {
          const float* src = P + ((r * H + h) * T) * T;
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < n; ++j) A[i * n + j] = src[i * T + j];
          for (size_t k = 0; k < K; ++k) {
            const double s = detection_score(A.data(), D[k].data(), n, opt);
            score[k][l][h] += s;
            if (per_sequence) (*per_sequence)[k].back()[l][h] = s;
          }
        }
      }
      ++sequences;
    }
  }
  if (sequences == 0) fail("detect_heads: no sequences to score");
  for (HeadGrid& g : score)
    for (auto& row : g)
      for (double& v : row) v /= static_cast<double>(sequences);
  return score;
}

HeadGrid detect_heads(TransformerLM& model, const std::vector<Batch>& data, Detector kind, const DetectorOptions& opt,
                      const std::vector<float>& pattern, int64_t pattern_T, std::vector<HeadGrid>* per_sequence) {
  std::vector<std::vector<HeadGrid>> each;
  std::vector<HeadGrid> g = detect_heads(model, data, std::vector<Detector>{kind}, opt, pattern, pattern_T,
                                         per_sequence ? &each : nullptr);
  if (per_sequence) *per_sequence = std::move(each[0]);
  return std::move(g[0]);
}

std::vector<Batch> repeated_random_tokens(int n, int k, int vocab, uint64_t seed) {
  if (n < 1 || k < 1 || vocab < 1) fail("repeated_random_tokens: n, k and vocab must be positive");
  Rng rng(seed);
  std::vector<Batch> out;
  for (int done = 0; done < n; done += 64) {
    const int64_t B = std::min(64, n - done), T = 2 * k;
    Batch b;
    b.inputs = Ids(Shape{B, T});
    b.targets = Ids(Shape{B, T});
    b.prompt_len.assign(static_cast<size_t>(B), 0);
    for (int64_t r = 0; r < B; ++r)
      for (int t = 0; t < k; ++t) {
        const auto v = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
        b.inputs.at(r, t) = b.inputs.at(r, t + k) = v;
      }
    for (int64_t r = 0; r < B; ++r)  // next-token targets on the repeated half
      for (int64_t t = 0; t < T; ++t) b.targets.at(r, t) = t >= k - 1 && t + 1 < T ? b.inputs.at(r, t + 1) : -1;
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<Batch> varied_repeat_probe(int n, int k_max, int vocab, uint64_t seed, int32_t bos) {
  if (n < 1 || vocab < 1) fail("varied_repeat_probe: n and vocab must be positive");
  if (k_max < 2) fail("varied_repeat_probe: the longest repeat must be at least 2 tokens, got ", k_max);
  if (bos >= vocab) fail("varied_repeat_probe: BOS token ", bos, " is outside the vocabulary of ", vocab);
  Rng rng(seed);
  const int k_min = std::max(2, k_max / 2), lead = bos >= 0 ? 1 : 0;
  const int64_t T = 2 * static_cast<int64_t>(k_max) + lead;
  auto below = [&](int64_t m) { return static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(m)); };
  std::vector<Batch> out;
  for (int done = 0; done < n; done += 64) {
    const int64_t B = std::min(64, n - done);
    Batch b;
    b.inputs = Ids(Shape{B, T});
    b.targets = Ids(Shape{B, T});
    b.prompt_len.assign(static_cast<size_t>(B), 0);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t k = k_min + below(k_max - k_min + 1);
      const int64_t start = lead + below(2 * k_max - 2 * k + 1);  // the first copy: [start, start + k)
      for (int64_t t = 0; t < T; ++t) b.inputs.at(r, t) = static_cast<int32_t>(below(vocab));
      if (lead) b.inputs.at(r, 0) = bos;
      for (int64_t t = 0; t < k; ++t) b.inputs.at(r, start + k + t) = b.inputs.at(r, start + t);
      // next-token targets where the second copy is predictable: from its first token on
      for (int64_t t = 0; t < T; ++t)
        b.targets.at(r, t) = t >= start + k && t < start + 2 * k - 1 ? b.inputs.at(r, t + 1) : -1;
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace hl
