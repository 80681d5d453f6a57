#include "sae_trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "lib/fileutil.h"
#include "lib/threads.h"
#include "lib/safetensors.h"
#include "lib/stop.h"
#include "train/run_dir.h"

namespace hl {

namespace {

Tensor checked_batch(const ActivationSource& source, int64_t rows, int64_t d_in) {
  Tensor x = source(rows);
  HL_CHECK(x.defined() && x.ndim() == 2 && x.size(0) == rows && x.size(1) == d_in, "SAE training: the activations must be (",
           rows, ", ", d_in, "), got ", x.defined() ? x.shape().str() : std::string("nothing"));
  const float* p = x.data();
  // any non-finite value (all exponent bits set) by an OR over the bits, a loop that vectorises;
  // then found for the message
  uint32_t bad = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, 4);
    bad |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);
  }
  for (int64_t i = 0; bad && i < x.numel(); ++i)
    HL_CHECK(std::isfinite(p[i]), "SAE training: the activations hold a non-finite value (row ", i / d_in, ", column ", i % d_in, ")");
  return x;
}

// A source's rows: an autoencoder's x (N, d_in), or a transcoder's [x | target] (N, d_in + d_out).
int64_t source_width(const SaeConfig& cfg) { return cfg.transcoder() ? cfg.d_in + cfg.d_out : cfg.d_in; }

// Columns [from, from + n) of rows (N, width), as their own (N, n) tensor.
Tensor columns(const Tensor& rows, int64_t from, int64_t n) {
  const int64_t N = rows.size(0), W = rows.size(1);
  Tensor out = Tensor::empty({N, n});
  for (int64_t r = 0; r < N; ++r) std::copy_n(rows.data() + r * W + from, n, out.data() + r * n);
  return out;
}

Sae initial_sae(const SaeConfig& cfg, const SaeTrainArgs& args, const ActivationSource& source) {
  HL_CHECK(args.steps >= 0 && args.batch >= 1 && args.lr > 0.f && args.warmup >= 0 && args.lr_decay_steps >= 0 && args.dead_after >= 1 && args.init_rows >= 1,
           "SAE training: steps >= 0, batch >= 1, lr > 0, warmup >= 0, lr_decay_steps >= 0, dead_after >= 1 and init_rows >= 1 are required");
  HL_CHECK(args.jumprelu_sparsity == "step" || args.jumprelu_sparsity == "tanh", "SAE training: the JumpReLU sparsity term '",
           args.jumprelu_sparsity, "' is not one of step, tanh");
  HL_CHECK(args.tanh_scale > 0.f && args.pre_act_coefficient >= 0.f, "SAE training: tanh_scale > 0 and pre_act_coefficient >= 0 are required");
  Rng rng(args.seed);
  Sae sae = Sae::init(cfg, rng);
  // b_dec at the centre of what the SAE reconstructs: the input, or a transcoder's target
  if (cfg.apply_b_dec_to_input || cfg.transcoder()) {
    const Tensor rows = checked_batch(source, args.init_rows, source_width(cfg));
    const Tensor sample = cfg.transcoder() ? columns(rows, cfg.d_in, cfg.d_out) : sae.normalize_input(rows);
    const int64_t D = cfg.out_width();
    Tensor centre = args.b_dec_geometric_median ? geometric_median(sample) : Tensor();
    if (!centre.defined()) {
      centre = Tensor::zeros({D});
      for (int64_t r = 0; r < sample.size(0); ++r)
        for (int64_t c = 0; c < D; ++c) centre.data()[c] += sample.data()[r * D + c] / float(sample.size(0));
    }
    sae.b_dec.copy_from(centre);
  }
  return sae;
}

}  // namespace

float sae_learning_rate(const SaeTrainArgs& args, int64_t step) {
  float lr = args.lr;
  if (args.warmup > 0 && step < args.warmup) lr *= float(step + 1) / float(args.warmup);
  const int64_t decay_from = args.steps - args.lr_decay_steps;
  if (args.lr_decay_steps > 0 && step >= decay_from) lr *= float(args.steps - step) / float(args.lr_decay_steps);
  return lr;
}

