#include "analysis/ablation.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <set>
#include <sstream>

#include "analysis/evaluate.h"
#include "analysis/heads.h"
#include "lib/stop.h"

namespace hl {

namespace {

// The attention hook points whose activations have a head axis (the first numeric axis of the shape).
bool has_head_axis(const std::string& name) {
  static const char* const with_heads[] = {"attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z", "attn.hook_result",
                                           "attn.hook_pattern", "attn.hook_attn_scores", "attn.hook_q_input",
                                           "attn.hook_k_input", "attn.hook_v_input"};
  for (const char* s : with_heads) {
    const std::string suffix = s;
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        (name.size() == suffix.size() || name[name.size() - suffix.size() - 1] == '.'))
      return true;
  }
  return false;
}

// The coordinate of flat element i along axis `a` of a contiguous tensor of shape s.
int64_t coord(int64_t i, const Shape& s, int a) {
  int64_t stride = 1;
  for (int d = s.ndim - 1; d > a; --d) stride *= s[d];
  return (i / stride) % s[a];
}

// Flat index into a tensor of x's shape with axes `dropped` of size 1, of x's element i.
int64_t reduced_index(int64_t i, const Shape& s, int drop_a, int drop_b) {
  int64_t r = 0, stride = 1;
  for (int d = s.ndim - 1; d >= 0; --d) {
    const int64_t c = i % s[d];
    i /= s[d];
    if (d == drop_a || d == drop_b) continue;
    r += c * stride;
    stride *= s[d];
  }
  return r;
}

}  // namespace

namespace {

HookAxes hook_axes_in(const std::vector<HookPointInfo>& points, const std::string& name) {
  for (const HookPointInfo& p : points) {
    if (p.name != name) continue;
    // the shape as its module declares it, e.g. "(B, T, 4, 16)" or "(B, 4, T, T)"
    std::string inner = p.shape.substr(1, p.shape.size() - 2);
    std::replace(inner.begin(), inner.end(), ',', ' ');
    std::istringstream words(inner);
    HookAxes a;
    for (std::string w; words >> w; ++a.ndim) {
      if (w == "B") a.batch = a.ndim;
      else if (w == "T") (a.pos < 0 ? a.pos : a.src_pos) = a.ndim;
      else if (a.head < 0 && has_head_axis(name) && std::isdigit(static_cast<unsigned char>(w[0]))) a.head = a.ndim, a.heads = std::stoll(w);
    }
    if (name.ends_with(".hook_sae_acts_pre") || name.ends_with(".hook_sae_acts_post")) a.feature = a.ndim - 1;  // (B, T, d_sae)
    return a;
  }
  fail("unknown hook point '", name, "' (headlab hooks lists them)");
}

}  // namespace

HookAxes hook_axes(const ModelConfig& cfg, const std::string& name) { return hook_axes_in(describe_hook_points(cfg), name); }
HookAxes hook_axes(const TransformerLM& model, const std::string& name) { return hook_axes_in(describe_hook_points(model), name); }

AblationKind parse_ablation_kind(const std::string& s) {
  if (s == "zero") return AblationKind::Zero;
  if (s == "mean") return AblationKind::Mean;
  if (s == "resample") return AblationKind::Resample;
  fail("unknown ablation kind '", s, "' (expected zero, mean or resample)");
}

std::string to_string(AblationKind k) { return k == AblationKind::Zero ? "zero" : k == AblationKind::Mean ? "mean" : "resample"; }

void check_ablation_site(const ModelConfig& cfg, const AblationSite& site, int64_t T) {
  const HookAxes a = hook_axes(cfg, site.hook);
  if (site.head >= 0 && a.head < 0) fail("ablation: ", site.hook, " has no head axis (leave the head out)");
  if (site.head < -1) fail("ablation: head ", site.head, " is negative (-1 = every head)");
  if (site.head >= a.heads && a.head >= 0)
    fail("ablation: head ", site.head, " is outside 0..", a.heads - 1, " (", site.hook, " has ", a.heads, " heads)");
  if (!site.positions.empty() && a.pos < 0) fail("ablation: ", site.hook, " has no position axis (leave the positions out)");
  for (int64_t p : site.positions)
    if (p < 0 || (T > 0 && p >= T)) fail("ablation: position ", p, " is outside 0..", T > 0 ? T - 1 : 0, T > 0 ? "" : " (negative)");
}

