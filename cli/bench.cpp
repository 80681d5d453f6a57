// headlab bench: training-step and forward timings of the S, M, L configurations (the same
// models as the PyTorch reference in scripts/reference), with GFLOP/s, the fraction of the sgemm
// peak measured here on the linked BLAS, peak RSS and heap allocations per step.
// Each configuration runs in its own child process, so its peak RSS is its own.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/alloc_counter.h"
#include "cli/child_process.h"
#include "cli/commands.h"
#include "lib/bf16.h"
#include "lib/fileutil.h"
#include "lib/optim.h"
#include "lib/profile.h"
#include "lib/stop.h"
#include "lib/threads.h"
#include "train/run_dir.h"
#include "train/sae_trainer.h"

extern "C" char* openblas_get_corename();

namespace hl {

using json = nlohmann::json;
using clk = std::chrono::steady_clock;

namespace {

struct BenchConfig {
  std::string name;
  int64_t d_model = 64;
  int layers = 2, heads = 4;
  int64_t d_ff = 256;
  int batch = 64;
  int64_t T = 33;
  int64_t vocab = 13;  // the copy task's
  bool gelu_tanh = false;  // GPT-2's GELU (gpt2-small) instead of the reference's exact one
  bool llama = false;      // Llama-style block (--arch llama): RMSNorm, SwiGLU, rotary, no biases
};

// The model of a config, as PyTorch's reference builds it (exact GELU unless gelu_tanh, biases
// everywhere, an untied unembedding; a Llama-style config as scripts/reference/modern_lm.py builds
// --arch llama's: RMSNorm, SwiGLU (gate, up, down of d_ff), rotary positions, no biases).
ModelConfig model_config(const BenchConfig& bc) {
  ModelConfig c;
  c.vocab_size = bc.vocab;
  c.d_model = bc.d_model;
  c.n_layers = bc.layers;
  c.n_heads = bc.heads;
  c.d_ff = bc.d_ff;
  c.max_seq_len = bc.T;
  c.activation = bc.gelu_tanh ? Activation::GeluTanh : Activation::GeluErf;
  c.attn_bias = c.mlp_bias = c.head_bias = true;
  if (bc.llama) {
    c.normalization = NormKind::RMSNorm;
    c.mlp = Mlp::SwiGLU;
    c.positions = Positions::Rotary;
    c.attn_bias = c.mlp_bias = c.head_bias = false;
  }
  return c;
}

BenchConfig named_config(const std::string& s) {
  if (s == "S") return {"S", 64, 2, 4, 256, 64, 33};
  if (s == "M") return {"M", 256, 4, 8, 1024, 32, 128};
  if (s == "L") return {"L", 768, 2, 12, 3072, 8, 128};
  // S and M with the Llama-style block (d_ff the same: a SwiGLU MLP has 1.5x the plain one's weights)
  if (s == "S-llama") return {s, 64, 2, 4, 256, 64, 33, 13, false, true};
  if (s == "M-llama") return {s, 256, 4, 8, 1024, 32, 128, 13, false, true};
  // the varcopy study model (ablate's default) with 1, 4 and 16 heads: PyTorch's torch_step.py
  // has the same configs
  if (s == "V1" || s == "V4" || s == "V16") return {s, 32, 2, std::stoi(s.substr(1)), 128, 64, 33, 67};
  // GPT-2 small's shape (12 layers x 12 heads x 768, its 50,257-token vocabulary, the tanh GELU)
  // with random weights, on 8 sequences of 128 tokens: the vocabulary projection is 31% of the
  // forward's multiply-adds
  if (s == "gpt2-small") return {s, 768, 12, 12, 3072, 8, 128, 50257, true};
  // custom: d_model,layers,heads,d_ff,batch,T
  const char* forms = "S, M, L, S-llama, M-llama, V1, V4, V16, gpt2-small or six numbers d_model,layers,heads,d_ff,batch,T; several are separated "
                      "by spaces (--config V1 V4)";
  // a name (no comma) or names joined by commas; numbers with a comma go to parse_int's message
  if (s.empty() || s.find(',') == std::string::npos || !std::isdigit(static_cast<unsigned char>(s[0])))
    fail("--config: unknown config '", s, "': give ", forms);
  BenchConfig c;
  c.name = s;
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) v.push_back(parse_int(tok, 1, 1 << 24, "--config '" + s + "'"));
  if (v.size() != 6) fail("--config '", s, "': ", v.size(), " numbers; give ", forms);
  c.d_model = v[0], c.layers = static_cast<int>(v[1]), c.heads = static_cast<int>(v[2]);
  c.d_ff = v[3], c.batch = static_cast<int>(v[4]), c.T = v[5];
  if (c.d_model % c.heads)
    fail("--config '", s, "': ", c.heads, " heads do not divide d_model ", c.d_model);
  // before any child starts: the model, its optimiser state and one step's activations
  check_fits_in_memory(estimate_step_bytes(model_config(c), c.batch, c.T, true), "--config '" + s + "'");
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// FLOP formulas of scripts/reference/gpt.py, over the positions computed: `positions` in all,
// `squares` the sum over sequences of their length squared (B T and B T^2 for full batches) and
// `outputs` the positions that go on past the last block's attention (all, or those with a
// target: its W_O, feed-forward and the head run on those alone).
struct Work {
  double positions, squares, outputs;
};
double matmul_macs(const BenchConfig& c, const Work& w) {  // multiply-adds of the weight products
  // W_O and the feed-forward (a gated one has three d x d_ff matrices)
  const double d = c.d_model, tail = d * d + (c.llama ? 3.0 : 2.0) * d * c.d_ff;
  return c.layers * 3.0 * d * d * w.positions + (c.layers - 1) * tail * w.positions + (tail + d * c.vocab) * w.outputs;
}
double train_flops(const BenchConfig& c, const Work& w) {
  return 6 * matmul_macs(c, w) + 12.0 * c.layers * w.squares * c.d_model;
}
double fwd_flops(const BenchConfig& c, const Work& w) {
  return 2 * matmul_macs(c, w) + 4.0 * c.layers * w.squares * c.d_model;
}

// One configuration, in this process: prints one JSON line.
// task_name empty: random tokens at every position (the PyTorch reference's data); else that
// task's batches, stepped as the trainer does (positions after a row's last target skipped).
json bench_one(BenchConfig bc, int threads, int steps, int warmup, bool profile, const std::string& task_name) {
  set_num_threads(threads);
  std::unique_ptr<Task> task;
  if (!task_name.empty()) {
    task = make_task(TaskConfig::preset(task_name));
    bc.vocab = task->vocab_size();
    bc.T = task->seq_len();
  }
  ModelConfig c = model_config(bc);
  c.validate();
  TransformerLM model(c, 0);
  std::vector<NamedParam> params;
  for (auto& [n, t] : model.named_parameters()) params.push_back({n, t, true});  // decay all, as the reference
  Adam opt(params, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true);
  Rng rng(0);
  std::vector<std::pair<Ids, Ids>> batches;
  for (int i = 0; i < 8; ++i) {
    Ids in(Shape{bc.batch, bc.T}), tg(Shape{bc.batch, bc.T});
    for (int64_t b = 0; b < bc.batch; ++b) {
      int32_t prev = static_cast<int32_t>(rng.below(static_cast<uint32_t>(bc.vocab)));
      for (int64_t t = 0; t < bc.T; ++t) {
        const int32_t next = static_cast<int32_t>(rng.below(static_cast<uint32_t>(bc.vocab)));
        in.at(b, t) = prev;
        tg.at(b, t) = next;
        prev = next;
      }
    }
    batches.push_back({in, tg});
  }
  std::vector<Batch> task_batches;
  const double full = static_cast<double>(bc.batch) * bc.T;
  Work work{full, full * bc.T, full};  // per step
  if (task) {
    Rng data_rng(1);
    std::vector<int32_t> len;
    Ids rows, targets;
    work = {0, 0, 0};
    for (int i = 0; i < 8; ++i) {
      task_batches.push_back(task->sample(bc.batch, data_rng));
      if (task_batches.back().live_positions(len, rows, targets)) {
        work.outputs += rows.numel() / 8.0;
      } else {
        len.assign(static_cast<size_t>(bc.batch), static_cast<int32_t>(bc.T));
        work.outputs += full / 8.0;
      }
      for (int32_t l : len) work.positions += l / 8.0, work.squares += static_cast<double>(l) * l / 8.0;
    }
  }
  auto train_step = [&](int i) {
    throw_if_stopped();  // SIGTERM from the parent (or the terminal's Ctrl-C) ends the measurement
    const auto& [in, tg] = batches[i % batches.size()];
    Tensor loss = task ? batch_loss(model, task_batches[i % task_batches.size()]) : cross_entropy(model.forward(in), tg);
    loss.backward();
    opt.step();
    opt.zero_grad();
  };
  std::vector<double> train_ms, fwd_ms;
  train_ms.reserve(steps);  // the measurement itself must not allocate in the timed loop
  fwd_ms.reserve(steps);
  // a task's batches differ in size: warm up on each of them, so the pool has seen every size
  if (task) warmup = std::max<int>(warmup, static_cast<int>(task_batches.size()));
  for (int i = 0; i < warmup; ++i) train_step(i);
  const uint64_t mallocs0 = alloc_counter::count();
  const size_t heap0 = pool_stats().heap_allocs;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = clk::now();
    train_step(i);
    train_ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
  }
  const double mallocs = static_cast<double>(alloc_counter::count() - mallocs0) / steps;
  const double heap = static_cast<double>(pool_stats().heap_allocs - heap0) / steps;
  json prof = json::object();
  if (profile) {
    Profiler::reset();
    Profiler::enabled = true;
    const int n = 5;
    const auto t0 = clk::now();
    for (int i = 0; i < n; ++i) train_step(i);
    const double total = std::chrono::duration<double, std::milli>(clk::now() - t0).count() / n;
    Profiler::enabled = false;
    double accounted = 0;
    for (int k = 0; k < static_cast<int>(ProfCat::kCount); ++k) {
      const double ms = Profiler::seconds[k] * 1e3 / n;
      prof[prof_cat_name(static_cast<ProfCat>(k))] = ms;
      accounted += ms;
    }
    prof["graph/allocation/other"] = total - accounted;
    prof["total"] = total;
  }
  model.eval();
  {
    NoGradGuard ng;
    BatchScratch scratch;
    const Ids* targets = nullptr;
    for (int i = 0; i < warmup + steps; ++i) {
      const auto t0 = clk::now();
      // a task's batch as evaluation runs it (live positions, logits at targets)
      Tensor logits = task ? forward_batch(model, task_batches[i % task_batches.size()], scratch, targets)
                           : model.forward(batches[i % batches.size()].first);
      if (i >= warmup) fwd_ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
    }
  }
  const double med = median(train_ms);
  json j = {{"config", bc.name}, {"threads", num_threads()}, {"steps", steps}, {"T", bc.T}, {"vocab", bc.vocab},
            {"train_ms_median", med},
            {"train_ms_min", *std::min_element(train_ms.begin(), train_ms.end())},
            {"train_ms_max", *std::max_element(train_ms.begin(), train_ms.end())},
            {"fwd_ms_median", median(fwd_ms)},
            {"fwd_ms_min", *std::min_element(fwd_ms.begin(), fwd_ms.end())},
            {"fwd_ms_max", *std::max_element(fwd_ms.begin(), fwd_ms.end())},
            {"task", task_name},
            {"positions_per_step", work.positions},
            {"tokens_per_s", work.positions / (med / 1e3)},
            {"train_gflops", train_flops(bc, work) / (med / 1e3) * 1e-9},
            {"fwd_gflops", fwd_flops(bc, work) / (median(fwd_ms) / 1e3) * 1e-9},
            {"peak_rss_kb", peak_rss_kb()},
            {"mallocs_per_step", alloc_counter::available() ? json(mallocs) : json(nullptr)},
            {"pool_misses_per_step", heap},
            {"params", model.num_parameters()}};
  if (profile) j["profile_ms"] = prof;
  return j;
}

// sgemm GFLOP/s on square matrices, median of repeats, on `threads` threads.
json sgemm_peak(int threads) {
  set_num_threads(threads);
  const int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.f);
  std::vector<double> g;
  for (int r = 0; r < 7; ++r) {
    throw_if_stopped();
    const auto t0 = clk::now();
    gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    if (r >= 2) g.push_back(2.0 * n * n * n / s * 1e-9);
  }
  return {{"threads", num_threads()}, {"sgemm_gflops", median(g)}};
}

