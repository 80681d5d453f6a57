// Sparse autoencoders: the four activation ops (forward, then backward beside it) and the
// module's forward in SAELens's layout.
#include "sae.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include <nlohmann/json.hpp>

#include "lib/fastmath.h"
#include "lib/autograd.h"
#include "lib/fileutil.h"
#include "lib/parallel.h"
#include "lib/safetensors.h"
#include "models/sae_sparse.h"

namespace hl {

namespace {

void check_pre(const char* op, const Tensor& pre) {
  HL_CHECK(pre.defined() && pre.ndim() == 2, op, ": pre-activations must be (N, d_sae), got ",
           pre.defined() ? pre.shape().str() : std::string("nothing"));
}

void check_threshold(const char* op, const Tensor& pre, const Tensor& threshold, float bandwidth) {
  check_pre(op, pre);
  HL_CHECK(threshold.defined() && threshold.ndim() == 1 && threshold.size(0) == pre.size(1), op,
           ": threshold must be (", pre.size(1), "), got ", threshold.defined() ? threshold.shape().str() : std::string("nothing"));
  HL_CHECK(bandwidth > 0.f && std::isfinite(bandwidth), op, ": bandwidth must be positive, got ", bandwidth);
}

// Backward of an op whose output is pre where kept and 0 elsewhere: the gradient passes where
// the output is non-zero (kept entries are positive).
void attach_pass_where_kept(Tensor& out, const char* op, const Tensor& pre) {
  attach(out, op, {pre}, [pre](TensorImpl& self) {
    const float* g = self.grad->data();
    const float* y = self.data();
    float* gp = grad_buffer(pre);
    if (!gp) return;
    const int64_t n = pre.numel();
    for (int64_t i = 0; i < n; ++i) gp[i] += y[i] > 0.f ? g[i] : 0.f;
  });
}

}  // namespace

namespace {
// Per row of pre (N, D) the k largest entries, ties broken by index (a deterministic selection),
// their column indices into kept (N, k); returns the output with those entries, relu'd or not.
Tensor topk_rows(const char* op, const Tensor& pre, int64_t k, bool relu, std::vector<int32_t>* kept) {
  check_pre(op, pre);
  const int64_t N = pre.size(0), D = pre.size(1);
  HL_CHECK(k >= 1 && k <= D, op, ": k must be in [1, ", D, "], got ", k);
  Tensor out = Tensor::zeros(pre.shape());
  const float* p = pre.data();
  float* y = out.data();
  if (kept) kept->resize(static_cast<size_t>(N * k));
  parallel_for(N, N * D, [&](int64_t r) {
    thread_local std::vector<int32_t> idx;  // the kept columns, ascending
    idx.resize(static_cast<size_t>(k));
    select_row_topk(p + r * D, D, k, idx.data());
    for (int64_t n = 0; n < k; ++n) {
      const float v = p[r * D + idx[n]];
      y[r * D + idx[n]] = relu && v <= 0.f ? 0.f : v;
      if (kept) (*kept)[r * k + n] = idx[n];
    }
  });
  return out;
}
}  // namespace

Tensor topk_relu(const Tensor& pre, int64_t k) {
  Tensor out = topk_rows("topk_relu", pre, k, true, nullptr);
  if (needs_graph({&pre})) attach_pass_where_kept(out, "topk_relu", pre);
  return out;
}

Tensor topk(const Tensor& pre, int64_t k) {
  // a kept entry may be 0 or negative: the backward needs the indices, not the output's sign
  auto kept = std::make_shared<std::vector<int32_t>>();
  Tensor out = topk_rows("topk", pre, k, false, needs_graph({&pre}) ? kept.get() : nullptr);
  if (needs_graph({&pre}))
    attach(out, "topk", {pre}, [pre, kept, k](TensorImpl& self) {
      const float* g = self.grad->data();
      float* gp = grad_buffer(pre);
      if (!gp) return;
      const int64_t N = pre.size(0), D = pre.size(1);
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t i = r * D + (*kept)[r * k + j];
          gp[i] += g[i];
        }
    });
  return out;
}