Tensor ablated_activation(const Tensor& x, const HookAxes& axes, const AblationSite& site, const Tensor& value) {
  const Shape& s = x.shape();
  if (s.ndim != axes.ndim) fail("ablation at ", site.hook, ": activation ", s.str(), " has ", s.ndim, " axes, expected ", axes.ndim);
  // how value lines up with x: the same shape, or a mean without the batch (and position) axis
  int drop_a = -1, drop_b = -1;
  if (value.defined() && value.shape() != s) {
    Shape per_pos = s, all_pos = s;
    if (axes.batch >= 0) per_pos.dims[axes.batch] = all_pos.dims[axes.batch] = 1;
    if (axes.pos >= 0) all_pos.dims[axes.pos] = 1;
    if (value.shape() == per_pos) drop_a = axes.batch;
    else if (value.shape() == all_pos) drop_a = axes.batch, drop_b = axes.pos;
    else fail("ablation at ", site.hook, ": the value ", value.shape().str(), " fits neither the activation ", s.str(), " nor its mean ",
              per_pos.str(), " or ", all_pos.str());
  }
  std::vector<char> at_pos;  // positions ablated (empty = all)
  if (!site.positions.empty()) {
    at_pos.assign(static_cast<size_t>(s[axes.pos]), 0);
    for (int64_t p : site.positions) {
      if (p < 0 || p >= s[axes.pos]) fail("ablation at ", site.hook, ": position ", p, " is outside 0..", s[axes.pos] - 1);
      at_pos[static_cast<size_t>(p)] = 1;
    }
  }
  if (site.head >= 0 && (axes.head < 0 || site.head >= s[axes.head]))
    fail("ablation at ", site.hook, ": head ", site.head, " is outside the activation ", s.str());
  Tensor mask = Tensor::zeros(s), repl = Tensor::zeros(s);  // 1 where replaced; the replacement there
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (site.head >= 0 && coord(i, s, axes.head) != site.head) continue;
    if (!at_pos.empty() && !at_pos[static_cast<size_t>(coord(i, s, axes.pos))]) continue;
    mask.data()[i] = 1.f;
    if (value.defined()) repl.data()[i] = value.data()[drop_a < 0 ? i : reduced_index(i, s, drop_a, drop_b)];
  }
  // masked elements become 0 + value (never inf * 0), the others x + 0 = x
  return add(masked_fill(x, mask, 0.f), repl);
}

Tensor mean_activation(TransformerLM& model, const std::vector<Batch>& data, const std::string& hook, bool per_position) {
  const HookAxes a = hook_axes(model.cfg, hook);
  if (data.empty()) fail("mean ablation: no data to average over");
  if (a.batch < 0) fail("mean ablation: ", hook, " has no batch axis to average over");
  const int drop_pos = per_position ? -1 : a.pos;
  std::vector<double> sum, count;
  Shape reduced;
  for (const Batch& b : data) {
    throw_if_stopped();
    const Tensor x = recorded_forward(model, b, name_is(hook))[hook];
    Shape r = x.shape();
    r.dims[a.batch] = 1;
    if (drop_pos >= 0) r.dims[drop_pos] = 1;
    if (sum.empty()) {
      reduced = r;
      sum.assign(static_cast<size_t>(r.numel()), 0.0);
      count.assign(sum.size(), 0.0);
    } else if (r != reduced) {
      fail("mean ablation: the data's batches give ", hook, " of different shapes (", reduced.str(), " and ", r.str(),
           "): give batches of one sequence length");
    }
    const Shape& s = x.shape();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (b.key_padding.defined() && a.pos >= 0 && b.key_padding.at({coord(i, s, a.batch), coord(i, s, a.pos)}) != 0.f) continue;
      const int64_t j = reduced_index(i, s, a.batch, drop_pos);
      sum[static_cast<size_t>(j)] += x.data()[i];
      count[static_cast<size_t>(j)] += 1;
    }
  }
  Tensor m = Tensor::empty(reduced);
  for (size_t j = 0; j < sum.size(); ++j) m.data()[j] = static_cast<float>(count[j] > 0 ? sum[j] / count[j] : 0.0);
  return m;
}

double knockout_memory_bytes(const ModelConfig& cfg, const std::string& hook, AblationKind kind, int64_t examples, int64_t T,
                             int64_t batch) {
  double bytes = estimate_step_bytes(cfg, std::min(examples, batch), T, false);
  if (kind != AblationKind::Resample) return bytes;
  for (const HookPointInfo& p : describe_hook_points(cfg)) {
    if (p.name != hook) continue;
    double per_row = 1;  // the declared shape with B = 1 and T = T
    std::string inner = p.shape.substr(1, p.shape.size() - 2);
    std::replace(inner.begin(), inner.end(), ',', ' ');
    std::istringstream words(inner);
    for (std::string w; words >> w;) per_row *= w == "B" ? 1.0 : w == "T" ? static_cast<double>(T) : std::stod(w);
    bytes += 2.0 * 4.0 * per_row * static_cast<double>(examples);
  }
  return bytes;
}