// The bf16 product's peak, measured as sgemm's: 2048^3, operands already bf16, float32 result.
json bf16_gemm_peak(int threads) {
  set_num_threads(threads);
  const int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), c(n * n, 0.f);
  std::vector<uint16_t> ah(n * n), bh(n * n);
  convert_to_bf16(a.data(), ah.data(), n * n);
  convert_to_bf16(a.data(), bh.data(), n * n);
  std::vector<double> g;
  for (int r = 0; r < 7; ++r) {
    throw_if_stopped();
    const auto t0 = clk::now();
    gemm_bf16(false, false, n, n, n, ah.data(), n, bh.data(), n, 0.f, c.data(), n);
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    if (r >= 2) g.push_back(2.0 * n * n * n / s * 1e-9);
  }
  return {{"threads", num_threads()}, {"sgemm_gflops", median(g)}};
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) fail("bench: cannot find the headlab binary (/proc/self/exe)");
  buf[n] = 0;
  return buf;
}

// Runs `headlab bench ARGS...` (this binary) as a child and reads the JSON it prints.
json run_child(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {self_exe(), "bench"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string cmd;
  for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  std::string out;
  ChildOptions opt;
  opt.forward_stop = true;
  const int rc = run_child_process(argv, opt, &out);
  throw_if_stopped();  // a stop request ended the child: stop here too
  if (rc != 0) fail("bench: child failed (exit ", rc, "): ", cmd);
  try {
    return json::parse(out.substr(out.rfind('{', out.find_last_of('}')) == std::string::npos ? 0 : out.find('{')));
  } catch (const json::exception&) {
    fail("bench: unreadable child output from ", cmd, ": ", out.substr(0, 200));
  }
}

// --- SAE training step (scripts/bench_sae_vs_pytorch.sh races it against scripts/reference/sae_torch.py)
// A TopK SAE's training step (train/sae_trainer.h) on random normal activations, no model forward:
// spec "d_in,expansion,k"; AuxK runs on the steps that have dead features (by dead_after rows).
// one_thread_below >= 0 replaces the library's bound for small steps (lib/threads.h) to measure it.
json bench_sae(const std::string& spec, int64_t batch, int64_t dead_after, int threads, int steps, int warmup,
               double one_thread_below) {
  std::vector<int64_t> v;
  std::stringstream ss(spec);
  std::string tok;
  while (std::getline(ss, tok, ',')) v.push_back(parse_int(tok, 1, 1 << 20, "--sae '" + spec + "'"));
  if (v.size() != 3) fail("--sae '", spec, "': ", v.size(), " numbers; give d_in,expansion,k");
  if (batch < 1) fail("--sae-batch must be positive, got ", batch);
  if (steps < 1 || warmup < 0) fail("bench: --steps must be positive and --warmup not negative");
  set_num_threads(threads);
  if (one_thread_below >= 0) set_parallel_min_step_work(one_thread_below);
  SaeConfig cfg;
  cfg.d_in = v[0], cfg.d_sae = v[0] * v[1], cfg.k = v[2], cfg.arch = SaeArch::TopK;
  if (cfg.k > cfg.d_sae) fail("--sae '", spec, "': k ", cfg.k, " is more than the ", cfg.d_sae, " features");
  check_fits_in_memory(sae_training_bytes(cfg, batch, 4 * batch), "--sae '" + spec + "'");
  SaeTrainArgs args;
  args.steps = warmup + steps, args.batch = batch, args.dead_after = dead_after;
  args.b_dec_geometric_median = false;  // initialisation, not timed
  Rng rng(0);
  std::vector<Tensor> pool;  // 4 batches drawn before the clock starts, cycled as the reference does
  for (int i = 0; i < 4; ++i) pool.push_back(Tensor::randn({batch, cfg.d_in}, rng));
  int64_t served = 0;
  ActivationSource source = [&](int64_t rows) {
    if (rows != batch) return Tensor::randn({rows, cfg.d_in}, rng);  // the b_dec sample
    return pool[static_cast<size_t>(served++ % 4)].clone();
  };
  SaeTrainer trainer(cfg, args, source);
  for (int i = 0; i < warmup; ++i) trainer.step();
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(steps));
  throw_if_stopped();  // its thread-local registration (one allocation) before the count
  const uint64_t mallocs0 = alloc_counter::count();
  for (int i = 0; i < steps; ++i) {
    throw_if_stopped();
    const auto t0 = clk::now();
    trainer.step();
    ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
  }
  const double mallocs = static_cast<double>(alloc_counter::count() - mallocs0) / steps;
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  return {{"d_in", cfg.d_in}, {"expansion", v[1]}, {"d_sae", cfg.d_sae}, {"k", cfg.k}, {"batch", batch},
          {"threads", threads}, {"one_thread_below", parallel_min_step_work()}, {"steps", steps}, {"step_ms_median", median}, {"tokens_per_s", batch / (median / 1e3)},
          {"mallocs_per_step", alloc_counter::available() ? json(mallocs) : json(nullptr)}, {"peak_rss_kb", peak_rss_kb()}};
}
// --- end SAE training step

