#include "train/settings.h"

#include <algorithm>
#include <charconv>
#include <type_traits>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

// Rows leave trailing members (range, choices, switches) at their defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace hl {

namespace {
// 65536, 0.999, 1e-30: whole numbers without an exponent
std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v == std::floor(v) && std::fabs(v) < 1e9 ? "%.0f" : "%g", v);
  return buf;
}
bool open_top(double hi) { return hi >= 1e9; }  // "no limit" in practice: shown as a lower bound only
}  // namespace

std::string range_text(double lo, double hi) {
  return open_top(hi) ? ">= " + number_text(lo) : "[" + number_text(lo) + " - " + number_text(hi) + "]";
}

std::string range_problem(const std::string& text, double lo, double hi) {
  double v = 0;  // from_chars: the same in every locale
  const char* first = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
  const auto [end, ec] = std::from_chars(first, text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return "'" + text + "' is not a finite number";
  return range_problem(v, text, lo, hi);
}

std::string range_problem(double v, const std::string& text, double lo, double hi) {
  if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
  const std::string range = "[" + number_text(lo) + ", " + number_text(hi) + "]";
  if (v < lo) return "value " + text + (open_top(hi) ? " is below " + number_text(lo) : " is outside " + range);
  if (v > hi) return "value " + text + (open_top(hi) ? " is too large" : " is outside " + range);
  return "";
}

void check_option_value(const std::string& flag, FieldRef value, double lo, double hi, const std::vector<std::string>& choices) {
  std::visit(
      [&](auto* v) {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (!choices.empty() && std::find(choices.begin(), choices.end(), *v) == choices.end()) {
            std::string list;
            for (auto& c : choices) list += (list.empty() ? "" : ", ") + c;
            fail(flag, ": '", *v, "' is not one of ", list);
          }
        } else if constexpr (!std::is_same_v<T, bool>) {
          if (std::isnan(lo)) return;
          char text[40];
          std::snprintf(text, sizeof text, "%.9g", static_cast<double>(*v));
          const std::string problem = range_problem(static_cast<double>(*v), text, lo, hi);
          if (!problem.empty()) fail(flag, ": ", problem);
        }
      },
      value);
}