std::vector<int64_t> resample_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i)  // Sattolo: j < i, one cycle through every example
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(rng.next_u64() % static_cast<uint64_t>(i))]);
  return p;
}

namespace {

struct RowScores {
  std::vector<double> loss_sum, correct;
  std::vector<int64_t> counted;
};

// Per row of each batch: summed cross-entropy (double) and right argmax over its counted targets.
// A non-finite logit at a counted position would turn into a NaN loss and an accuracy from NaN
// comparisons: it fails instead, naming `what` made the logits (the intervention).
void score_rows(TransformerLM& model, const std::vector<Batch>& data, const std::function<Hooks(size_t batch)>& hooks_for,
                RowScores& out, const std::string& what) {
  EvalScope mode(model);
  NoGradGuard ng;
  for (size_t bi = 0; bi < data.size(); ++bi) {
    throw_if_stopped();
    const Batch& b = data[bi];
    const Hooks hooks = hooks_for(bi);  // always a Hooks object: clean and ablated take one path
    ForwardOptions opt;
    opt.hooks = &hooks;
    opt.key_padding = b.key_padding;
    const Tensor logits = model.forward(b.inputs, opt);  // (B, T, V)
    const int64_t B = b.size(), T = b.inputs.shape[1], V = logits.size(2);
    for (int64_t r = 0; r < B; ++r) {
      double loss = 0, right = 0;
      int64_t n = 0;
      for (int64_t t = 0; t < T; ++t) {
        const int32_t y = b.targets.at(r, t);
        if (y < 0) continue;
        const float* l = logits.data() + (r * T + t) * V;
        for (int64_t v = 0; v < V; ++v)
          if (!std::isfinite(l[v]))
            fail(what, " makes the model's logits non-finite (", l[v], " in example ", out.counted.size() + static_cast<size_t>(r),
                 ", position ", t, "): a loss or accuracy from them would mean nothing");
        int64_t best = 0;  // argmax, the first on ties
        for (int64_t v = 1; v < V; ++v)
          if (l[v] > l[best]) best = v;
        const double mx = l[best];
        double z = 0;
        for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(l[v]) - mx);
        loss += std::log(z) + mx - static_cast<double>(l[y]);
        right += best == y;
        ++n;
      }
      out.loss_sum.push_back(loss), out.correct.push_back(right), out.counted.push_back(n);
    }
  }
}

}  // namespace