struct BenchOpts {
  std::vector<std::string> configs = {"S", "M", "L"};
  std::vector<int> threads = {2};
  int steps = 30, warmup = 5;  // 30 timed steps: a median steady against the host's noise
  bool profile = false, json_out = false;
  std::string one;
  bool peak = false;
  bool products = false;  // time each linear layer's shape alone (run_products)
  bool sweep = false;  // also time the default head-count sweep (headlab ablate)
  std::vector<std::string> precisions = {"float32"};  // each config in each (lib/bf16.h)
  bool bf16_every_product = false;  // bf16 runs put every linear product in bf16, whatever the rule
  std::string task;    // empty: random tokens
  std::string out_json;
  std::string sae;                 // "d_in,expansion,k": time an SAE training step instead (bench_sae)
  int64_t sae_batch = 4096, sae_dead_after = 100000;
  double sae_one_thread_below = -1;  // < 0: the library's bound
};

struct SweepTime {
  double wall_s = 0;
  double eval_share = 0;  // of the runs' wall time, time in held-out evaluation
};

// Wall time of the default `headlab ablate` (15 runs) in a fresh directory, on `threads` threads.
SweepTime time_default_sweep(int threads) {
  char dir[] = "/tmp/headlab-bench-sweep-XXXXXX";
  if (!::mkdtemp(dir)) fail("bench: cannot make a temporary directory for the sweep");
  const std::vector<std::string> argv = {self_exe(), "ablate", "--quiet", "--threads", std::to_string(threads), "--out",
                                         std::string(dir) + "/sweep"};
  const std::string cmd = "headlab ablate --quiet --threads " + std::to_string(threads);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = run_child_process(argv, {"", std::string(dir) + "/ablate.log", true});
  SweepTime r;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double run_wall = 0, eval = 0;
  std::error_code ec;
  if (rc == 0)
    for (const auto& e : std::filesystem::directory_iterator(std::string(dir) + "/sweep/runs", ec)) {
      const json s = json::parse(read_file(e.path().string() + "/summary.json"));
      run_wall += s.at("wall_s").get<double>();
      eval += s.value("eval_s", 0.0);
    }
  r.eval_share = run_wall > 0 ? eval / run_wall : 0;
  std::filesystem::remove_all(dir, ec);
  throw_if_stopped();
  if (rc != 0) fail("bench: the sweep failed (exit ", rc, "): ", cmd);
  return r;
}