Tensor batch_topk_relu(const Tensor& pre, int64_t k_total) {
  check_pre("batch_topk_relu", pre);
  const int64_t n = pre.numel();
  HL_CHECK(k_total >= 1 && k_total <= n, "batch_topk_relu: k_total must be in [1, ", n, "], got ", k_total);
  Tensor out = Tensor::zeros(pre.shape());
  const float* p = pre.data();
  float* y = out.data();
  thread_local std::vector<int64_t> order;
  order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::nth_element(order.begin(), order.begin() + (k_total - 1), order.end(), [p](int64_t a, int64_t b) {
    return p[a] > p[b] || (p[a] == p[b] && a < b);
  });
  for (int64_t j = 0; j < k_total; ++j) {
    const int64_t i = order[j];
    y[i] = p[i] > 0.f ? p[i] : 0.f;
  }
  if (needs_graph({&pre})) attach_pass_where_kept(out, "batch_topk_relu", pre);
  return out;
}

namespace {
inline bool in_rectangle(float pre, float theta, float bandwidth) {
  const float u = (pre - theta) / bandwidth;
  return u > -0.5f && u < 0.5f;
}

// jumprelu (scale_by_theta) and its step: the shared forward and straight-through backward.
Tensor jump(const char* op, const Tensor& pre, const Tensor& threshold, float bandwidth, bool step) {
  check_threshold(op, pre, threshold, bandwidth);
  const int64_t N = pre.size(0), D = pre.size(1);
  Tensor out = Tensor::empty(pre.shape());
  const float *p = pre.data(), *t = threshold.data();
  float* y = out.data();
  parallel_for(N, N * D, [&](int64_t r) {
    for (int64_t j = 0; j < D; ++j) {
      const float v = p[r * D + j];
      y[r * D + j] = v > t[j] ? (step ? 1.f : v) : 0.f;
    }
  });
  if (needs_graph({&pre, &threshold}))
    attach(out, op, {pre, threshold}, [pre, threshold, bandwidth, step, N, D](TensorImpl& self) {
      const float* g = self.grad->data();
      const float *p = pre.data(), *t = threshold.data();
      if (float* gp = step ? nullptr : grad_buffer(pre))
        for (int64_t i = 0; i < N * D; ++i) gp[i] += p[i] > t[i % D] ? g[i] : 0.f;
      if (float* gt = grad_buffer(threshold))
        for (int64_t r = 0; r < N; ++r)
          for (int64_t j = 0; j < D; ++j)
            if (in_rectangle(p[r * D + j], t[j], bandwidth))
              gt[j] -= (step ? 1.f : t[j]) / bandwidth * g[r * D + j];
    });
  return out;
}
}  // namespace

Tensor jumprelu(const Tensor& pre, const Tensor& threshold, float bandwidth) {
  return jump("jumprelu", pre, threshold, bandwidth, false);
}
Tensor jumprelu_step(const Tensor& pre, const Tensor& threshold, float bandwidth) {
  return jump("jumprelu_step", pre, threshold, bandwidth, true);
}

SaeArch parse_sae_arch(const std::string& name) {
  if (name == "standard") return SaeArch::Standard;
  if (name == "topk") return SaeArch::TopK;
  if (name == "batchtopk") return SaeArch::BatchTopK;
  if (name == "jumprelu") return SaeArch::JumpReLU;
  fail("SAE architecture '", name, "' is not one of standard, topk, batchtopk, jumprelu");
}

std::string sae_arch_name(SaeArch a) {
  switch (a) {
    case SaeArch::Standard: return "standard";
    case SaeArch::TopK: return "topk";
    case SaeArch::BatchTopK: return "batchtopk";
    case SaeArch::JumpReLU: return "jumprelu";
  }
  return "?";
}

