#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "train/commands.h"

namespace hl {

void TrainFlags::add(CLI::App* app, bool with_run_flags, bool with_heads) {
  TrainArgs& a = args;
  app_ = app;
  a.task.min_len = 0;  // shown as "0 = --length"; resolve() fills it in
  app->add_option("--d-model", a.model.d_model, "Model width")->capture_default_str()->check(in_range(1, 1 << 16));
  app->add_option("--layers", a.model.n_layers, "Transformer blocks")->capture_default_str()->check(in_range(1, 1024));
  if (with_heads) app->add_option("--heads", a.model.n_heads, "Attention heads per layer")->capture_default_str()->check(in_range(1, 4096));
  app->add_option("--kv-heads", a.model.n_kv_heads, "Key/value heads (GQA/MQA); 0 = --heads")->capture_default_str()->check(in_range(0, 4096));
  app->add_option("--d-head", a.model.d_head, "Head size; 0 = d_model / heads")->capture_default_str()->check(in_range(0, 1 << 20));
  app->add_option("--d-ff", a.model.d_ff, "Feed-forward width")->capture_default_str()->check(in_range(1, 1 << 20));
  app->add_option("--norm", norm, "pre or post LayerNorm")->capture_default_str()->check(CLI::IsMember({"pre", "post"}));
  app->add_option("--activation", activation, "gelu_erf, gelu_tanh or relu")
      ->capture_default_str()->check(CLI::IsMember({"gelu_erf", "gelu_tanh", "relu"}));
  app->add_option("--positions", positions, "learned or sinusoidal")
      ->capture_default_str()->check(CLI::IsMember({"learned", "sinusoidal"}));
  app->add_option("--attn-bias", a.model.attn_bias, "Biases on W_Q, W_K, W_V, W_O")->capture_default_str();
  app->add_option("--mlp-bias", a.model.mlp_bias, "Biases on the feed-forward layers")->capture_default_str();
  app->add_option("--dropout", a.model.dropout, "Dropout on embeddings and residual branches")->capture_default_str()->check(in_range(0, 0.999));
  app->add_option("--attn-dropout", a.model.attn_dropout, "Dropout on attention weights")->capture_default_str()->check(in_range(0, 0.999));
  std::string task_help = "Task:";
  for (const TaskInfo& t : task_registry()) task_help += "\n  " + t.name + ": " + t.help;
  app->add_option("--task", a.task.name, task_help)->capture_default_str()->check(CLI::IsMember(task_names()));
  app->add_option("--data", a.task.data, "Data file of --task text (any UTF-8 file) or tokens (.safetensors or .npy)");
  app->add_option("--eval-data", a.task.eval_data, "Held-out file of --task tokens (default: the last 10% of the rows)");
  app->add_option("--shuffle", shuffle, "--task tokens: on = random rows, off = consecutive rows in file order")
      ->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  app->add_option("--length", a.task.max_len, "Length: copy tasks the (largest) n; induction the tokens repeated; text the context in bytes")->capture_default_str()->check(in_range(1, 1 << 19));
  app->add_option("--min-length", a.task.min_len, "Copy tasks: the smallest n; 0 = --length (fixed length)")->capture_default_str()->check(in_range(0, 1 << 19));
  app->add_option("--alphabet", a.task.alphabet, "Symbols of the copy tasks and induction; --task tokens: the vocabulary (0 = largest id + 1)")->capture_default_str()->check(in_range(0, 1 << 24));
  app->add_option("--batch", a.batch, "Sequences per step")->capture_default_str()->check(in_range(1, INT_MAX));
  app->add_option("--steps", a.steps, "Training steps")->capture_default_str()->check(in_range(1, 1e15));
  app->add_option("--lr", a.lr, "Peak learning rate")->capture_default_str()->check(in_range(1e-30, 100));
  app->add_option("--schedule", a.schedule, "constant, cosine or linear (after warmup)")
      ->capture_default_str()->check(CLI::IsMember({"constant", "cosine", "linear"}));
  app->add_option("--warmup", a.warmup, "Linear warmup steps")->capture_default_str()->check(in_range(0, 1e15));
  app->add_option("--min-lr-ratio", a.min_lr_ratio, "Final lr / peak lr for cosine and linear")->capture_default_str()->check(in_range(0, 1));
  app->add_option("--optimizer", a.optimizer, "adamw, adam or sgd")
      ->capture_default_str()->check(CLI::IsMember({"adamw", "adam", "sgd"}));
  app->add_option("--weight-decay", a.weight_decay, "Weight decay")->capture_default_str()->check(in_range(0, 1e3));
  app->add_flag("--decay-all", a.decay_all, "Also decay biases, LayerNorm and embeddings");
  app->add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str()->check(in_range(0, 0.999999));
  app->add_option("--clip", a.clip, "Clip gradients to this global norm; 0 = off")->capture_default_str()->check(in_range(0, 1e12));
  app->add_option("--seed", a.seed, "Seed of initialisation, data and dropout")->capture_default_str()->check(in_range(0, 1.8e19));
  app->add_option("--threads", a.threads, "Threads (OpenMP and OpenBLAS)")->capture_default_str()->check(in_range(1, 1024));
  app->add_option("--eval-every", a.eval_every, "Evaluate on the held-out set every N steps")->capture_default_str()->check(in_range(1, 1e15));
  app->add_option("--eval-size", a.eval_size, "Held-out sequences")->capture_default_str()->check(in_range(1, INT_MAX));
  app->add_option("--eval-seed", a.eval_seed, "Seed of the held-out set")->capture_default_str()->check(in_range(0, 1.8e19));
  if (with_run_flags) {
    app->add_option("--checkpoint-every", a.checkpoint_every, "Checkpoint every N steps (and at the end)")->capture_default_str()->check(in_range(1, 1e15));
    app->add_flag("--eval-ar", a.eval_autoregressive, "Greedy autoregressive exact match at every eval (always at the end)");
    app->add_flag("--skip-nonfinite", a.skip_nonfinite, "Skip steps with a non-finite loss or gradient instead of stopping");
  }
}

TrainArgs TrainFlags::resolve() {
  TrainArgs a = args;
  // A task's preset (alphabet, lengths) applies to what was not given explicitly; e.g.
  // varcopy: alphabet 64, n in 1..16; induction: 16 of 32 tokens; text: 64-byte context.
  const TaskConfig p = TaskConfig::preset(a.task.name);
  if (!given("--alphabet")) a.task.alphabet = p.alphabet;
  if (!given("--length")) a.task.max_len = p.max_len;
  if (!given("--min-length")) a.task.min_len = p.min_len != p.max_len ? p.min_len : 0;
  if (a.task.min_len == 0) a.task.min_len = a.task.max_len;  // fixed length
  a.task.reverse = p.reverse;
  a.task.shuffle = shuffle == "on";
  a.model.norm = parse_norm(norm);
  a.model.activation = parse_activation(activation);
  a.model.positions = parse_positions(positions);
  return a;
}

int64_t parse_int(const std::string& text, int64_t lo, int64_t hi, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long long v = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    fail(what, ": '", text, "' is not a whole number");
  if (v < lo || v > hi) fail(what, ": ", v, " is outside ", lo, "..", hi);
  return v;
}

namespace {
// 65536, 0.999, 1e-30: whole numbers without an exponent
std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v == std::floor(v) && std::fabs(v) < 1e9 ? "%.0f" : "%g", v);
  return buf;
}
}  // namespace