// ---- --products: each linear layer's shape in the configs, timed alone. Two questions, in
// alternated rounds (medians): does bf16 gain on this shape (the linear op's forward and both
// backward products, rounding included, float32 against bf16), and does oneDNN's float32
// matmul beat OpenBLAS's sgemm on its forward product.
struct ProductShape {
  int64_t rows, out, in;
  std::string where;  // the configs' layers of this shape
};

std::vector<ProductShape> product_shapes(const std::vector<std::string>& configs) {
  std::vector<ProductShape> v;
  auto add = [&](int64_t rows, int64_t out, int64_t in, const std::string& where) {
    for (ProductShape& p : v)
      if (p.rows == rows && p.out == out && p.in == in) {
        p.where += ", " + where;
        return;
      }
    v.push_back({rows, out, in, where});
  };
  for (const std::string& name : configs) {
    const BenchConfig c = named_config(name);
    const int64_t R = c.batch * c.T, d = c.d_model;
    add(R, 3 * d, d, name + " W_QKV");
    add(R, d, d, name + " W_O");
    add(R, c.d_ff, d, name + (c.llama ? " gate, up" : " fc1"));
    add(R, d, c.d_ff, name + " fc2");
    add(R, c.vocab, d, name + " unembed");
  }
  return v;
}