namespace {
using R = OnResume;
// FIELD(model.d_model): the member a flag writes, as a function of the values
#define FIELD(member) [](TrainFlagValues& v) -> FieldRef { return &v.member; }
constexpr double kMany = 1e15;  // "no limit" in practice

std::vector<TrainSetting> make_table() {
  std::string task_help = "Task:";
  for (const TaskInfo& t : task_registry()) task_help += "\n  " + t.name + ": " + t.help;
  std::string arch_help = "Architecture preset: defaults for the settings below, each overridden by its own flag:";
  std::vector<std::string> arch_names = {""};  // "" = none
  for (const ArchPreset& p : arch_presets()) {
    arch_names.push_back(p.name);
    arch_help += "\n  " + p.name + ": " + p.help;
    std::string list;
    for (const auto& [flag, value] : p.settings) list += (list.empty() ? " (" : ", ") + flag + " " + value;
    arch_help += list.empty() ? " (today's defaults)" : list + ")";
  }
  // clang-format off
  return {
    {"--d-model", "/model/d_model", "Model width", FIELD(args.model.d_model), R::kMustMatch, 1, 1 << 16},
    {"--layers", "/model/n_layers", "Transformer blocks", FIELD(args.model.n_layers), R::kMustMatch, 1, 1024},
    {"--heads", "/model/n_heads", "Attention heads per layer", FIELD(args.model.n_heads), R::kMustMatch, 1, 4096},
    {"--kv-heads", "/model/n_kv_heads", "Key/value heads (GQA/MQA); 0 = --heads", FIELD(args.model.n_kv_heads), R::kMustMatch, 0, 4096},
    {"--d-head", "/model/d_head", "Head size; 0 = d_model / heads", FIELD(args.model.d_head), R::kMustMatch, 0, 1 << 20},
    {"--d-ff", "/model/d_ff", "Feed-forward width; 0 = attention-only (no MLP)", FIELD(args.model.d_ff), R::kMustMatch, 0, 1 << 20},
    {"--norm", "/model/norm", "pre or post LayerNorm", FIELD(norm), R::kMustMatch, NAN, NAN, {"pre", "post"}},
    {"--activation", "/model/activation", "gelu_erf, gelu_tanh, relu, relu2 (ReLU squared) or silu; --mlp geglu: its gelu",
     FIELD(activation), R::kMustMatch, NAN, NAN, {"gelu_erf", "gelu_tanh", "relu", "relu2", "silu"}},
    {"--positions", "/model/positions", "learned, sinusoidal, rotary (RoPE, on q and k in each layer) or none (NoPE)",
     FIELD(positions), R::kMustMatch, NAN, NAN, {"learned", "sinusoidal", "rotary", "none"}},
    {"--attn-bias", "/model/attn_bias", "Biases on W_Q, W_K, W_V, W_O", FIELD(args.model.attn_bias)},
    // attention options (docs/architectures.md)
    {"--rope-theta", "/model/rope_theta", "Rotary positions: the base of the angles", FIELD(args.model.rope_theta), R::kMustMatch, 1e-3, 1e12},
    {"--rope-theta-local", "/model/rope_theta_local", "Rotary positions: the base of the local (sliding-window) layers' angles (Gemma 3); 0 = --rope-theta",
     FIELD(args.model.rope_theta_local), R::kMustMatch, 0, 1e12},
    {"--rotary-dim", "/model/rotary_dim", "Rotary positions: the dims of each head that turn (even, <= d_head; 0 = --rotary-pct's)",
     FIELD(args.model.rotary_dim), R::kMustMatch, 0, 1 << 20},
    {"--rotary-pct", "/model/rotary_pct", "Rotary positions, --rotary-dim 0: this fraction of each head turns (Pythia 0.25)",
     FIELD(args.model.rotary_pct), R::kMustMatch, 0.01, 1},
    {"--rotary-style", "/model/rotary_style", "Rotary pairs: half (rotate-half, Llama/NeoX) or interleaved (GPT-J)",
     FIELD(args.model.rotary_style), R::kMustMatch, NAN, NAN, {"half", "interleaved"}},
    {"--qk-norm", "/model/qk_norm", "RMSNorm over d_head on queries and keys, before rotary (Qwen3, OLMo2)", FIELD(args.model.qk_norm)},
    {"--attn-scale", "/model/attn_scale", "Score scale; 0 = 1/sqrt(d_head), 1 = unscaled (GPT-Neo)", FIELD(args.model.attn_scale),
     R::kMustMatch, 0, 1e6},
    {"--attn-softcap", "/model/attn_softcap", "Soft-cap of the scores, cap * tanh(score / cap) (Gemma 2); 0 = none",
     FIELD(args.model.attn_softcap), R::kMustMatch, 0, 1e30},
    {"--sliding-window", "/model/sliding_window", "Local layers see the last N keys (sliding window); 0 = none",
     FIELD(args.model.sliding_window), R::kMustMatch, 0, 1 << 20},
    {"--window-layers", "/model/window_layers", "Which layers are local: all, alternate (even layers), L:G (e.g. 5:1) or one L/G letter per layer (e.g. GLGL)",
     FIELD(args.model.window_layers)},
    {"--qkv-bias", "/model/qkv_bias", "Biases on W_Q, W_K, W_V", FIELD(args.model.qkv_bias)},
    {"--o-bias", "/model/o_bias", "Bias on W_O", FIELD(args.model.o_bias)},
    {"--mlp-bias", "/model/mlp_bias", "Biases on the feed-forward layers", FIELD(args.model.mlp_bias)},
    // block options (docs/architectures.md)
    {"--arch", "/model/arch", arch_help, FIELD(args.model.arch), R::kMustMatch, NAN, NAN, arch_names},
    {"--normalization", "/model/normalization", "layernorm, rmsnorm or rmsnorm_1p (x / rms * (1 + w), as Gemma); "
     "every norm of the model, eps 1e-5", FIELD(normalization), R::kMustMatch, NAN, NAN, {"layernorm", "rmsnorm", "rmsnorm_1p"}},
    {"--sandwich-norm", "/model/sandwich_norm", "A norm on attention's and the MLP's output before each residual add (Gemma 2)",
     FIELD(args.model.sandwich_norm)},
    {"--mlp", "/model/mlp", "plain, swiglu or geglu: gated fc2(act(gate x) * fc1 x), act silu or --activation's gelu",
     FIELD(mlp), R::kMustMatch, NAN, NAN, {"plain", "swiglu", "geglu"}},
    {"--parallel-block", "/model/parallel_block", "x + attn(ln1 x) + mlp(ln2 x) (GPT-NeoX, GPT-J)", FIELD(args.model.parallel_block)},
    {"--embed-scale", "/model/embed_scale", "Token embeddings times sqrt(d_model) (Gemma)", FIELD(args.model.embed_scale)},
    {"--final-softcap", "/model/final_softcap", "Logits -> cap tanh(logits / cap); 0 = none", FIELD(args.model.final_softcap),
     R::kMustMatch, 0, 1e30},
    {"--dropout", "/dropout", "Dropout on embeddings and residual branches", FIELD(args.model.dropout), R::kMustMatch, 0, 0.999},
    {"--attn-dropout", "/attn_dropout", "Dropout on attention weights", FIELD(args.model.attn_dropout), R::kMustMatch, 0, 0.999},
    {"--task", "/task/name", task_help, FIELD(args.task.name), R::kMustMatch, NAN, NAN, task_names()},
    {"--data", "/task/data", "Data file of --task text (any UTF-8 file) or tokens (.safetensors or .npy)", FIELD(args.task.data)},
    {"--tokenizer", "/task/tokenizer", "--task text: tokenizer directory (tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe); "
     "the model learns its tokens instead of bytes", FIELD(args.task.tokenizer)},
    {"--eval-data", "/task/eval_data", "Held-out file of --task tokens (default: the last 10% of the rows)", FIELD(args.task.eval_data)},
    {"--shuffle", "/task/shuffle", "--task tokens: on = random rows, off = consecutive rows in file order", FIELD(shuffle),
     R::kMustMatch, NAN, NAN, {"on", "off"}},
    {"--length", "/task/max_len", "Length: copy tasks the (largest) n; induction the tokens repeated; text the context in bytes (tokens with --tokenizer)",
     FIELD(args.task.max_len), R::kMustMatch, 1, 1 << 19},
    {"--min-length", "/task/min_len", "Copy tasks: the smallest n; 0 = --length (fixed length)", FIELD(args.task.min_len),
     R::kMustMatch, 0, 1 << 19},
    {"--alphabet", "/task/alphabet", "Symbols of the copy tasks and induction; --task tokens: the vocabulary (0 = largest id + 1)",
     FIELD(args.task.alphabet), R::kMustMatch, 0, 1 << 24},
    {"--batch", "/batch", "Sequences per step", FIELD(args.batch), R::kMustMatch, 1, INT_MAX},
    {"--steps", "/steps", "Training steps", FIELD(args.steps), R::kMayChange, 1, kMany},
    {"--lr", "/lr", "Peak learning rate", FIELD(args.lr), R::kMustMatch, 1e-30, 100},
    {"--schedule", "/schedule", "constant, cosine or linear (after warmup)", FIELD(args.schedule), R::kMustMatch, NAN, NAN,
     {"constant", "cosine", "linear"}},
    {"--warmup", "/warmup", "Linear warmup steps", FIELD(args.warmup), R::kMustMatch, 0, kMany},
    {"--min-lr-ratio", "/min_lr_ratio", "Final lr / peak lr for cosine and linear", FIELD(args.min_lr_ratio), R::kMustMatch, 0, 1},
    {"--optimizer", "/optimizer", "adamw, adam or sgd", FIELD(args.optimizer), R::kMustMatch, NAN, NAN, {"adamw", "adam", "sgd"}},
    {"--weight-decay", "/weight_decay", "Weight decay", FIELD(args.weight_decay), R::kMustMatch, 0, 1e3},
    {"--decay-all", "/decay_all", "Also decay biases, LayerNorm and embeddings", FIELD(args.decay_all), R::kMustMatch, NAN, NAN, {},
     /*is_switch=*/true},
    {"--momentum", "/momentum", "SGD momentum", FIELD(args.momentum), R::kMustMatch, 0, 0.999999},
    {"--precision", "/precision", "float32, or bf16: the linear layers' products with bf16 operands and float32 "
     "accumulation (needs AVX512_BF16; weights under 128 wide stay float32, where bf16 is not faster); weights, "
     "gradients, optimizer, norms, softmax, loss stay float32",
     FIELD(args.precision), R::kMustMatch, NAN, NAN, {"float32", "bf16"}},
    {"--clip", "/clip", "Clip gradients to this global norm; 0 = off", FIELD(args.clip), R::kMustMatch, 0, 1e12},
    {"--seed", "/seed", "Seed of initialisation, data and dropout", FIELD(args.seed), R::kMustMatch, 0, 1.8e19},
    {"--threads", "/threads", "Threads (OpenMP and OpenBLAS); under mpirun: the cores of a node shared among its ranks", FIELD(args.threads), R::kIncidental, 1, 1024},
    {"--eval-every", "/eval_every", "Evaluate on the held-out set every N steps", FIELD(args.eval_every), R::kMayChange, 1, kMany},
    {"--eval-size", "/eval_size", "Held-out sequences", FIELD(args.eval_size), R::kMustMatch, 1, INT_MAX},
    {"--eval-seed", "/eval_seed", "Seed of the held-out set", FIELD(args.eval_seed), R::kMustMatch, 0, 1.8e19},
    {"--checkpoint-every", "/checkpoint_every", "Checkpoint every N steps (and at the end)", FIELD(args.checkpoint_every),
     R::kIncidental, 1, kMany, {}, false, /*train_only=*/true},
    {"--snapshot-every", "/snapshot_every", "Keep the run's full resume state every N steps, step 0 included, as "
     "RUN/snapshots/step_NNNNNNNN.safetensors (studies take --run RUN); 0 = off", FIELD(args.snapshot_every),
     R::kIncidental, 0, kMany, {}, false, /*train_only=*/true},
    {"--eval-ar", "/eval_autoregressive", "Greedy autoregressive exact match at every eval (always at the end)",
     FIELD(args.eval_autoregressive), R::kMayChange, NAN, NAN, {}, true, true},
    {"--skip-nonfinite", "/skip_nonfinite", "Skip steps with a non-finite loss or gradient instead of stopping",
     FIELD(args.skip_nonfinite), R::kIncidental, NAN, NAN, {}, true, true},
  };
  // clang-format on
}
#undef FIELD

}  // namespace

