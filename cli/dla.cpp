// headlab dla: direct logit attribution of the task's answers: each component of the final
// residual stream (embeddings, each head, W_O's bias, each MLP) projected on the answer token's
// unembedding direction through ln_final (TransformerLens's decompose_resid + apply_ln_to_stack +
// logit_attrs): flags -> direct_logit_attribution -> table, dla.csv, dla.json and dla.png in --out.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <nlohmann/json.hpp>

#include "analysis/decompose.h"
#include "analysis/intervals.h"
#include "datasets/tokenizer.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/run_dir.h"

namespace hl {

namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

int run_dla(const RoleOpts& o) {
  if (over_training_requested(o)) {
    if (!o.dla.tokens.empty()) fail("--tokens goes with --checkpoint: --run attributes the task's answers over training");
    return write_scores_over_training(o.run, o.out, "dla", head_score_options(o));
  }
  const std::string out = o.out.empty() ? default_out_dir("dla") : o.out;
  RoleModel m = load_role_model(o);
  const ModelConfig& cfg = m.model->cfg;
  if (cfg.norm != Norm::Pre)
    fail("dla needs a pre-norm model: ", o.checkpoint, " is post-norm (its residual stream is normalised after each block, "
         "so it is not a sum of components)");
  std::vector<Batch> data;
  std::string source;  // what the rows are, for the table's title and dla.json
  if (!o.dla.text.empty() && !o.dla.tokens.empty()) fail("give --tokens or --text, not both");
  if (!o.dla.tokenizer.empty() && o.dla.text.empty()) fail("--tokenizer encodes --text: give --text too");
  if (!o.dla.tokens.empty() || !o.dla.text.empty()) {  // one sequence: each position's next token is its answer
    const std::string flag = o.dla.tokens.empty() ? "--text" : "--tokens";
    std::vector<int32_t> ids;
    if (!o.dla.tokens.empty()) {
      ids = parse_token_ids(o.dla.tokens, cfg.vocab_size);
    } else {  // --tokenizer, else the files beside a Hugging Face directory's model
      const std::string dir = !o.dla.tokenizer.empty() ? o.dla.tokenizer : std::filesystem::is_directory(o.checkpoint) ? o.checkpoint : "";
      if (dir.empty()) fail("--text needs --tokenizer DIR (tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe)");
      const std::shared_ptr<const Tokenizer> tok = load_tokenizer(dir);
      check_tokenizer_fits(*tok, cfg.vocab_size, (o.dla.tokenizer.empty() ? "the tokenizer in " : "--tokenizer ") + dir);
      ids = tok->encode(o.dla.text, "--text", true);  // with the BOS/EOS the tokenizer's files add
    }
    if (ids.size() < 2) fail(flag, ": give at least 2 tokens (each position is attributed its next token)");
    if (static_cast<int64_t>(ids.size()) > cfg.max_seq_len)
      fail(flag, ": ", ids.size(), " tokens exceed the model's max_seq_len ", cfg.max_seq_len);
    const int64_t T = static_cast<int64_t>(ids.size());
    Batch b;
    b.inputs = Ids(Shape{1, T}, ids);
    b.targets = Ids(Shape{1, T});
    for (int64_t t = 0; t < T; ++t) b.targets.at(0, t) = t + 1 < T ? ids[static_cast<size_t>(t + 1)] : -1;
    data.push_back(std::move(b));
    source = flag;
  } else {
    data = role_task(m, o.checkpoint, "--tokens or --text (one sequence)").held_out(o.examples, o.seed, 64);
    source = "task " + m.config.name;
    std::fprintf(stderr, "dla: %d sequences of %s...\n", o.examples, source.c_str());
  }
  // per batch: one forward with the decomposition's hooks cached, and its logits
  const int64_t batch_rows = data[0].size(), T = data[0].inputs.shape[1];
  announce_memory("dla", estimate_step_bytes(cfg, batch_rows, T, false) - 4.0 * static_cast<double>(parameter_count(cfg)),
                  "batches of " + std::to_string(batch_rows) + " sequence(s) of " + std::to_string(T) + " tokens",
                  o.dla.tokens.empty() && o.dla.text.empty() ? "--examples (batches hold up to 64)" : "the tokens given (--tokens, --text)");
  const DlaResult r = direct_logit_attribution(*m.model, data);
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "dla");

  // One row per component, then the bias term and the logit itself: the components' means plus
  // the bias term's mean are the mean logit (each row's values are averaged alike).
  struct Row {
    std::string name;
    int layer, head;
    const std::vector<double>* per_row;
  };
  std::vector<Row> rows;
  for (size_t c = 0; c < r.labels.size(); ++c) rows.push_back({r.labels[c], r.layer[c], r.head[c], &r.per_row[c]});
  rows.push_back({"ln_final_bias", -1, -1, &r.bias_per_row});
  // a final soft-cap (cap * tanh(logit / cap)) is not a sum of components: they sum to the logit before it
  const float cap = cfg.final_softcap;
  const std::string logit_row = cap > 0.f ? "logit_before_cap" : "logit";
  rows.push_back({logit_row, -1, -1, &r.logit_per_row});