int run_products(const BenchOpts& o) {
  set_num_threads(o.threads.at(0));
  require_bf16_cpu();
  std::printf("each linear layer's shape, %d thread%s, medians of %d alternated rounds (ms)\n", num_threads(),
              num_threads() > 1 ? "s" : "", o.steps);
  std::vector<std::vector<std::string>> rows = {{"rows x in -> out", "layers", "fwd+bwd float32", "bf16", "bf16 gain",
                                                 "rule (bf16_pays)", "fwd sgemm", "oneDNN f32", "oneDNN / sgemm"}};
  Rng rng(1);
  for (const ProductShape& p : product_shapes(o.configs)) {
    throw_if_stopped();
    Tensor x = Tensor::randn({p.rows, p.in}, rng).requires_grad_();
    Tensor w = Tensor::randn({p.out, p.in}, rng, 0.f, 0.05f).requires_grad_();
    Tensor b = Tensor::randn({p.out}, rng).requires_grad_();
    const Tensor g = Tensor::randn({p.rows, p.out}, rng);
    Tensor y = Tensor::empty({p.rows, p.out});
    // calls per timing: about 50 ms of float32 work at 150 GFLOP/s
    const double flops = 2.0 * p.rows * p.out * p.in;
    const int reps = std::max(1, static_cast<int>(50e-3 * 150e9 / (3 * flops)));
    auto time = [&](auto f) {
      f();  // warm: primitives made, pool filled
      const auto t0 = clk::now();
      for (int i = 0; i < reps; ++i) f();
      return std::chrono::duration<double, std::milli>(clk::now() - t0).count() / reps;
    };
    auto linear_step = [&](std::optional<Precision> bf16) {
      return [&, bf16] {
        std::optional<PrecisionScope> scope;
        std::optional<Bf16EveryProduct> every;
        if (bf16) scope.emplace(*bf16), every.emplace();
        x.zero_grad(), w.zero_grad(), b.zero_grad();
        linear(x, w, b).backward(g);
      };
    };
    std::vector<double> f32, b16, sg, dn;
    for (int r = 0; r < o.steps; ++r) {
      f32.push_back(time(linear_step(std::nullopt)));
      b16.push_back(time(linear_step(Precision::Bf16)));
      sg.push_back(time([&] { gemm(false, true, p.rows, p.out, p.in, 1.f, x.data(), p.in, w.data(), p.in, 0.f, y.data(), p.out); }));
      dn.push_back(time([&] { gemm_onednn_f32(false, true, p.rows, p.out, p.in, x.data(), p.in, w.data(), p.in, 0.f, y.data(), p.out); }));
    }
    rows.push_back({std::to_string(p.rows) + " x " + std::to_string(p.in) + " -> " + std::to_string(p.out), p.where,
                    fixed(median(f32), 3), fixed(median(b16), 3), fixed(median(f32) / median(b16), 2) + "x",
                    bf16_pays(p.rows, p.out, p.in) ? "bf16" : "float32", fixed(median(sg), 3), fixed(median(dn), 3),
                    fixed(median(dn) / median(sg), 2)});
  }
  print_table(rows);
  return 0;
}