Sae Sae::init(const SaeConfig& cfg, Rng& rng) {
  HL_CHECK(cfg.d_in >= 1 && cfg.d_sae >= 1, "SAE: d_in and d_sae must be positive, got ", cfg.d_in, " and ", cfg.d_sae);
  if (cfg.arch == SaeArch::TopK || cfg.arch == SaeArch::BatchTopK)
    HL_CHECK(cfg.k >= 1 && cfg.k <= cfg.d_sae, "SAE: k must be in [1, d_sae = ", cfg.d_sae, "], got ", cfg.k);
  HL_CHECK(cfg.normalize_activations == "none" || cfg.normalize_activations == "layer_norm",
           "SAE: normalize_activations '", cfg.normalize_activations, "' is not one of none, layer_norm");
  HL_CHECK(!cfg.transcoder() || cfg.normalize_activations == "none", "transcoder: normalize_activations must be none (its output is another activation)");
  if (cfg.transcoder()) {
    HL_CHECK(cfg.d_out >= 1, "transcoder: d_out must be positive, got ", cfg.d_out);
    HL_CHECK(!cfg.apply_b_dec_to_input, "transcoder: b_dec is an output bias (d_out wide), apply_b_dec_to_input must be false");
  }
  const int64_t D = cfg.out_width();
  Sae s;
  s.cfg = cfg;
  s.W_dec = Tensor::randn({cfg.d_sae, D}, rng);
  s.normalize_decoder_rows();
  s.W_enc = Tensor::empty({cfg.d_in, cfg.d_sae});
  if (D == cfg.d_in) {  // the encoder the decoder's transpose
    const float* wd = s.W_dec.data();
    float* we = s.W_enc.data();
    for (int64_t i = 0; i < cfg.d_sae; ++i)
      for (int64_t j = 0; j < cfg.d_in; ++j) we[j * cfg.d_sae + i] = wd[i * cfg.d_in + j];
  } else {  // a transcoder between widths: unit random encoder columns
    Tensor e = Tensor::randn({cfg.d_sae, cfg.d_in}, rng);
    for (int64_t i = 0; i < cfg.d_sae; ++i) {
      double nn = 0;
      for (int64_t j = 0; j < cfg.d_in; ++j) nn += double(e.data()[i * cfg.d_in + j]) * e.data()[i * cfg.d_in + j];
      for (int64_t j = 0; j < cfg.d_in; ++j) s.W_enc.data()[j * cfg.d_sae + i] = static_cast<float>(e.data()[i * cfg.d_in + j] / std::sqrt(nn));
    }
  }
  s.b_enc = Tensor::zeros({cfg.d_sae});
  s.b_dec = Tensor::zeros({D});
  for (Tensor* t : {&s.W_enc, &s.b_enc, &s.W_dec, &s.b_dec}) t->requires_grad_();
  if (cfg.arch == SaeArch::JumpReLU) {
    HL_CHECK(cfg.initial_threshold > 0.f, "SAE: the initial threshold must be positive, got ", cfg.initial_threshold);
    s.log_threshold = Tensor::full({cfg.d_sae}, std::log(cfg.initial_threshold)).requires_grad_();
  }
  if (cfg.arch == SaeArch::BatchTopK) s.batch_threshold = Tensor::zeros({cfg.d_sae});
  return s;
}

Tensor Sae::threshold() const { return log_threshold.defined() ? exp(log_threshold) : file_threshold; }

Tensor Sae::normalize_input(const Tensor& x, Tensor* scale, Tensor* shift) const {
  HL_CHECK(x.ndim() == 2 && x.size(1) == cfg.d_in, "SAE: activations must be (N, ", cfg.d_in, "), got ", x.shape().str());
  if (!layer_norm()) return x;
  // SAELens's layer_norm: torch's std (n - 1), eps added to it, not under the root
  const Tensor mu = mean(x, {1}, true);                                                         // (N, 1)
  const Tensor centred = sub(x, mu);                                                            // (N, d_in)
  const float per = 1.f / float(std::max<int64_t>(cfg.d_in - 1, 1));
  const Tensor sd = sqrt(mul_scalar(sum(mul(centred, centred), {1}, true), per));               // (N, 1)
  if (scale) *scale = sd;
  if (shift) *shift = mu;
  return div(centred, add_scalar(sd, 1e-5f));
}

Tensor Sae::encoder_pre(const Tensor& x) const {
  HL_CHECK(x.ndim() == 2 && x.size(1) == cfg.d_in, "SAE: activations must be (N, ", cfg.d_in, "), got ", x.shape().str());
  const Tensor in = cfg.apply_b_dec_to_input ? sub(x, b_dec) : x;
  return add(matmul(in, W_enc), b_enc);
}