std::vector<Batch> unpadded_batches(const std::vector<Ids>& ids) {
  std::vector<Batch> out;
  for (const Ids& i : ids) out.push_back(Batch{i, Ids(i.shape), Tensor()});
  return out;
}

ActivationStream model_activation_stream(TransformerLM& model, const std::vector<std::string>& hooks, std::vector<Batch> batches,
                                         int64_t buffer_rows, uint64_t seed) {
  HL_CHECK(!hooks.empty(), "SAE: no hook point to read");
  int stop_at = 0;  // the forward stops after the last hook's block (-1: the whole model)
  for (const std::string& hook : hooks) {
    bool known = false;
    for (const auto& [name, shape] : hook_points(model.cfg)) known = known || name == hook;
    HL_CHECK(known, "SAE: the model has no hook point '", hook, "' (`headlab hooks` lists them)");
    stop_at = stop_at < 0 || hook_layer(hook) < 0 ? -1 : std::max(stop_at, hook_layer(hook) + 1);
  }
  HL_CHECK(!batches.empty(), "SAE: no token batches to read activations from");
  HL_CHECK(buffer_rows >= 1, "SAE: the shuffle buffer must hold at least 1 row, got ", buffer_rows);
  struct Buffer {
    std::vector<float> rows;  // (n, d) row-major: each token's hooks' values side by side
    int64_t d = 0, next_batch = 0;
    Rng rng;
  };
  auto buf = std::make_shared<Buffer>();
  buf->rng.seed_with(seed);
  TransformerLM* m = &model;
  ActivationStream stream;
  stream.save = [buf](SafetensorsWriter& w) {
    if (!buf->d) return;  // nothing read yet: a fresh stream is the state
    w.add("stream.buffer", Tensor::from({static_cast<int64_t>(buf->rows.size()) / buf->d, buf->d}, buf->rows));
    w.set_meta("stream.next_batch", std::to_string(buf->next_batch));
    const std::array<uint64_t, 4> st = buf->rng.state();
    w.set_meta("stream.rng", nlohmann::json(std::vector<uint64_t>(st.begin(), st.end())).dump());
  };
  stream.load = [buf](const SafetensorsFile& f) {
    if (!f.has("stream.buffer")) return;
    const Tensor rows = f.f32("stream.buffer");
    HL_CHECK(rows.ndim() == 2, f.source, ": 'stream.buffer' must be (rows, width), got ", rows.shape().str());
    std::vector<uint64_t> st;
    try {
      buf->next_batch = std::stoll(f.meta("stream.next_batch"));
      st = nlohmann::json::parse(f.meta("stream.rng")).get<std::vector<uint64_t>>();
    } catch (const std::exception&) {
      fail(f.source, ": metadata 'stream.next_batch' / 'stream.rng' is not the stream's position");
    }
    HL_CHECK(st.size() == 4, f.source, ": metadata 'stream.rng' must hold 4 numbers, got ", st.size());
    buf->d = rows.size(1);
    buf->rows.assign(rows.data(), rows.data() + rows.numel());
    buf->rng.set_state({st[0], st[1], st[2], st[3]});
  };
  stream.next = [m, hooks, stop_at, batches = std::move(batches), buffer_rows, buf](int64_t rows) {
    NoGradGuard no_grad;
    auto size = [&] { return buf->d ? static_cast<int64_t>(buf->rows.size()) / buf->d : 0; };
    while (size() < std::max(buffer_rows, rows)) {
      throw_if_stopped();
      const Batch& batch = batches[static_cast<size_t>(buf->next_batch++ % static_cast<int64_t>(batches.size()))];
      ForwardOptions opt;
      opt.key_padding = batch.key_padding;
      opt.stop_at_layer = stop_at;  // nothing after the last hook's block
      Hooks hk;
      ActivationCache cache;
      for (const std::string& hook : hooks) hk.cache(cache, name_is(hook));
      opt.hooks = &hk;
      m->forward(batch.inputs, opt);
      std::vector<Tensor> parts;
      int64_t d = 0;
      for (const std::string& hook : hooks) {
        const Tensor act = cache[hook];
        const int64_t tokens = act.size(0) * act.size(1);
        parts.push_back(sae_rows(act, act.numel() / std::max<int64_t>(tokens, 1), hook));
        d += parts.back().size(1);
      }
      if (!buf->d) buf->d = d;
      const int64_t T = batch.inputs.shape[1];
      int64_t at = size(), tokens = 0;
      for (int64_t r = 0; r < batch.size(); ++r) tokens += batch.row_tokens(r);
      buf->rows.resize(static_cast<size_t>((at + tokens) * d));
      for (int64_t r = 0; r < batch.size(); ++r)
        for (int64_t t = r * T, end = r * T + batch.row_tokens(r); t < end; ++t, ++at) {  // the row's tokens, not its padding
          float* dst = buf->rows.data() + at * d;
          for (const Tensor& p : parts) dst = std::copy_n(p.data() + t * p.size(1), p.size(1), dst);
        }
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
  return stream;
}

SaeConfig sae_config_for_model(TransformerLM& model, const Ids& ids, const std::string& hook, const std::string& hook_out,
                               const std::string& architecture, int64_t expansion) {
  HL_CHECK(ids.shape.ndim == 2 && ids.shape[0] >= 1, "SAE: token ids must be (B, T), got ", ids.shape.str());
  HL_CHECK(expansion >= 1, "SAE: the expansion must be at least 1, got ", expansion);
  // one sequence's forward gives the hook's width
  const int64_t T = ids.shape[1];
  const Ids one(Shape{1, T}, std::vector<int32_t>(ids.data.begin(), ids.data.begin() + T));
  SaeConfig cfg;
  cfg.arch = parse_sae_arch(architecture);
  cfg.hook_name = hook;
  cfg.d_in = model_activations(model, hook, {one}, 1, 0)(1).size(1);
  if (!hook_out.empty()) {  // a transcoder: b_dec is its output's bias
    cfg.hook_name_out = hook_out, cfg.apply_b_dec_to_input = false;
    cfg.d_out = model_activations(model, hook_out, {one}, 1, 0)(1).size(1);
  }
  cfg.d_sae = cfg.d_in * expansion;
  // BatchTopK's paper trains on rows normalised one by one (models/sae.h: normalize_activations);
  // a transcoder's target is another activation, so it keeps its rows as they are
  if (cfg.arch == SaeArch::BatchTopK && !cfg.transcoder()) cfg.normalize_activations = "layer_norm";
  return cfg;
}

double sae_training_bytes(const SaeConfig& cfg, int64_t batch, int64_t buffer_rows) {
  const double F = double(cfg.d_sae), width = double(cfg.d_in + cfg.out_width());
  return 4.0 * (4.0 * width * F + 6.0 * double(batch) * F + double(buffer_rows) * width);
}

std::vector<std::string> sae_source_hooks(const SaeConfig& cfg) {
  if (cfg.transcoder()) return {cfg.hook_name, cfg.hook_name_out};
  return {cfg.hook_name};
}

SaeTrainer::SaeTrainer(const SaeConfig& cfg, const SaeTrainArgs& args, ActivationStream stream)
    : cfg_(cfg), args_(args), stream_(std::move(stream)), sae_(initial_sae(cfg, args, stream_.next)),
      opt_(sae_.params(), args.lr), rows_since_fired_(static_cast<size_t>(cfg.d_sae), 0) {}

std::vector<bool> SaeTrainer::dead_features() const {
  std::vector<bool> dead(rows_since_fired_.size());
  for (size_t j = 0; j < dead.size(); ++j) dead[j] = rows_since_fired_[j] >= args_.dead_after;
  return dead;
}

SaeStepStats SaeTrainer::step() {
  const int64_t N = args_.batch, F = cfg_.d_sae, D = cfg_.out_width();
  const Tensor rows = checked_batch(stream_.next, N, source_width(cfg_));
  // x (N, d_in) as the encoder sees it (normalised with layer_norm: the loss is in those units,
  // as the BatchTopK paper's) and what x_hat should be, target (N, D): x itself, or a
  // transcoder's output
  const Tensor x = sae_.normalize_input(cfg_.transcoder() ? columns(rows, 0, cfg_.d_in) : rows);
  const Tensor target = cfg_.transcoder() ? columns(rows, cfg_.d_in, cfg_.d_out) : x;
  const bool unit_decoder = cfg_.arch != SaeArch::Standard;  // Standard: the L1 carries the norms
  const SmallStepOnOneThread small_step(double(N) * double(F) * double(cfg_.d_in));  // the encoder's product

  // AuxK: the dead features' k_aux largest pre-activations reconstruct what the live ones miss.
  dead_.resize(static_cast<size_t>(F));
  for (int64_t j = 0; j < F; ++j) dead_[j] = rows_since_fired_[j] >= args_.dead_after;
  const int64_t n_dead = std::count(dead_.begin(), dead_.end(), true);
  const int64_t k_aux = std::max<int64_t>(1, D / 2);
  const float aux_weight = args_.aux_coefficient * std::min(1.f, float(n_dead) / float(k_aux));
  const bool with_aux = args_.aux_coefficient > 0.f && n_dead > 0;
  const bool sparse = args_.sparse_kernels && (cfg_.arch == SaeArch::TopK || cfg_.arch == SaeArch::BatchTopK);

  Tensor loss, mse, sparsity, aux, pre_act, err, f;
  SaeSparseLoss sparse_loss;
  if (sparse) {
    if (!sparse_work_) sparse_work_ = make_sae_sparse_work();
    sparse_loss = sae_sparse_loss(sae_, x, target, {with_aux ? &dead_ : nullptr, k_aux, aux_weight}, sparse_work_);
    loss = sparse_loss.loss, err = sparse_loss.err;
  } else {
    const Tensor pre = sae_.encoder_pre(x);  // (N, F)
    f = sae_.activate(pre, true);
    const Tensor x_hat = sae_.decode(f);  // (N, D)
    err = sub(x_hat, target);
    mse = mean(sum(mul(err, err), {1}));
    const float ramp = args_.sparsity_warmup > 0 ? std::min(1.f, float(step_ + 1) / float(args_.sparsity_warmup)) : 1.f;
    // the decoder rows' norms (F), once for the terms that weigh activations by them
    const bool pre_act_on = cfg_.arch == SaeArch::JumpReLU && args_.pre_act_coefficient > 0.f && n_dead > 0;
    const bool tanh_l0 = cfg_.arch == SaeArch::JumpReLU && args_.jumprelu_sparsity == "tanh";
    const Tensor norms =
        cfg_.arch == SaeArch::Standard || tanh_l0 || pre_act_on ? sqrt(sum(mul(sae_.W_dec, sae_.W_dec), {1})) : Tensor();
    if (cfg_.arch == SaeArch::Standard) {
      sparsity = mul_scalar(mean(sum(mul(f, norms), {1})), args_.l1_coefficient * ramp);
    } else if (tanh_l0) {
      sparsity = mul_scalar(mean(sum(tanh(mul_scalar(mul(f, norms), args_.tanh_scale)), {1})), args_.l0_coefficient * ramp);
    } else if (cfg_.arch == SaeArch::JumpReLU) {
      sparsity = mul_scalar(mean(sum(jumprelu_step(pre, sae_.threshold(), cfg_.bandwidth), {1})), args_.l0_coefficient * ramp);
    }
    if (with_aux) {
      Tensor alive = Tensor::zeros({1, F});
      for (int64_t j = 0; j < F; ++j) alive.data()[j] = dead_[j] ? 0.f : 1.f;
      const Tensor dead_pre = masked_fill(pre, alive, -1e30f);
      const Tensor aux_f = topk(dead_pre, std::min(k_aux, n_dead));  // negative ones too: they need the gradient most
      const Tensor residual = sub(target, x_hat).detach();
      const Tensor aux_err = sub(matmul(aux_f, sae_.W_dec), residual);
      aux = mul_scalar(mean(sum(mul(aux_err, aux_err), {1})), aux_weight);
    }
    // JumpReLU's pre-activation loss: a dead feature's pre-activations pulled up to its threshold
    if (pre_act_on) {
      Tensor dead_mask = Tensor::zeros({1, F});  // 1 on dead features
      for (int64_t j = 0; j < F; ++j) dead_mask.data()[j] = dead_[j] ? 1.f : 0.f;
      const Tensor below = relu(add(neg(pre), sae_.threshold()));        // (N, F): relu(threshold - pre)
      pre_act = mul_scalar(mean(sum(mul(mul(below, dead_mask), norms), {1})), args_.pre_act_coefficient);
    }
    loss = mse;
    if (sparsity.defined()) loss = add(loss, sparsity);
    if (pre_act.defined()) loss = add(loss, pre_act);
    if (aux.defined()) loss = add(loss, aux);
  }

  opt_.zero_grad();
  loss.backward();
  if (unit_decoder) sae_.remove_decoder_parallel_grad();
  opt_.lr = sae_learning_rate(args_, step_);
  opt_.step();
  if (unit_decoder) sae_.normalize_decoder_rows();

  SaeStepStats s;
  s.step = step_;
  s.loss = loss.item();
  s.mse = sparse ? sparse_loss.mse : mse.item();
  s.sparsity = sparsity.defined() ? sparsity.item() : 0.f;
  s.aux = sparse ? (with_aux ? aux_weight * sparse_loss.aux : 0.f)
               : (aux.defined() ? aux.item() : 0.f) + (pre_act.defined() ? pre_act.item() : 0.f);
  int64_t active = 0;
  float min_kept = INFINITY;
  thread_local std::vector<char> fired;  // reused: no allocation in the steady state
  fired.assign(static_cast<size_t>(F), 0);
  auto count = [&](int64_t j, float v) {
    if (v != 0.f) fired[j] = 1, ++active, min_kept = std::min(min_kept, v);
  };
  if (sparse) {  // in locals: through the lambda's references min_kept went to memory each entry (a store-load chain)
    char* fired_at = fired.data();
    const int32_t* index = sparse_loss.index.data();
    const float* value = sparse_loss.value.data();
    int64_t n_active = 0;
    float least = INFINITY;
    for (size_t e = 0, n = sparse_loss.index.size(); e < n; ++e) {
      const float v = value[e];
      fired_at[index[e]] |= v != 0.f;
      n_active += v != 0.f;
      least = std::min(least, v != 0.f ? v : INFINITY);
    }
    active = n_active, min_kept = least;
  } else {
    const float* fd = f.data();  // row by row: f is (N, F) row-major
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < F; ++j) count(j, fd[r * F + j]);
  }
  for (int64_t j = 0; j < F; ++j) rows_since_fired_[j] = fired[j] ? 0 : rows_since_fired_[j] + N;
  // BatchTopK at inference: a threshold at the running mean of the smallest kept activation
  if (cfg_.arch == SaeArch::BatchTopK && std::isfinite(min_kept)) {
    const float t = step_ == 0 ? min_kept : 0.99f * sae_.batch_threshold.data()[0] + 0.01f * min_kept;
    sae_.batch_threshold.fill_(t);
  }
  s.l0 = float(active) / float(N);
  // per-column sums, read row by row (the column loops vectorise; one running sum would not)
  thread_local std::vector<double> m, col_var, col_e2;
  m.assign(static_cast<size_t>(D), 0.0), col_var.assign(static_cast<size_t>(D), 0.0), col_e2.assign(static_cast<size_t>(D), 0.0);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < D; ++c) m[c] += target.data()[r * D + c];
  for (int64_t c = 0; c < D; ++c) m[c] /= double(N);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < D; ++c) {
      const double v = target.data()[r * D + c] - m[c], e = err.data()[r * D + c];
      col_var[c] += v * v, col_e2[c] += e * e;
    }
  double var = 0, e2 = 0;
  for (int64_t c = 0; c < D; ++c) var += col_var[c], e2 += col_e2[c];
  s.explained_variance = var > 0 ? float(1.0 - e2 / var) : 0.f;
  s.dead_fraction = float(n_dead) / float(F);
  ++step_;
  return s;
}

