#include "train/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lib/fileutil.h"
#include "models/checkpoint.h"

namespace hl {

using json = nlohmann::json;

long peak_rss_kb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

namespace {

json rng_json(const Rng& r) {
  json a = json::array();
  for (uint64_t w : r.state()) a.push_back(w);
  return a;
}
void rng_from_json(Rng& r, const json& j, const std::string& source) {
  if (!j.is_array() || j.size() != 4) fail(source, ": bad RNG state in train_state");
  std::array<uint64_t, 4> s;
  for (int i = 0; i < 4; ++i) s[i] = j[i].get<uint64_t>();
  r.set_state(s);
}

double round6(double v) { return std::round(v * 1e6) / 1e6; }

}  // namespace

std::string eval_json(int64_t step, const EvalResult& e, float lr, double tokens_per_s, double wall_s) {
  json j = {{"step", step}, {"loss", e.loss}, {"token_acc", e.token_acc}, {"exact_match", e.exact_match}};
  if (e.ar_exact_match >= 0) j["ar_exact_match"] = e.ar_exact_match;
  j["lr"] = lr;
  j["tokens_per_s"] = std::round(tokens_per_s);
  j["wall_s"] = round6(wall_s);
  return j.dump();
}

std::string TrainArgs::to_json() const {
  json j = {{"model", json::parse(model.to_json())},
            {"dropout", model.dropout},
            {"attn_dropout", model.attn_dropout},
            {"task", json::parse(task.to_json())},
            {"batch", batch},
            {"steps", steps},
            {"lr", lr},
            {"schedule", schedule},
            {"warmup", warmup},
            {"min_lr_ratio", min_lr_ratio},
            {"optimizer", optimizer},
            {"weight_decay", weight_decay},
            {"decay_all", decay_all},
            {"beta1", beta1},
            {"beta2", beta2},
            {"momentum", momentum},
            {"clip", clip},
            {"seed", seed},
            {"threads", threads},
            {"eval_every", eval_every},
            {"checkpoint_every", checkpoint_every},
            {"eval_size", eval_size},
            {"eval_seed", eval_seed},
            {"eval_autoregressive", eval_autoregressive},
            {"skip_nonfinite", skip_nonfinite},
            {"log_grads_every", log_grads_every},
            {"dump_grads_at", dump_grads_at}};
  return j.dump();
}

TrainArgs TrainArgs::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
    TrainArgs a;
    a.model = ModelConfig::from_json(j.at("model").dump(), source);
    a.model.dropout = j.at("dropout").get<float>();
    a.model.attn_dropout = j.at("attn_dropout").get<float>();
    a.task = TaskConfig::from_json(j.at("task").dump(), source);
    a.batch = j.at("batch").get<int>();
    a.steps = j.at("steps").get<int64_t>();
    a.lr = j.at("lr").get<float>();
    a.schedule = j.at("schedule").get<std::string>();
    a.warmup = j.at("warmup").get<int64_t>();
    a.min_lr_ratio = j.at("min_lr_ratio").get<float>();
    a.optimizer = j.at("optimizer").get<std::string>();
    a.weight_decay = j.at("weight_decay").get<float>();
    a.decay_all = j.at("decay_all").get<bool>();
    a.beta1 = j.at("beta1").get<float>();
    a.beta2 = j.at("beta2").get<float>();
    a.momentum = j.at("momentum").get<float>();
    a.clip = j.at("clip").get<float>();
    a.seed = j.at("seed").get<uint64_t>();
    a.threads = j.at("threads").get<int>();
    a.eval_every = j.at("eval_every").get<int64_t>();
    a.checkpoint_every = j.at("checkpoint_every").get<int64_t>();
    a.eval_size = j.at("eval_size").get<int>();
    a.eval_seed = j.at("eval_seed").get<uint64_t>();
    a.eval_autoregressive = j.at("eval_autoregressive").get<bool>();
    a.skip_nonfinite = j.at("skip_nonfinite").get<bool>();
    a.log_grads_every = j.at("log_grads_every").get<int64_t>();
    a.dump_grads_at = j.at("dump_grads_at").get<std::vector<int64_t>>();
    return a;
  } catch (const json::exception& e) {
    fail(source, ": training arguments are unreadable (", e.what(), ")");
  }
}