Tensor Sae::reconstruct(const Tensor& x, const Tensor& f) const {
  if (!layer_norm()) return decode(f);
  Tensor scale, shift;
  normalize_input(x, &scale, &shift);
  return add(mul(decode(f), scale), shift);  // SAELens scales back by std alone (no eps)
}

Tensor Sae::activate(const Tensor& pre, bool training) const {
  switch (cfg.arch) {
    case SaeArch::Standard: return relu(pre);
    case SaeArch::TopK: return topk_relu(pre, cfg.k);
    case SaeArch::BatchTopK:
      // inference: one threshold per feature, so a row's features do not depend on the batch
      if (!training) return jumprelu(pre, batch_threshold, 1.f);
      return batch_topk_relu(pre, std::min(cfg.k * pre.size(0), pre.numel()));
    case SaeArch::JumpReLU: return jumprelu(pre, threshold(), cfg.bandwidth);
  }
  return Tensor();
}

Tensor Sae::decode(const Tensor& f) const {
  HL_CHECK(f.ndim() == 2 && f.size(1) == cfg.d_sae, "SAE: features must be (N, ", cfg.d_sae, "), got ", f.shape().str());
  return add(matmul(f, W_dec), b_dec);
}

std::vector<NamedParam> Sae::params() const {
  std::vector<NamedParam> p = {{"W_enc", W_enc}, {"b_enc", b_enc}, {"W_dec", W_dec}, {"b_dec", b_dec}};
  if (log_threshold.defined()) p.push_back({"log_threshold", log_threshold});
  return p;
}


void Sae::remove_decoder_parallel_grad() const {
  if (!W_dec.grad().defined()) return;
  const int64_t R = cfg.d_sae, C = cfg.out_width();
  const float* w = W_dec.data();
  float* g = W_dec.grad().data();
  parallel_for(R, R * C, [&](int64_t r) {
    const double dot = dot_in_double_lanes(w + r * C, g + r * C, C), nn = dot_in_double_lanes(w + r * C, w + r * C, C);
    if (nn == 0) return;
    const float a = static_cast<float>(dot / nn);
    for (int64_t c = 0; c < C; ++c) g[r * C + c] -= a * w[r * C + c];
  });
}

void Sae::normalize_decoder_rows() const {
  const int64_t R = W_dec.size(0), C = W_dec.size(1);
  float* w = W_dec.data();
  parallel_for(R, R * C, [&](int64_t r) {
    const double nn = dot_in_double_lanes(w + r * C, w + r * C, C);
    if (nn == 0) return;
    const float inv = static_cast<float>(1.0 / std::sqrt(nn));
    for (int64_t c = 0; c < C; ++c) w[r * C + c] *= inv;
  });
}

Tensor Sae::decoder_row_norms() const {
  const int64_t R = W_dec.size(0), C = W_dec.size(1);
  Tensor n = Tensor::empty({R});
  const float* w = W_dec.data();
  for (int64_t r = 0; r < R; ++r) {
    double nn = 0;
    for (int64_t c = 0; c < C; ++c) nn += double(w[r * C + c]) * w[r * C + c];
    n.data()[r] = static_cast<float>(std::sqrt(nn));
  }
  return n;
}

Tensor sae_rows(const Tensor& activation, int64_t d_in, const std::string& hook) {
  HL_CHECK(activation.ndim() >= 2, "SAE at ", hook, ": the activation ", activation.shape().str(), " is not (B, T, ...)");
  const int64_t tokens = activation.size(0) * activation.size(1);
  const int64_t width = tokens ? activation.numel() / tokens : 0;
  HL_CHECK(width == d_in, "SAE at ", hook, ": the activation has ", width, " values per token ", activation.shape().str(),
           ", the SAE takes d_in = ", d_in);
  return reshape(activation, {tokens, d_in});
}

ForwardHook sae_splice(const Sae& sae) {
  HL_CHECK(!sae.cfg.transcoder(), "SAE splice: a transcoder replaces ", sae.cfg.hook_name_out, " from ", sae.cfg.hook_name,
           "'s activation (add_sae_splice)");
  return [sae](const Tensor& x, const std::string& name) {
    return reshape(sae.forward(sae_rows(x, sae.cfg.d_in, name)), x.shape());
  };
}

