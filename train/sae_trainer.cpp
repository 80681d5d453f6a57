#include "sae_trainer.h"

#include <algorithm>
#include <cmath>

#include "lib/stop.h"

namespace hl {

namespace {

Tensor checked_batch(const ActivationSource& source, int64_t rows, int64_t d_in) {
  Tensor x = source(rows);
  HL_CHECK(x.defined() && x.ndim() == 2 && x.size(0) == rows && x.size(1) == d_in, "SAE training: the activations must be (",
           rows, ", ", d_in, "), got ", x.defined() ? x.shape().str() : std::string("nothing"));
  const float* p = x.data();
  for (int64_t i = 0; i < x.numel(); ++i)
    HL_CHECK(std::isfinite(p[i]), "SAE training: the activations hold a non-finite value (row ", i / d_in, ", column ", i % d_in, ")");
  return x;
}

Sae initial_sae(const SaeConfig& cfg, const SaeTrainArgs& args, const ActivationSource& source) {
  HL_CHECK(args.steps >= 0 && args.batch >= 1 && args.lr > 0.f && args.warmup >= 0 && args.dead_after >= 1 && args.init_rows >= 1,
           "SAE training: steps >= 0, batch >= 1, lr > 0, warmup >= 0, dead_after >= 1 and init_rows >= 1 are required");
  Rng rng(args.seed);
  Sae sae = Sae::init(cfg, rng);
  if (cfg.apply_b_dec_to_input) {
    const Tensor sample = checked_batch(source, args.init_rows, cfg.d_in);
    Tensor centre = args.b_dec_geometric_median ? geometric_median(sample) : Tensor();
    if (!centre.defined()) {
      centre = Tensor::zeros({cfg.d_in});
      for (int64_t r = 0; r < sample.size(0); ++r)
        for (int64_t c = 0; c < cfg.d_in; ++c) centre.data()[c] += sample.data()[r * cfg.d_in + c] / float(sample.size(0));
    }
    sae.b_dec.copy_from(centre);
  }
  return sae;
}

}  // namespace

ActivationSource model_activations(TransformerLM& model, const std::string& hook, std::vector<Ids> batches,
                                   int64_t buffer_rows, uint64_t seed) {
  bool known = false;
  for (const auto& [name, shape] : hook_points(model.cfg)) known = known || name == hook;
  HL_CHECK(known, "SAE: the model has no hook point '", hook, "' (`headlab hooks` lists them)");
  HL_CHECK(!batches.empty(), "SAE: no token batches to read activations from");
  HL_CHECK(buffer_rows >= 1, "SAE: the shuffle buffer must hold at least 1 row, got ", buffer_rows);
  struct Buffer {
    std::vector<float> rows;  // (n, d) row-major
    int64_t d = 0, next_batch = 0;
    Rng rng;
  };
  auto buf = std::make_shared<Buffer>();
  buf->rng.seed_with(seed);
  TransformerLM* m = &model;
  return [m, hook, batches = std::move(batches), buffer_rows, buf](int64_t rows) {
    NoGradGuard no_grad;
    auto size = [&] { return buf->d ? static_cast<int64_t>(buf->rows.size()) / buf->d : 0; };
    while (size() < std::max(buffer_rows, rows)) {
      throw_if_stopped();
      const Ids& ids = batches[static_cast<size_t>(buf->next_batch++ % static_cast<int64_t>(batches.size()))];
      ForwardOptions opt;
      opt.stop_at_layer = hook_layer(hook) >= 0 ? hook_layer(hook) + 1 : -1;  // nothing after the hook's block
      Hooks hooks;
      ActivationCache cache;
      hooks.cache(cache, name_is(hook));
      opt.hooks = &hooks;
      m->forward(ids, opt);
      const Tensor act = cache[hook];
      const int64_t tokens = act.size(0) * act.size(1);
      if (!buf->d) buf->d = act.numel() / std::max<int64_t>(tokens, 1);
      const Tensor r = sae_rows(act, buf->d, hook);
      buf->rows.insert(buf->rows.end(), r.data(), r.data() + r.numel());
    }
    const int64_t d = buf->d;
    Tensor out = Tensor::empty({rows, d});
    for (int64_t i = 0; i < rows; ++i) {
      // take a random row; the last row fills its place
      const int64_t n = size(), j = static_cast<int64_t>(buf->rng.next_u64() % static_cast<uint64_t>(n));
      std::copy_n(buf->rows.data() + j * d, d, out.data() + i * d);
      std::copy_n(buf->rows.data() + (n - 1) * d, d, buf->rows.data() + j * d);
      buf->rows.resize(static_cast<size_t>((n - 1) * d));
    }
    return out;
  };
}

SaeTrainer::SaeTrainer(const SaeConfig& cfg, const SaeTrainArgs& args, ActivationSource source)
    : cfg_(cfg), args_(args), source_(std::move(source)), sae_(initial_sae(cfg, args, source_)),
      opt_(sae_.params(), args.lr), rows_since_fired_(static_cast<size_t>(cfg.d_sae), 0) {}

std::vector<bool> SaeTrainer::dead_features() const {
  std::vector<bool> dead(rows_since_fired_.size());
  for (size_t j = 0; j < dead.size(); ++j) dead[j] = rows_since_fired_[j] >= args_.dead_after;
  return dead;
}

SaeStepStats SaeTrainer::step() {
  const int64_t N = args_.batch, F = cfg_.d_sae, D = cfg_.d_in;
  const Tensor x = checked_batch(source_, N, D);
  const bool unit_decoder = cfg_.arch != SaeArch::Standard;  // Standard: the L1 carries the norms

  const Tensor pre = sae_.pre_acts(x);   // (N, F)
  const Tensor f = sae_.activate(pre, true);
  const Tensor x_hat = sae_.decode(f);   // (N, D)
  const Tensor err = sub(x_hat, x);
  const Tensor mse = mean(sum(mul(err, err), {1}));
  Tensor sparsity;
  if (cfg_.arch == SaeArch::Standard) {
    const Tensor norms = sqrt(sum(mul(sae_.W_dec, sae_.W_dec), {1}));  // (F)
    sparsity = mul_scalar(mean(sum(mul(f, norms), {1})), args_.l1_coefficient);
  } else if (cfg_.arch == SaeArch::JumpReLU) {
    sparsity = mul_scalar(mean(sum(jumprelu_step(pre, sae_.threshold(), cfg_.bandwidth), {1})), args_.l0_coefficient);
  }

  // AuxK: the dead features' k_aux largest pre-activations reconstruct what the live ones miss.
  const std::vector<bool> dead = dead_features();
  const int64_t n_dead = std::count(dead.begin(), dead.end(), true);
  Tensor aux;
  if (args_.aux_coefficient > 0.f && n_dead > 0) {
    const int64_t k_aux = std::max<int64_t>(1, D / 2);
    Tensor alive = Tensor::zeros({1, F});
    for (int64_t j = 0; j < F; ++j) alive.data()[j] = dead[j] ? 0.f : 1.f;
    const Tensor dead_pre = masked_fill(pre, alive, -1e30f);
    const Tensor aux_f = topk_relu(dead_pre, std::min(k_aux, n_dead));
    const Tensor residual = sub(x, x_hat).detach();
    const Tensor aux_err = sub(matmul(aux_f, sae_.W_dec), residual);
    const float scale = std::min(1.f, float(n_dead) / float(k_aux));
    aux = mul_scalar(mean(sum(mul(aux_err, aux_err), {1})), args_.aux_coefficient * scale);
  }
  Tensor loss = mse;
  if (sparsity.defined()) loss = add(loss, sparsity);
  if (aux.defined()) loss = add(loss, aux);

  opt_.zero_grad();
  loss.backward();
  if (unit_decoder) sae_.remove_decoder_parallel_grad();
  opt_.lr = args_.warmup > 0 && step_ < args_.warmup ? args_.lr * float(step_ + 1) / float(args_.warmup) : args_.lr;
  opt_.step();
  if (unit_decoder) sae_.normalize_decoder_rows();

  SaeStepStats s;
  s.step = step_;
  s.loss = loss.item(), s.mse = mse.item();
  s.sparsity = sparsity.defined() ? sparsity.item() : 0.f;
  s.aux = aux.defined() ? aux.item() : 0.f;
  const float* fd = f.data();
  int64_t active = 0;
  float min_kept = INFINITY;
  for (int64_t j = 0; j < F; ++j) {
    bool fired = false;
    for (int64_t r = 0; r < N; ++r)
      if (fd[r * F + j] != 0.f) fired = true, ++active, min_kept = std::min(min_kept, fd[r * F + j]);
    rows_since_fired_[j] = fired ? 0 : rows_since_fired_[j] + N;
  }
  // BatchTopK at inference: a threshold at the running mean of the smallest kept activation
  if (cfg_.arch == SaeArch::BatchTopK && std::isfinite(min_kept)) {
    const float t = step_ == 0 ? min_kept : 0.99f * sae_.batch_threshold.data()[0] + 0.01f * min_kept;
    sae_.batch_threshold.fill_(t);
  }
  s.l0 = float(active) / float(N);
  double var = 0, e2 = 0;
  for (int64_t c = 0; c < D; ++c) {
    double m = 0;
    for (int64_t r = 0; r < N; ++r) m += x.data()[r * D + c] / double(N);
    for (int64_t r = 0; r < N; ++r) {
      const double v = x.data()[r * D + c] - m, e = err.data()[r * D + c];
      var += v * v, e2 += e * e;
    }
  }
  s.explained_variance = var > 0 ? float(1.0 - e2 / var) : 0.f;
  s.dead_fraction = float(n_dead) / float(F);
  ++step_;
  return s;
}

void SaeTrainer::train(const std::function<void(const SaeStepStats&)>& on_step) {
  while (step_ < args_.steps) {
    throw_if_stopped();
    const SaeStepStats s = step();
    if (on_step) on_step(s);
  }
}

}  // namespace hl