void TrainArgs::validate() const {
  auto positive = [](const char* flag, int64_t v) {
    if (v < 1) fail("--", flag, " must be positive, got ", v);
  };
  positive("batch", batch);
  positive("steps", steps);
  positive("eval-every", eval_every);
  positive("checkpoint-every", checkpoint_every);
  positive("eval-size", eval_size);
  positive("threads", threads);
  if (!(lr > 0.f) || !std::isfinite(lr)) fail("--lr must be a positive number, got ", lr);
  if (warmup < 0) fail("--warmup must not be negative, got ", warmup);
  if (weight_decay < 0.f) fail("--weight-decay must not be negative, got ", weight_decay);
  if (clip < 0.f) fail("--clip must not be negative, got ", clip);
  if (optimizer != "adamw" && optimizer != "adam" && optimizer != "sgd")
    fail("--optimizer must be adamw, adam or sgd, got '", optimizer, "'");
  if (log_grads_every < 0) fail("--log-grads must not be negative, got ", log_grads_every);
  parse_schedule(schedule);
  task.validate();
  ModelConfig m = model;
  m.vocab_size = std::max<int64_t>(m.vocab_size, 1);
  m.validate();
}

Trainer::Trainer(TrainArgs args) : args_(std::move(args)), task_(args_.task), data_rng_(0) {
  args_.validate();
  args_.model.vocab_size = task_.vocab_size();
  args_.model.max_seq_len = std::max<int64_t>(args_.model.max_seq_len, task_.seq_len());
  model_ = std::make_unique<TransformerLM>(args_.model, args_.seed);
  std::vector<NamedParam> params;
  for (auto& [name, t] : model_->named_parameters()) {
    const bool no_decay = t.ndim() < 2 || name.find("emb") != std::string::npos;  // biases, norms, embeddings
    params.push_back({name, t, args_.decay_all || !no_decay});
  }
  if (args_.optimizer == "sgd")
    opt_ = std::make_unique<SGD>(params, args_.lr, args_.momentum, args_.weight_decay);
  else
    opt_ = std::make_unique<Adam>(params, args_.lr, args_.beta1, args_.beta2, 1e-8f, args_.weight_decay,
                                  args_.optimizer == "adamw");
  sched_ = LrSchedule{parse_schedule(args_.schedule), args_.lr, args_.warmup, args_.steps, args_.min_lr_ratio};
  data_rng_.seed_with(args_.seed * 0x9E3779B97F4A7C15ull + 0x5EED);
  held_out_ = task_.held_out(args_.eval_size, args_.eval_seed, std::min(args_.eval_size, 128));
  if (!args_.out.empty()) {
    make_dirs(args_.out);
    if (!args_.resume && file_exists(checkpoint_path()))
      fail(args_.out, " already holds a run (checkpoint.safetensors): pass --resume to continue it, "
                      "or choose another --out");
  }
}

std::string Trainer::checkpoint_path() const { return args_.out + "/checkpoint.safetensors"; }

void Trainer::save(int64_t step, double wall_s) {
  if (args_.out.empty()) return;
  NamedTensors extra;
  for (auto& [name, t] : opt_->state()) extra.push_back({"optim." + name, t});
  json state = {{"step", step},
                {"optimizer_steps", opt_->steps()},
                {"data_rng", rng_json(data_rng_)},
                {"dropout_rng", rng_json(model_->dropout_rng)},
                {"wall_s", wall_s},
                {"train_s", train_s_so_far_},
                {"args", json::parse(args_.to_json())}};
  const std::string task = args_.task.to_json();
  save_checkpoint(checkpoint_path(), *model_, extra, {{"train_state", state.dump()}, {"task", task}});
  save_checkpoint(args_.out + "/model.safetensors", *model_, {}, {{"task", task}});
}