KnockoutResult knockout(TransformerLM& model, const std::vector<Batch>& data, const AblationOptions& o) {
  if (data.empty()) fail("ablation: no data (give at least one example)");
  check_data_fits_model(data, model.cfg, "ablation");  // ids and targets index the model's tables
  const int64_t T = data[0].inputs.shape[1];
  check_ablation_site(model.cfg, o.site, T);
  const HookAxes axes = hook_axes(model.cfg, o.site.hook);
  int64_t N = 0;
  for (const Batch& b : data) {
    if (b.inputs.shape[1] != T && o.kind != AblationKind::Zero)
      fail("ablation: batches of different lengths (", T, " and ", b.inputs.shape[1], "); mean and resample need one length");
    N += b.size();
  }
  if (N == 0) fail("ablation: no data (give at least one example)");
  KnockoutResult r;
  // the replacement of each batch's activation: none (zeros), the mean, or other rows' activations
  Tensor mean;
  std::vector<Tensor> source;  // resample: per batch, the activation its rows take
  if (o.kind == AblationKind::Mean) {
    if (axes.batch < 0) fail("mean ablation: ", o.site.hook, " has no batch axis to average over");
    mean = mean_activation(model, o.mean_data.empty() ? data : o.mean_data, o.site.hook, o.per_position);
  } else if (o.kind == AblationKind::Resample) {
    if (axes.batch < 0) fail("resample ablation: ", o.site.hook, " has no batch axis (nothing to resample from)");
    r.permutation = o.permutation.empty() ? resample_permutation(N, o.seed) : o.permutation;
    std::vector<int64_t> seen(static_cast<size_t>(N), 0);
    if (static_cast<int64_t>(r.permutation.size()) != N) fail("resample ablation: the permutation has ", r.permutation.size(), " entries for ", N, " examples");
    for (int64_t p : r.permutation) {
      if (p < 0 || p >= N || seen[static_cast<size_t>(p)]++) fail("resample ablation: the permutation is not one of 0..", N - 1);
    }
    if (axes.batch != 0) fail("resample ablation: ", o.site.hook, " does not have its batch axis first");
    // every example's activation, then each batch's rows gathered from their sources
    std::vector<Tensor> acts;
    std::vector<std::pair<size_t, int64_t>> where;  // example -> (batch, row)
    for (size_t bi = 0; bi < data.size(); ++bi) {
      acts.push_back(recorded_forward(model, data[bi], name_is(o.site.hook))[o.site.hook]);
      for (int64_t row = 0; row < data[bi].size(); ++row) where.push_back({bi, row});
    }
    int64_t e = 0;
    for (size_t bi = 0; bi < data.size(); ++bi) {
      Tensor s = Tensor::empty(acts[bi].shape());
      const int64_t per_row = s.numel() / s.size(0);
      for (int64_t row = 0; row < data[bi].size(); ++row, ++e) {
        const auto [sb, sr] = where[static_cast<size_t>(r.permutation[static_cast<size_t>(e)])];
        if (acts[sb].numel() / acts[sb].size(0) != per_row) fail("resample ablation: examples of different shapes");
        std::copy(acts[sb].data() + sr * per_row, acts[sb].data() + (sr + 1) * per_row, s.data() + row * per_row);
      }
      source.push_back(s);
    }
  }
  RowScores clean, ablated;
  score_rows(model, data, [](size_t) { return Hooks(); }, clean, "the model without ablation");
  const char* kind = o.kind == AblationKind::Mean ? "mean" : o.kind == AblationKind::Resample ? "resample" : "zero";
  std::string site = o.site.hook + (o.site.head >= 0 ? " head " + std::to_string(o.site.head) : "");
  if (!o.site.positions.empty()) site += " at " + std::to_string(o.site.positions.size()) + " position(s)";
  score_rows(model, data,
             [&](size_t bi) {
               Hooks h;
               const Tensor value = o.kind == AblationKind::Mean ? mean : o.kind == AblationKind::Resample ? source[bi] : Tensor();
               h.add_forward(o.site.hook, [&o, axes, value](const Tensor& x, const std::string&) {
                 return ablated_activation(x, axes, o.site, value);
               });
               return h;
             },
             ablated, std::string("the ") + kind + " ablation of " + site);
  double n_all = 0, lc = 0, la = 0, ac = 0, aa = 0;
  for (size_t i = 0; i < clean.counted.size(); ++i) {
    const double n = static_cast<double>(clean.counted[i]);
    r.counted.push_back(clean.counted[i]);
    r.clean_loss.push_back(n > 0 ? clean.loss_sum[i] / n : 0.0);
    r.ablated_loss.push_back(n > 0 ? ablated.loss_sum[i] / n : 0.0);
    r.clean_acc.push_back(n > 0 ? clean.correct[i] / n : 0.0);
    r.ablated_acc.push_back(n > 0 ? ablated.correct[i] / n : 0.0);
    n_all += n, lc += clean.loss_sum[i], la += ablated.loss_sum[i], ac += clean.correct[i], aa += ablated.correct[i];
  }
  if (n_all == 0) fail("ablation: the data has no counted target (nothing to score)");
  r.clean_mean_loss = lc / n_all, r.ablated_mean_loss = la / n_all;
  r.clean_token_acc = ac / n_all, r.ablated_token_acc = aa / n_all;
  // resampling the examples: token-weighted means, as the overall numbers
  auto interval = [&](const std::vector<double>& a, const std::vector<double>& b, uint64_t seed) {
    return bootstrap_interval95(
        a.size(),
        [&](const std::vector<size_t>& idx) {
          double s = 0, n = 0;
          for (size_t i : idx) s += a[i] - (b.empty() ? 0.0 : b[i]), n += static_cast<double>(clean.counted[i]);
          return n > 0 ? s / n : 0.0;
        },
        1000, seed);
  };
  r.clean_loss_ci95 = interval(clean.loss_sum, {}, 1);
  r.ablated_loss_ci95 = interval(ablated.loss_sum, {}, 2);
  r.d_loss_ci95 = interval(ablated.loss_sum, clean.loss_sum, 3);
  r.clean_acc_ci95 = interval(clean.correct, {}, 4);
  r.ablated_acc_ci95 = interval(ablated.correct, {}, 5);
  r.d_acc_ci95 = interval(ablated.correct, clean.correct, 6);
  return r;
}

}  // namespace hl