nlohmann::json SaeTrainer::settings() const {
  return {{"architecture", sae_arch_name(cfg_.arch)}, {"d_in", cfg_.d_in}, {"d_sae", cfg_.d_sae}, {"k", cfg_.k},
          {"bandwidth", cfg_.bandwidth}, {"initial_threshold", cfg_.initial_threshold},
          {"apply_b_dec_to_input", cfg_.apply_b_dec_to_input}, {"normalize_activations", cfg_.normalize_activations},
          {"hook_name", cfg_.hook_name},
          {"hook_name_out", cfg_.hook_name_out}, {"d_out", cfg_.d_out}, {"steps", args_.steps}, {"batch", args_.batch},
          {"lr", args_.lr}, {"warmup", args_.warmup}, {"lr_decay_steps", args_.lr_decay_steps}, {"l1_coefficient", args_.l1_coefficient},
          {"l0_coefficient", args_.l0_coefficient}, {"sparsity_warmup", args_.sparsity_warmup},
          {"jumprelu_sparsity", args_.jumprelu_sparsity}, {"tanh_scale", args_.tanh_scale},
          {"pre_act_coefficient", args_.pre_act_coefficient},
          {"aux_coefficient", args_.aux_coefficient}, {"dead_after", args_.dead_after},
          {"b_dec_geometric_median", args_.b_dec_geometric_median}, {"init_rows", args_.init_rows}, {"seed", args_.seed}};
}