int64_t Trainer::restore(double& wall_s) {
  const std::string path = checkpoint_path();
  if (!file_exists(path)) fail(path, ": nothing to resume (no checkpoint in ", args_.out, ")");
  SafetensorsFile f = read_safetensors(path);
  const ModelConfig saved = checkpoint_config(f);
  const json a = json::parse(saved.to_json()), b = json::parse(args_.model.to_json());
  for (auto it = a.begin(); it != a.end(); ++it)
    if (b.contains(it.key()) && b[it.key()] != it.value())
      fail(path, ": checkpoint config does not match the flags: ", it.key(), " is ", it.value().dump(),
           " in the checkpoint but ", b[it.key()].dump(), " in the flags");
  load_parameters(*model_, f);
  json st;
  try {
    st = json::parse(f.meta("train_state"));
  } catch (const json::exception& e) {
    fail(path, ": train_state is not valid JSON");
  }
  std::vector<std::pair<std::string, Tensor>> opt_state;
  for (auto& [name, t] : f.tensors)
    if (name.rfind("optim.", 0) == 0) opt_state.push_back({name.substr(6), f.f32(name)});
  opt_->load_state(opt_state, st.at("optimizer_steps").get<int64_t>());
  rng_from_json(data_rng_, st.at("data_rng"), path);
  rng_from_json(model_->dropout_rng, st.at("dropout_rng"), path);
  wall_s = st.at("wall_s").get<double>();
  train_s_so_far_ = st.value("train_s", 0.0);
  return st.at("step").get<int64_t>();
}

void write_summary(const std::string& out, const TrainArgs& args, const TrainResult& r) {
  const EvalResult& e = r.final_eval;
  json j = {{"config", json::parse(args.to_json())},
            {"final", {{"step", r.steps}, {"loss", e.loss}, {"perplexity", std::exp(e.loss)},
                       {"token_acc", e.token_acc}, {"exact_match", e.exact_match},
                       {"ar_exact_match", e.ar_exact_match}}},
            {"first_step_99", r.first_step_99 >= 0 ? json(r.first_step_99) : json(nullptr)},
            {"wall_s", r.wall_s},
            {"train_s", r.train_s},
            {"steps", r.steps},
            {"skipped_steps", r.skipped_steps},
            {"parameters", r.params},
            {"peak_tensor_bytes", r.peak_tensor_bytes},
            {"peak_rss_kb", r.peak_rss_kb}};
  write_file_atomic(out + "/summary.json", j.dump(2) + "\n");
}

std::pair<float, float> train_step(TransformerLM& model, Optimizer& opt, const Batch& batch, float clip,
                                   const std::function<void(TransformerLM&)>& on_gradients) {
  ForwardOptions fo;
  fo.key_padding = batch.key_padding;
  Tensor logits = model.forward(batch.inputs, fo);  // (B, T, V)
  Tensor loss = cross_entropy(logits, batch.targets);
  loss.backward();
  const float loss_v = loss.item();
  const float norm = clip_grad_norm(opt.params(), clip);
  if (std::isfinite(loss_v) && std::isfinite(norm)) {
    if (on_gradients) on_gradients(model);
    opt.step();
  }
  opt.zero_grad();
  return {loss_v, norm};
}

void finetune(TransformerLM& model, const CopyTask& task, int steps, float lr, int batch, uint64_t seed) {
  std::vector<NamedParam> params;
  for (auto& [name, t] : model.named_parameters()) params.push_back({name, t, t.ndim() >= 2});
  Adam opt(params, lr, 0.9f, 0.999f, 1e-8f, 0.01f, true);
  Rng rng(seed);
  const bool was = model.training();
  model.train();
  Batch b;
  for (int i = 0; i < steps; ++i) {
    task.sample_into(b, batch, rng);
    train_step(model, opt, b, 1.f);
  }
  model.train(was);
}