std::vector<HookPointInfo> sae_hook_points(const Sae& sae, bool use_error_term) {
  const std::string& at = sae.cfg.hook_name;
  const std::string in = "(B, T, " + std::to_string(sae.cfg.d_in) + ")", feat = "(B, T, " + std::to_string(sae.cfg.d_sae) + ")";
  std::vector<HookPointInfo> p = {
      {at + ".hook_sae_input", in, "the SAE's input: the activation, rows flattened"},
      {at + ".hook_sae_acts_pre", feat, "the SAE's encoder pre-activations"},
      {at + ".hook_sae_acts_post", feat, "the SAE's feature activations"},
      {at + ".hook_sae_recons", in, "the SAE's reconstruction f W_dec + b_dec"}};
  if (use_error_term) p.push_back({at + ".hook_sae_error", in, "the SAE's error x - x_hat, added back to the reconstruction"});
  p.push_back({at + ".hook_sae_output", in, "what the model goes on with: reconstruction (+ error)"});
  return p;
}

Hooks::Splice attached_sae_splice(std::shared_ptr<const Sae> sae, bool use_error_term) {
  return [sae, use_error_term](const Tensor& x, const Hooks& hooks) {
    const std::string& at = sae->cfg.hook_name;
    const int64_t B = x.size(0), T = x.size(1), N = B * T, F = sae->cfg.d_sae, D = sae->cfg.d_in;
    const Tensor x_rows = reshape(sae_rows(x, D, at), {B, T, D});
    const Tensor in = hooks.apply(at + ".hook_sae_input", x_rows);  // (B, T, d_in)
    const Tensor rows = reshape(in, {N, D});
    // the pre-activations and the features, each a point a hook may read or replace
    const Tensor pre = reshape(sae->pre_acts(rows), {B, T, F});
    const Tensor pre_h = hooks.apply(at + ".hook_sae_acts_pre", pre);
    const Tensor f = reshape(sae->activate(reshape(pre_h, {N, F}), false), {B, T, F});
    const Tensor acts = hooks.apply(at + ".hook_sae_acts_post", f);  // (B, T, d_sae)
    const bool edited = !in.same(x_rows) || !pre_h.same(pre) || !acts.same(f);
    // x_hat of the activation as the model made it, and of the edited features
    const Tensor x_flat = reshape(x_rows, {N, D});
    const Tensor recons_clean =
        reshape(sae->reconstruct(x_flat, edited ? sae->encode(x_flat) : reshape(f, {N, F})), {B, T, D});
    const Tensor recons_made = edited ? reshape(sae->reconstruct(rows, reshape(acts, {N, F})), {B, T, D}) : recons_clean;
    const Tensor recons = hooks.apply(at + ".hook_sae_recons", recons_made);
    Tensor out;
    if (!use_error_term) {
      out = recons;
    } else {
      // the error of the unedited SAE on the activation as the model made it (SAELens's)
      const Tensor err0 = sub(x_rows, recons_clean);
      const Tensor err = hooks.apply(at + ".hook_sae_error", err0);
      out = recons.same(recons_clean) && err.same(err0) ? x_rows : add(recons, err);  // nothing edited: x itself
    }
    return reshape(hooks.apply(at + ".hook_sae_output", out), x.shape());
  };
}