int run_bench(const BenchOpts& o) {
  // a child runs in the one precision it is given
  const PrecisionScope precision(o.one.empty() && !o.peak ? Precision::Float32 : parse_precision(o.precisions.at(0), "--precision"));
  if (!o.sae.empty()) {
    std::printf("%s\n", bench_sae(o.sae, o.sae_batch, o.sae_dead_after, o.threads.at(0), o.steps, o.warmup, o.sae_one_thread_below).dump().c_str());
    return 0;
  }
  if (!o.one.empty()) {  // child mode
    std::optional<Bf16EveryProduct> every;
    if (o.bf16_every_product) every.emplace();
    json j = bench_one(named_config(o.one), o.threads.at(0), o.steps, o.warmup, o.profile, o.task);
    j["precision"] = o.precisions.at(0);
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (o.peak) {
    const bool bf16 = matmul_precision() == Precision::Bf16;
    std::printf("%s\n", (bf16 ? bf16_gemm_peak(o.threads.at(0)) : sgemm_peak(o.threads.at(0))).dump().c_str());
    return 0;
  }
  if (o.steps < 1 || o.warmup < 0) fail("bench: --steps must be positive and --warmup not negative");
  for (const std::string& c : o.configs) named_config(c);  // validate before any work
  if (o.products) return run_products(o);
  std::unique_ptr<Task> task;
  if (!o.task.empty()) task = make_task(TaskConfig::preset(o.task));
  if (!o.out_json.empty()) {
    check_can_write(o.out_json);
    refuse_replacing_run_file("--json", o.out_json);
  }
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const char* auto_from = std::getenv("HEADLAB_BLAS_CORE_CHOSEN");
  std::fprintf(stderr, "headlab bench: %d timed steps after %d warm-up; OpenBLAS kernels %s (OPENBLAS_CORETYPE=%s%s)\n",
               o.steps, o.warmup, openblas_get_corename(), coretype ? coretype : "(unset)",
               auto_from ? (std::string(", set by headlab: OpenBLAS detected ") + auto_from).c_str() : "");
  for (const std::string& p : o.precisions)
    if (parse_precision(p, "--precision") == Precision::Bf16) require_bf16_cpu();
  std::map<std::pair<std::string, int>, double> peaks;  // (precision, threads) -> GFLOP/s
  for (const std::string& p : o.precisions)
    for (int t : o.threads)
      peaks[{p, t}] = run_child({"--peak", "--threads", std::to_string(t), "--precision", p})["sgemm_gflops"];
  std::vector<json> results;
  std::vector<std::vector<std::string>> rows = {{"config", "precision", "threads", "train ms (median)", "min-max", "fwd ms", "min-max",
                                                 "tokens/s", "train GFLOP/s", "% product peak", "peak RSS MiB",
                                                 "mallocs/step"}};
  for (const std::string& c : o.configs)
    for (const std::string& prec : o.precisions)
    for (int t : o.threads) {
      std::fprintf(stderr, "  running %s in %s on %d thread%s...\n", c.c_str(), prec.c_str(), t, t > 1 ? "s" : "");
      std::vector<std::string> args = {"--one", c, "--threads", std::to_string(t), "--steps", std::to_string(o.steps),
                                       "--warmup", std::to_string(o.warmup), "--precision", prec};
      if (o.profile) args.push_back("--profile");
      if (o.bf16_every_product) args.push_back("--bf16-every-product");
      if (!o.task.empty()) args.insert(args.end(), {"--task", o.task});
      json j = run_child(args);
      const double peak = peaks[{prec, t}];
      j["product_peak_gflops"] = peak;
      results.push_back(j);
      // a task sets the length: say so where it differs from the config's own
      const std::string label = j["T"] == named_config(c).T ? c : c + " (T " + std::to_string(j["T"].get<int64_t>()) + ")";
      const std::string shown = prec == "bf16" && o.bf16_every_product ? "bf16 every" : prec;
      rows.push_back({label, shown, std::to_string(j["threads"].get<int>()), fixed(j["train_ms_median"], 2),
                      fixed(j["train_ms_min"], 2) + "-" + fixed(j["train_ms_max"], 2), fixed(j["fwd_ms_median"], 2),
                      fixed(j["fwd_ms_min"], 2) + "-" + fixed(j["fwd_ms_max"], 2), fixed(j["tokens_per_s"], 0),
                      fixed(j["train_gflops"], 1), fixed(100.0 * j["train_gflops"].get<double>() / peak, 1),
                      fixed(j["peak_rss_kb"].get<double>() / 1024, 1),
                      j["mallocs_per_step"].is_null() ? "n/a" : fixed(j["mallocs_per_step"], 1)});
    }
  std::printf("\n");
  print_table(rows);
  if (task)
    std::printf("\ndata: %s batches as training steps them (T %d and vocabulary %d from the task; positions after "
                "a row's last target not computed)\n",
                o.task.c_str(), task->seq_len(), task->vocab_size());
  else
    std::printf("\ndata: random tokens at every position, as the PyTorch reference (--task NAME for a task's batches)\n");
  std::printf("product peak (2048^3: float32 this BLAS's sgemm, bf16 oneDNN's bf16 x bf16 -> float32):");
  for (auto& [pt, g] : peaks) std::printf("  %s %d thread%s %.0f GFLOP/s", pt.first.c_str(), pt.second, pt.second > 1 ? "s" : "", g);
  std::printf("\n");
  if (o.threads.size() > 1) {  // scaling
    std::printf("\nthread scaling (train step, median):\n");
    for (const std::string& c : o.configs) {
      double t1 = 0, tn = 0;
      int n = 0;
      for (auto& j : results)
        if (j["config"] == c) {
          if (j["threads"] == o.threads.front()) t1 = j["train_ms_median"];
          if (j["threads"] == o.threads.back()) tn = j["train_ms_median"], n = j["threads"];
        }
      std::printf("  %s: %d -> %d threads: %.2fx faster\n", c.c_str(), o.threads.front(), n, tn > 0 ? t1 / tn : 0);
    }
  }
  if (o.sweep) {
    std::fprintf(stderr, "  running the default sweep (headlab ablate: 5 head counts x 3 seeds x 600 steps)...\n");
    std::printf("\ndefault sweep (headlab ablate, 15 runs of varcopy):");
    for (int t : o.threads) {
      const SweepTime s = time_default_sweep(t);
      std::printf("  %d thread%s %.1f s wall, evaluation %.1f%% of the runs' time", t, t > 1 ? "s" : "", s.wall_s,
                  100 * s.eval_share);
    }
    std::printf("\n");
  }
  if (o.profile) {
    std::printf("\nper-op breakdown of one training step (ms, mean of 5 steps):\n");
    std::vector<std::vector<std::string>> prow = {{"category"}};
    for (auto& j : results) prow[0].push_back(j["config"].get<std::string>() + "/" + std::to_string(j["threads"].get<int>()));
    for (auto it = results[0]["profile_ms"].begin(); it != results[0]["profile_ms"].end(); ++it) {
      std::vector<std::string> r = {it.key()};
      for (auto& j : results) r.push_back(fixed(j["profile_ms"][it.key()], 2));
      prow.push_back(r);
    }
    print_table(prow);
  }
  if (!o.out_json.empty()) {
    json all = {{"openblas_coretype", coretype ? coretype : "(unset)"}, {"results", results}};
    write_file_atomic(o.out_json, all.dump(1) + "\n");
  }
  return 0;
}

// The tasks that make their own data (text and tokens read a file, which bench does not take).
std::vector<std::string> generated_tasks() {
  std::vector<std::string> names;
  for (const std::string& n : task_names())
    if (n != "text" && n != "tokens") names.push_back(n);
  return names;
}

}  // namespace