TrainResult Trainer::run(const TrainObserver& obs) {
  using clock = std::chrono::steady_clock;
  set_num_threads(args_.threads);
  TrainResult res;
  res.params = model_->num_parameters();
  double wall_offset = 0;
  int64_t start = 0;
  const std::string metrics_path = args_.out.empty() ? "" : args_.out + "/metrics.jsonl";
  if (args_.resume) {
    start = restore(wall_offset);
    // Drop eval lines written after the checkpoint (a crash between eval and checkpoint).
    if (file_exists(metrics_path)) {
      std::ifstream in(metrics_path);
      std::string line, kept;
      while (std::getline(in, line)) {
        if (line.empty()) continue;
        try {
          const json j = json::parse(line);
          const int64_t s = j.at("step").get<int64_t>();
          if (s > start) continue;
          EvalResult e;
          e.loss = j.at("loss");
          e.token_acc = j.at("token_acc");
          e.exact_match = j.at("exact_match");
          res.curve.push_back({s, e});
          if (res.first_step_99 < 0 && e.token_acc >= 0.99) res.first_step_99 = s;
        } catch (const json::exception&) {
          continue;  // a torn last line from a crash
        }
        kept += line + "\n";
      }
      write_file_atomic(metrics_path, kept);
    }
  }
  FILE* metrics = metrics_path.empty() ? nullptr : std::fopen(metrics_path.c_str(), start ? "a" : "w");
  if (!metrics_path.empty() && !metrics) fail(metrics_path, ": cannot open for writing");
  const auto t0 = clock::now();
  auto wall = [&] { return wall_offset + std::chrono::duration<double>(clock::now() - t0).count(); };
  auto window_start = clock::now();
  int64_t window_tokens = 0;
  model_->train();
  pool_reset_peak();
  int64_t last_ckpt = start;
  for (int64_t step = start; step < args_.steps; ++step) {
    const float lr = sched_.at(step);
    opt_->lr = lr;
    task_.sample_into(batch_, args_.batch, data_rng_);
    const Batch& batch = batch_;
    const auto step_start = clock::now();
    const auto [loss_v, norm] = train_step(*model_, *opt_, batch, args_.clip, [&](TransformerLM& m) {
      if (obs.on_gradients) obs.on_gradients(step + 1, m);
    });
    train_s_so_far_ += std::chrono::duration<double>(clock::now() - step_start).count();
    if (!std::isfinite(loss_v) || !std::isfinite(norm)) {
      const std::string what = !std::isfinite(loss_v) ? "loss is " + std::to_string(loss_v)
                                                       : "gradient norm is " + std::to_string(norm);
      if (!args_.skip_nonfinite) {
        if (metrics) std::fclose(metrics);
        throw NonFiniteError("step " + std::to_string(step + 1) + ": " + what + "; stopping (the last good checkpoint, step " +
                             std::to_string(last_ckpt) + ", is intact" +
                             (args_.out.empty() ? "" : " in " + checkpoint_path()) +
                             "; --skip-nonfinite skips such steps instead)");
      }
      ++res.skipped_steps;
    }
    window_tokens += batch.inputs.numel();
    if (obs.on_step) {
      const double secs = std::chrono::duration<double>(clock::now() - window_start).count();
      obs.on_step(step + 1, args_.steps, loss_v, secs > 0 ? window_tokens / secs : 0);
    }
    const bool last = step + 1 == args_.steps;
    if ((step + 1) % args_.eval_every == 0 || last) {
      const double secs = std::chrono::duration<double>(clock::now() - window_start).count();
      const double tps = secs > 0 ? window_tokens / secs : 0;
      EvalResult e = evaluate(*model_, task_, held_out_, args_.eval_autoregressive || last);
      pool_trim();  // eval-sized buffers are not needed by the training steps
      res.curve.push_back({step + 1, e});
      if (res.first_step_99 < 0 && e.token_acc >= 0.99) res.first_step_99 = step + 1;
      if (metrics) {
        const std::string line = eval_json(step + 1, e, lr, tps, wall()) + "\n";
        std::fwrite(line.data(), 1, line.size(), metrics);
        std::fflush(metrics);
      }
      if (obs.on_eval) obs.on_eval(step + 1, e);
      window_start = clock::now();
      window_tokens = 0;
    }
    if ((step + 1) % args_.checkpoint_every == 0 || last) {
      save(step + 1, wall());
      last_ckpt = step + 1;
    }
  }
  if (metrics) std::fclose(metrics);
  res.steps = args_.steps;
  res.wall_s = wall();
  res.train_s = train_s_so_far_;
  res.peak_rss_kb = peak_rss_kb();
  res.peak_tensor_bytes = pool_stats().bytes_peak;
  if (!res.curve.empty()) res.final_eval = res.curve.back().second;
  if (start >= args_.steps) {  // resumed a finished run: evaluate once more for the summary
    res.final_eval = evaluate(*model_, task_, held_out_, true);
  }
  return res;
}

}  // namespace hl