  nlohmann::json j = {{"data", source}, {"checkpoint", o.checkpoint}, {"examples", o.examples}, {"seed", o.seed},
                      {"rows", r.logit_per_row.size()}, {"positions", r.positions}};
  if (cap > 0.f) j["final_softcap"] = cap;
  std::string csv = "component,layer,head,mean,ci95_lo,ci95_hi\n";
  std::vector<std::vector<std::string>> table = {{"component", "layer", "head", "mean", "95% interval"}};
  HeadGrid heads(static_cast<size_t>(cfg.n_layers), std::vector<double>(static_cast<size_t>(cfg.n_heads), 0.0));
  for (const Row& row : rows) {
    const double mean = mean_of(*row.per_row);
    const Interval ci = bootstrap_interval95(*row.per_row, 2000, o.seed);
    const std::string layer = row.layer >= 0 ? std::to_string(row.layer) : "", head = row.head >= 0 ? std::to_string(row.head) : "";
    csv += row.name + "," + layer + "," + head + "," + num(mean) + "," + num(ci.lo) + "," + num(ci.hi) + "\n";
    table.push_back({row.name, layer, head, fixed(mean, 4), ci.defined() ? "[" + fixed(ci.lo, 4) + ", " + fixed(ci.hi, 4) + "]" : "-"});
    j["components"].push_back({{"component", row.name},
                               {"layer", row.layer >= 0 ? nlohmann::json(row.layer) : nlohmann::json()},
                               {"head", row.head >= 0 ? nlohmann::json(row.head) : nlohmann::json()},
                               {"mean", mean},
                               {"ci95_lo", ci.defined() ? nlohmann::json(ci.lo) : nlohmann::json()},
                               {"ci95_hi", ci.defined() ? nlohmann::json(ci.hi) : nlohmann::json()}});
    if (row.head >= 0) heads[static_cast<size_t>(row.layer)][static_cast<size_t>(row.head)] = mean;
  }
  if (!o.dla.tokens.empty()) j["tokens"] = o.dla.tokens;
  if (!o.dla.text.empty()) j["text"] = o.dla.text;
  std::printf("direct logit attribution of the answer token (%s, %zu sequence(s), %lld answer positions; mean over the "
              "sequences of each sequence's mean, 95%% bootstrap interval over the sequences; components + ln_final_bias = "
              "%s):\n", source.c_str(), r.logit_per_row.size(), static_cast<long long>(r.positions), logit_row.c_str());
  if (cap > 0.f)
    std::printf("the model caps its logits (%g * tanh(logit / %g)), which is not a sum of components: the attributions are of "
                "the logit before the cap\n", static_cast<double>(cap), static_cast<double>(cap));
  std::printf("\n");
  print_table(table);
  write_file_atomic(staged->file("dla.csv"), csv);
  write_file_atomic(staged->file("dla.json"), j.dump(2) + "\n");
  double extent = 0;  // a symmetric colour scale: positive and negative attributions apart
  for (auto& row : heads)
    for (double v : row) extent = std::max(extent, std::fabs(v));
  if (extent == 0) extent = 1;
  plot_heatmap_grid(staged->file("dla.png"), "Direct logit attribution of the answer per head", 1, 1,
                    {head_heatmap("mean attribution", heads, "L", "H")}, "head", "layer", static_cast<float>(-extent),
                    static_cast<float>(extent));
  staged->publish();
  std::printf("\nwrote %s/dla.csv, dla.json, dla.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_dla_command(CLI::App& app, CommandRunner& runner) {
  RoleOpts defaults;
  defaults.data = "task";
  auto [sub, o] = add_role_command(app, runner, "dla",
                                   "Direct logit attribution: each head's, MLP's and embedding's share of the answer logit on the task",
                                   run_dla, defaults);
  add_run_option(sub, *o);
  sub->add_option("--tokens", o->dla.tokens,
                  "Attribute the next-token predictions of these token ids (e.g. \"11 3 4 12 3 4\") instead of the task's "
                  "answers: one sequence, so no interval");
  sub->add_option("--text", o->dla.text, "Attribute the next-token predictions of this text, encoded with --tokenizer (or the "
                                     "tokenizer files in a Hugging Face model directory given as --checkpoint), with the BOS/EOS they add");
  sub->add_option("--tokenizer", o->dla.tokenizer, "Tokenizer directory (tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe) for --text");
}

}  // namespace hl