const std::vector<ArchPreset>& arch_presets() {
  // block options, then attention options (neox's quarter of each head is --rotary-pct: a
  // --rotary-dim given explicitly takes its place)
  static const std::vector<ArchPreset> presets = {
      {"gpt2", "the GPT-2-style block", {}},
      {"llama", "Llama-style: RMSNorm, SwiGLU, no biases, rotary positions",
       {{"--normalization", "rmsnorm"}, {"--mlp", "swiglu"}, {"--mlp-bias", "false"}, {"--attn-bias", "false"},
        {"--positions", "rotary"}}},
      {"neox", "GPT-NeoX (Pythia): parallel attention and MLP, LayerNorm, gelu, rotary on a quarter of each head",
       {{"--parallel-block", "true"}, {"--attn-bias", "true"}, {"--activation", "gelu_erf"}, {"--positions", "rotary"},
        {"--rotary-pct", "0.25"}}},
      {"gemma2", "Gemma 2: RMSNorm (1 + w), sandwich norms, GeGLU, scaled embeddings, logit soft-cap 30, rotary, "
                 "attention soft-cap 50, local (4096) and global layers alternating",
       {{"--normalization", "rmsnorm_1p"}, {"--sandwich-norm", "true"}, {"--mlp", "geglu"}, {"--activation", "gelu_tanh"},
        {"--mlp-bias", "false"}, {"--attn-bias", "false"}, {"--embed-scale", "true"}, {"--final-softcap", "30"},
        {"--positions", "rotary"}, {"--attn-softcap", "50"}, {"--sliding-window", "4096"}, {"--window-layers", "alternate"}}},
  };
  return presets;
}