CLI::Validator in_range(double lo, double hi) {
  const bool open_top = hi >= 1e9;  // "no limit" in practice: shown as a lower bound only
  const std::string desc = open_top ? ">= " + number_text(lo) : "[" + number_text(lo) + " - " + number_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, open_top](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v)) return "'" + s + "' is not a finite number";
        if (v < lo) return "value " + s + (open_top ? " is below " + number_text(lo) : " is outside [" + number_text(lo) + ", " + number_text(hi) + "]");
        if (v > hi) return "value " + s + (open_top ? " is too large" : " is outside [" + number_text(lo) + ", " + number_text(hi) + "]");
        return "";
      },
      desc);
}

namespace {
extern "C" void on_stop_signal(int sig) {
  request_stop();
  std::signal(sig, SIG_DFL);  // a second Ctrl-C ends the process at once
}
}  // namespace

void install_stop_handler() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

std::string default_out_dir(const std::string& command) {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return "runs/" + command + "-" + buf;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * v);
  return buf;
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  if (rows.empty()) return;
  std::vector<size_t> w(rows[0].size(), 0);
  for (auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string line;
    for (size_t c = 0; c < rows[i].size(); ++c) {
      const std::string& s = rows[i][c];
      const bool numeric = !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-');
      const bool left = c == 0 || !numeric;
      const std::string padding(w[c] - s.size(), ' ');
      line += (c ? "  " : "") + (left ? s + padding : padding + s);
    }
    std::printf("%s\n", line.c_str());
    if (i == 0) {
      std::string rule;
      for (size_t c = 0; c < w.size(); ++c) rule += (c ? "  " : "") + std::string(w[c], '-');
      std::printf("%s\n", rule.c_str());
    }
  }
}

}  // namespace hl