void SaeTrainer::save_state(const std::string& path) const {
  SafetensorsWriter w;
  for (const NamedParam& p : sae_.params()) w.add(p.name, p.param);
  for (const auto& [name, t] : opt_.state()) w.add(name, t);
  if (sae_.batch_threshold.defined()) w.add("batch_threshold", sae_.batch_threshold);
  w.set_meta("rows_since_fired", nlohmann::json(rows_since_fired_).dump());  // int64, past int32's range in long runs
  w.set_meta("step", std::to_string(step_));
  w.set_meta("settings", settings().dump());
  if (stream_.save) stream_.save(w);
  w.write(path);
}

void SaeTrainer::load_state(const std::string& path) {
  HL_CHECK(step_ == 0, "SAE training: load_state on a trainer that has already trained ", step_, " steps");
  const SafetensorsFile f = read_safetensors(path);
  nlohmann::json stored;
  try {
    stored = nlohmann::json::parse(f.meta("settings"));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": the stored settings are not valid JSON (", e.what(), ")");
  }
  // a state saved before normalize_activations existed trained without it
  if (stored.is_object() && !stored.contains("normalize_activations")) stored["normalize_activations"] = "none";
  const std::string diff = first_json_difference(stored, settings(), {"/steps"}, "in the saved state", "now");
  HL_CHECK(diff.empty(), path, ": cannot resume: ", diff);
  int64_t step = 0;
  try {
    step = std::stoll(f.meta("step"));
  } catch (const std::logic_error&) {
    fail(path, ": metadata 'step' is not a number");
  }
  HL_CHECK(step >= 0 && step <= args_.steps, path, ": the saved step ", step, " is not within 0..", args_.steps, " (the steps asked for)");
  NoGradGuard no_grad;
  for (NamedParam p : sae_.params()) p.param.copy_from(f.f32(p.name, &p.param.shape()));  // shares the storage
  std::vector<std::pair<std::string, Tensor>> moments = opt_.state();
  for (auto& [name, t] : moments) t = f.f32(name, &t.shape());
  opt_.load_state(moments, step);
  if (sae_.batch_threshold.defined()) sae_.batch_threshold.copy_from(f.f32("batch_threshold", &sae_.batch_threshold.shape()));
  std::vector<int64_t> fired;
  try {
    fired = nlohmann::json::parse(f.meta("rows_since_fired")).get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception&) {
    fail(path, ": metadata 'rows_since_fired' is not a list of integers");
  }
  HL_CHECK(fired.size() == rows_since_fired_.size(), path, ": 'rows_since_fired' has ", fired.size(), " values, expected ", cfg_.d_sae);
  rows_since_fired_ = fired;
  if (stream_.load && f.has("stream.buffer")) {
    stream_.load(f);
  } else {  // the stream as it was at `step`: the same requests, their rows dropped
    for (int64_t s = 0; s < step; ++s) {
      throw_if_stopped();
      stream_.next(args_.batch);
    }
  }
  step_ = step;
}