const ArchPreset* find_arch_preset(const std::string& name) {
  for (const ArchPreset& p : arch_presets())
    if (p.name == name) return &p;
  return nullptr;
}

std::string TrainSetting::name() const {
  std::string n = flag.substr(2);
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

const std::vector<TrainSetting>& train_settings() {
  static const std::vector<TrainSetting> table = make_table();
  return table;
}

const TrainSetting* find_train_setting(const std::string& flag_or_name) {
  for (const TrainSetting& s : train_settings())
    if (s.flag == flag_or_name || s.name() == flag_or_name) return &s;
  return nullptr;
}

namespace {
// A value written as text (a task's training default) into the field of its row.
void set_from_text(const TrainSetting& s, TrainFlagValues& v, const std::string& text) {
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *field = text;
        } else if constexpr (std::is_same_v<T, bool>) {
          *field = text == "true" || text == "1";
        } else {
          double x = 0;
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
          if (ec != std::errc() || end != text.data() + text.size()) fail("task default ", s.flag, " '", text, "' is not a number");
          *field = static_cast<T>(x);
        }
      },
      s.field(v));
}
}  // namespace

TrainArgs resolve_train_flags(const TrainFlagValues& given_values, const std::function<bool(const std::string&)>& given,
                              bool task_training_defaults) {
  // The task's training defaults (induction's model and schedule) apply to the flags not given.
  TrainFlagValues v = given_values;
  // The preset first: a task's training defaults (induction's sizes) then fill in what is still
  // not given, and neither overrides an explicit flag.
  if (!v.args.model.arch.empty()) {
    const ArchPreset* preset = find_arch_preset(v.args.model.arch);
    if (!preset) fail("--arch: '", v.args.model.arch, "' is not a preset");
    for (const auto& [flag, text] : preset->settings)
      if (!given(flag)) set_from_text(*find_train_setting(flag), v, text);
    // a window pattern goes with its window: an explicit --sliding-window 0 takes gemma2's away
    if (given("--sliding-window") && v.args.model.sliding_window == 0 && !given("--window-layers"))
      v.args.model.window_layers = "all";
  }
  if (const TaskInfo* task = task_training_defaults ? find_task(v.args.task.name) : nullptr)
    for (const auto& [flag, text] : task->train_defaults)
      if (!given(flag))
        if (const TrainSetting* s = find_train_setting(flag)) set_from_text(*s, v, text);
  TrainArgs a = v.args;
  // A task's preset (alphabet, lengths) applies to what was not given explicitly; e.g.
  // varcopy: alphabet 64, n in 1..16; induction: blocks of 4..12 of 32 tokens; text: 64-byte context.
  const TaskConfig p = TaskConfig::preset(a.task.name);
  if (!given("--alphabet")) a.task.alphabet = p.alphabet;
  if (!given("--length")) a.task.max_len = p.max_len;
  if (!given("--min-length")) a.task.min_len = p.min_len != p.max_len ? p.min_len : 0;
  if (a.task.min_len == 0) a.task.min_len = a.task.max_len;  // fixed length
  if (!given("--min-length") && a.task.min_len > a.task.max_len) a.task.min_len = a.task.max_len;  // a short --length
  a.task.reverse = p.reverse;
  a.task.shuffle = v.shuffle == "on";
  a.model.norm = parse_norm(v.norm);
  a.model.activation = parse_activation(v.activation);
  a.model.positions = parse_positions(v.positions);
  a.model.normalization = parse_normalization(v.normalization);
  a.model.mlp = parse_mlp(v.mlp);
  // a SwiGLU gate is silu whatever --activation says: another one given would be ignored
  if (a.model.mlp == Mlp::SwiGLU && given("--activation") && a.model.activation != Activation::Silu)
    fail("--mlp swiglu: its gate is silu, so --activation ", v.activation, " would be ignored (leave --activation out, or "
         "--mlp geglu for a gelu gate)");
  return a;
}

TrainArgs resume_with_flags(const TrainArgs& stored, const TrainArgs& given,
                            const std::function<bool(const std::string&)>& given_flag, const std::string& source) {
  using json = nlohmann::json;
  const json now = json::parse(given.to_json());
  json then = json::parse(stored.to_json());
  for (const TrainSetting& s : train_settings()) {
    if (!given_flag(s.flag)) continue;
    const json::json_pointer p(s.json_pointer);
    const json a = now.value(p, json()), b = then.value(p, json());
    if (s.on_resume == OnResume::kMustMatch) {
      if (a != b) fail(s.flag, " ", a.dump(), " does not match the run being resumed (", b.dump(), " in ", source, ")");
    } else {
      then[p] = a;
    }
  }
  TrainArgs r = TrainArgs::from_json(then.dump(), source);
  r.init = stored.init;
  return r;
}

}  // namespace hl