void add_sae_splice(Hooks& hooks, const Sae& sae) {
  HL_CHECK(!sae.cfg.hook_name.empty(), "SAE splice: the SAE names no hook point");
  if (!sae.cfg.transcoder()) {
    hooks.add_forward(sae.cfg.hook_name, sae_splice(sae));
    return;
  }
  HL_CHECK(hook_layer(sae.cfg.hook_name) <= hook_layer(sae.cfg.hook_name_out), "transcoder splice: its input ",
           sae.cfg.hook_name, " comes after its output ", sae.cfg.hook_name_out);
  // the input hook keeps its activation (unchanged) for the output hook of the same forward
  auto input = std::make_shared<Tensor>();
  hooks.add_forward(sae.cfg.hook_name, [input](const Tensor& x, const std::string&) {
    *input = x;
    return x;
  });
  hooks.add_forward(sae.cfg.hook_name_out, [sae, input](const Tensor& y, const std::string& name) {
    HL_CHECK(input->defined(), "transcoder splice: ", name, " was reached before its input ", sae.cfg.hook_name);
    const Tensor rows = sae.forward(sae_rows(*input, sae.cfg.d_in, sae.cfg.hook_name));
    *input = Tensor();
    HL_CHECK(rows.numel() == y.numel(), "transcoder splice at ", name, ": its output ", rows.shape().str(), " does not fill ", y.shape().str());
    return reshape(rows, y.shape());
  });
}

const std::string& sae_output_hook(const Sae& sae) { return sae.cfg.transcoder() ? sae.cfg.hook_name_out : sae.cfg.hook_name; }

void save_saelens(const Sae& sae, const std::string& dir) {
  const bool batch_topk = sae.cfg.arch == SaeArch::BatchTopK;
  std::string arch = batch_topk ? "jumprelu" : sae_arch_name(sae.cfg.arch);
  if (sae.cfg.transcoder()) arch = arch == "standard" ? "transcoder" : arch + "_transcoder";
  nlohmann::json cfg = {{"architecture", arch},
                        {"d_in", sae.cfg.d_in},
                        {"d_sae", sae.cfg.d_sae},
                        {"dtype", "float32"},
                        {"device", "cpu"},
                        {"apply_b_dec_to_input", sae.cfg.apply_b_dec_to_input},
                        {"normalize_activations", sae.cfg.normalize_activations},
                        {"hook_name", sae.cfg.hook_name}};
  if (sae.cfg.arch == SaeArch::TopK) cfg["k"] = sae.cfg.k;
  if (sae.cfg.transcoder()) cfg["d_out"] = sae.cfg.d_out, cfg["hook_name_out"] = sae.cfg.hook_name_out;
  SafetensorsWriter w;
  w.add("W_enc", sae.W_enc);
  w.add("b_enc", sae.b_enc);
  w.add("W_dec", sae.W_dec);
  w.add("b_dec", sae.b_dec);
  if (sae.cfg.arch == SaeArch::JumpReLU) {
    NoGradGuard no_grad;
    w.add("threshold", sae.threshold());
  }
  if (batch_topk) w.add("threshold", sae.batch_threshold);
  w.write(dir + "/sae_weights.safetensors");
  write_file_atomic(dir + "/cfg.json", cfg.dump(2) + "\n");
}