void SaeTrainer::train(const std::function<void(const SaeStepStats&)>& on_step) {
  while (step_ < args_.steps) {
    throw_if_stopped();
    const SaeStepStats s = step();
    if (on_step) on_step(s);
  }
}

void check_sae_run_dir(const SaeRunOptions& opt) {
  const std::string state = opt.out + "/sae_state.safetensors";
  if (opt.resume) {
    HL_CHECK(file_exists(state), opt.resume_flag, ": ", opt.out, " holds no SAE state (sae_state.safetensors) to continue");
  } else {
    HL_CHECK(!file_exists(state), opt.out_flag, " ", opt.out, " holds an SAE run already: continue it with ", opt.resume_flag,
             ", or choose another ", opt.out_flag);
  }
  check_output_dir(opt.out, "sae", opt.out_flag);
}

SaeRun train_sae_in_dir(TransformerLM& model, const SaeConfig& cfg, const SaeTrainArgs& args, ActivationStream stream,
                        const std::vector<Batch>& held_out, const SaeRunOptions& opt) {
  check_sae_run_dir(opt);
  const std::string state = opt.out + "/sae_state.safetensors";
  SaeTrainer trainer(cfg, args, std::move(stream));
  if (opt.resume) {
    trainer.load_state(state);
    if (opt.on_resumed) opt.on_resumed(trainer.steps_done());
  }
  claim_output_dir(opt.out, "sae", opt.out_flag);
  try {
    trainer.train([&](const SaeStepStats& s) {
      if (opt.on_step) opt.on_step(s);
      const int64_t done = s.step + 1;
      if (opt.snapshot_every > 0 && done % opt.snapshot_every == 0 && done < args.steps) {
        const std::string snap = opt.out + "/snapshots/step" + std::to_string(done);
        make_dirs(snap);
        save_saelens(trainer.sae(), snap);
        trainer.save_state(state);
      }
    });
    trainer.save_state(state);
    SaeRun run{trainer.sae(), evaluate_sae(model, trainer.sae(), held_out)};
    save_saelens(run.sae, opt.out);
    write_file_atomic(opt.out + "/metrics.json", sae_evaluation_json(run.evaluation).dump(1) + "\n");
    return run;
  } catch (const Stopped& e) {  // Ctrl-C between steps (or while measuring): the state to go on from
    trainer.save_state(state);
    throw Stopped(std::string(e.what()) + " at step " + std::to_string(trainer.steps_done()), e.signal);
  }
}

}  // namespace hl