void add_bench_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("bench", "Time training steps and forwards of the benchmark configs S, M, L (or your own), with a per-op profile");
  auto o = std::make_shared<BenchOpts>();
  const std::vector<std::string> tasks = generated_tasks();
  auto joined = [&tasks](const char* sep) {
    std::string s;
    for (const std::string& n : tasks) {
      if (!s.empty()) s += sep;
      s += n;
    }
    return s;
  };
  sub->add_option("--config", o->configs,
                  "S, M, L (the speed configs), S-llama, M-llama (S and M with the Llama-style block), V1, V4, V16 (ablate's varcopy model with 1, 4, 16 heads), gpt2-small "
                  "(GPT-2 small's shape and vocabulary, B 8, T 128) or "
                  "d_model,layers,heads,d_ff,batch,T")
      ->delimiter(' ')->capture_default_str();
  sub->add_option("--threads", o->threads, "Thread counts to run, e.g. --threads 1 2")->capture_default_str()
      ->check(in_range(1, 4096));
  sub->add_option("--steps", o->steps, "Timed steps (after warm-up)")->capture_default_str();
  sub->add_option("--warmup", o->warmup, "Warm-up steps")->capture_default_str();
  sub->add_flag("--profile", o->profile, "Add a per-op breakdown of a training step");
  sub->add_option("--precision", o->precisions,
                  "Precisions to run each config in: float32, bf16 (the linear layers' products with bf16 operands "
                  "and float32 accumulation; needs AVX512_BF16), e.g. --precision float32 bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bf16"}));
  sub->add_flag("--bf16-every-product", o->bf16_every_product,
                "With --precision bf16: every linear product in bf16, also those under 128 wide that the "
                "per-shape rule leaves in float32 (to measure the rule on whole steps)");
  sub->add_flag("--products", o->products,
                "Instead of steps, time each linear layer's shape of the configs alone (--steps rounds): float32 "
                "against bf16 (forward and backward), and OpenBLAS's sgemm against oneDNN's float32 matmul; needs "
                "AVX512_BF16");
  sub->add_flag("--sweep", o->sweep, "Also time the default head-count sweep (headlab ablate, about half a minute)");
  sub->add_option("--task", o->task,
                  "Step on this task's batches as training does (positions after each row's last target are "
                  "not computed; tokens/s and GFLOP/s count the positions computed) instead of random tokens at "
                  "every position, the PyTorch reference's data. The task sets vocabulary and length")
      ->check(CLI::Validator(
          [tasks, list = joined(", ")](std::string& name) -> std::string {
            if (std::find(tasks.begin(), tasks.end(), name) != tasks.end()) return "";
            if (name == "text" || name == "tokens")
              return name + " reads a data file, which bench does not take; give one of " + list;
            return "unknown task '" + name + "'; give one of " + list;
          },
          "{" + joined(",") + "}"));  // shown in --help as the option's type, as CLI::IsMember would
  sub->add_option("--json", o->out_json, "Also write all results to this JSON file");
  sub->add_option("--sae", o->sae,
                  "Time a TopK SAE's training step instead, in this process, on random activations: d_in,expansion,k "
                  "(prints one JSON line: median step, tokens/s, allocations per step)");
  sub->add_option("--sae-batch", o->sae_batch, "Rows per SAE step (with --sae)")->capture_default_str();
  sub->add_option("--sae-dead-after", o->sae_dead_after,
                  "Rows without firing after which a feature is dead and AuxK trains it (with --sae)")
      ->capture_default_str();
  sub->add_option("--sae-one-thread-below", o->sae_one_thread_below,
                  "Run SAE steps whose encoder product has fewer multiply-adds than this on one thread (with --sae; "
                  "default: the library's bound, 3e8; 0: every step on --threads)")
      ->check(in_range(0, 1e15));
  sub->add_option("--one", o->one, "(internal) run one config in this process and print JSON")->group("");
  sub->add_flag("--peak", o->peak, "(internal) measure the sgemm peak and print JSON")->group("");
  sub->callback([&runner, o] { runner = [=] { return run_bench(*o); }; });
}

}  // namespace hl