Sae load_saelens(const std::string& dir) {
  const std::string cfg_path = dir + "/cfg.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(cfg_path));
  } catch (const nlohmann::json::exception& e) {
    fail(cfg_path, ": not valid JSON (", e.what(), ")");
  }
  HL_CHECK(j.is_object(), cfg_path, ": not a JSON object");
  auto field = [&](const char* key) -> const nlohmann::json& {
    HL_CHECK(j.contains(key), cfg_path, ": field '", key, "' is missing");
    return j[key];
  };
  auto positive = [&](const char* key) {
    const nlohmann::json& v = field(key);
    HL_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, cfg_path, ": field '", key, "' must be a positive integer, got ", v.dump());
    return v.get<int64_t>();
  };
  SaeConfig cfg;
  std::string arch = j.value("architecture", std::string("standard"));
  const bool transcoder = arch == "transcoder" || arch == "topk_transcoder" || arch == "jumprelu_transcoder";
  HL_CHECK(transcoder || arch == "standard" || arch == "topk" || arch == "jumprelu", cfg_path, ": field 'architecture' is '", arch,
           "'; this reader takes standard, topk, jumprelu and their transcoders (transcoder, topk_transcoder, jumprelu_transcoder)");
  if (transcoder) arch = arch == "transcoder" ? "standard" : arch.substr(0, arch.size() - std::string("_transcoder").size());
  cfg.arch = parse_sae_arch(arch);
  cfg.d_in = positive("d_in");
  cfg.d_sae = positive("d_sae");
  if (transcoder) {
    cfg.d_out = positive("d_out");
    const nlohmann::json& out = field("hook_name_out");
    HL_CHECK(out.is_string() && !out.get<std::string>().empty(), cfg_path, ": field 'hook_name_out' must name a hook point, got ", out.dump());
    cfg.hook_name_out = out.get<std::string>();
    cfg.apply_b_dec_to_input = false;  // SAELens's transcoders never subtract b_dec (another width)
  }
  if (cfg.arch == SaeArch::TopK) cfg.k = positive("k");
  if (j.contains("apply_b_dec_to_input") && !transcoder) {
    HL_CHECK(j["apply_b_dec_to_input"].is_boolean(), cfg_path, ": field 'apply_b_dec_to_input' must be true or false");
    cfg.apply_b_dec_to_input = j["apply_b_dec_to_input"].get<bool>();
  }
  const nlohmann::json norm = j.value("normalize_activations", nlohmann::json("none"));
  HL_CHECK(norm.is_null() || norm == "none" || (norm == "layer_norm" && !transcoder), cfg_path,
           ": field 'normalize_activations' is ", norm.dump(),
           "; only 'none' and an SAE's 'layer_norm' are read (the others need the activations' scaling factor)");
  if (norm == "layer_norm") cfg.normalize_activations = "layer_norm";
  if (j.contains("hook_name") && j["hook_name"].is_string()) cfg.hook_name = j["hook_name"].get<std::string>();
  const std::string weights_path = dir + "/sae_weights.safetensors";
  const SafetensorsFile f = read_safetensors(weights_path);
  const Shape enc{cfg.d_in, cfg.d_sae}, dec{cfg.d_sae, cfg.out_width()}, in{cfg.out_width()}, feat{cfg.d_sae};
  Sae sae;
  sae.cfg = cfg;
  sae.W_enc = f.f32("W_enc", &enc).requires_grad_();
  sae.b_enc = f.f32("b_enc", &feat).requires_grad_();
  sae.W_dec = f.f32("W_dec", &dec).requires_grad_();
  sae.b_dec = f.f32("b_dec", &in).requires_grad_();
  if (cfg.arch == SaeArch::JumpReLU) {
    sae.file_threshold = f.f32("threshold", &feat);
    for (int64_t i = 0; i < cfg.d_sae; ++i) {
      const float t = sae.file_threshold.data()[i];
      HL_CHECK(t >= 0.f && std::isfinite(t), weights_path, ": threshold[", i, "] = ", t, " is not a non-negative number");
    }
  }
  return sae;
}

Tensor geometric_median(const Tensor& x, int max_iters, float tol) {
  HL_CHECK(x.ndim() == 2 && x.size(0) >= 1, "geometric_median: x must be (N, d) with N >= 1, got ", x.shape().str());
  const int64_t N = x.size(0), D = x.size(1);
  const float* p = x.data();
  std::vector<double> m(D, 0.0), next(D);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t d = 0; d < D; ++d) m[d] += p[i * D + d] / double(N);  // start at the mean
  for (int it = 0; it < max_iters; ++it) {
    std::fill(next.begin(), next.end(), 0.0);
    double wsum = 0;
    for (int64_t i = 0; i < N; ++i) {
      double dist = 0;
      for (int64_t d = 0; d < D; ++d) dist += (p[i * D + d] - m[d]) * (p[i * D + d] - m[d]);
      // a point on the iterate gets a large finite weight instead of a division by zero
      const double w = 1.0 / std::max(std::sqrt(dist), 1e-12);
      wsum += w;
      for (int64_t d = 0; d < D; ++d) next[d] += w * p[i * D + d];
    }
    double moved = 0, scale = 0;
    for (int64_t d = 0; d < D; ++d) {
      next[d] /= wsum;
      moved += (next[d] - m[d]) * (next[d] - m[d]);
      scale += next[d] * next[d];
    }
    m.swap(next);
    if (std::sqrt(moved) <= tol * std::max(1.0, std::sqrt(scale))) break;
  }
  Tensor out = Tensor::empty({D});
  for (int64_t d = 0; d < D; ++d) out.data()[d] = static_cast<float>(m[d]);
  return out;
}

}  // namespace hl
