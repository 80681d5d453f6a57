// headlab compose: Q-, K- and V-composition scores between heads of consecutive layers:
// flags -> composition_scores -> table, CSV and heatmaps in --out. On a rotary model Q- and
// K-composition depend on the key's offset before the query (--offset; analysis/circuits.h).
#include <cstdio>
#include <memory>
#include <optional>

#include "analysis/circuits.h"
#include "cli/precision_option.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/run_dir.h"

namespace hl {

namespace {

struct ComposeFlags {
  int64_t offset = -1;  // --offset; -1: not given (the mean over every offset)
};

int run_compose(const RoleOpts& o, const ComposeFlags& f) {
  if (over_training_requested(o)) {
    if (f.offset >= 0) fail("--offset: one model's scores (--checkpoint); over training (--run) the scores are the mean over offsets");
    return write_scores_over_training(o.run, o.out, "compose", head_score_options(o));
  }
  const std::string out = o.out.empty() ? default_out_dir("compose") : o.out;
  RoleModel m = load_role_model(o);
  const ModelConfig& cfg = m.model->cfg;
  const int L = cfg.n_layers;
  if (L < 2) fail(o.checkpoint, ": composition needs at least 2 layers, the model has ", L);
  if (f.offset >= cfg.max_seq_len)
    fail("--offset ", f.offset, " is outside the key offsets 0..", cfg.max_seq_len - 1, " (max_seq_len ", cfg.max_seq_len, ")");
  const std::optional<int64_t> offset = f.offset >= 0 ? std::optional<int64_t>(f.offset) : std::nullopt;
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "compose");
  std::vector<CompositionScores> layers;
  for (int l = 0; l + 1 < L; ++l) layers.push_back(composition_scores(*m.model, l, l + 1, offset));
  write_compose_files(staged->staging(), layers, composition_baseline(cfg));
  staged->publish();
  if (cfg.positions == Positions::Rotary) {
    if (offset)
      std::printf("\nrotary positions: Q- and K-composition at key offset %lld (query - key)\n", static_cast<long long>(*offset));
    else
      std::printf("\nrotary positions: Q- and K-composition are the mean over key offsets 0..%lld (query - key; --offset for one)\n",
                  static_cast<long long>(cfg.max_seq_len - 1));
  } else if (offset) {
    std::printf("\nno rotary positions: W_QK is the same at every key offset\n");
  }
  std::printf("\nwrote %s/compose.csv, compose_baseline.csv, compose.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_compose_command(CLI::App& app, CommandRunner& runner) {
  auto flags = std::make_shared<ComposeFlags>();
  auto [sub, o] = add_role_command(app, runner, "compose", "Q-, K- and V-composition scores between heads of consecutive layers",
                                   nullptr);
  add_run_option(sub, *o);
  sub->add_option("--offset", flags->offset,
                  "Rotary models: the key offset (query position - key position) at which W_QK = (R(offset) W_Q)^T W_K enters Q- "
                  "and K-composition. Default: the mean over offsets 0..max_seq_len-1, every offset a query may read a key at, "
                  "since no one offset speaks for a head. V-composition is never rotated; models without rotary positions "
                  "score the same at every offset")
      ->check(in_range(0, 1e9));
  sub->callback([&runner, o = o, flags] {
    runner = [o, flags] {
      const PrecisionScope precision(precision_from_flag(o->precision));  // add_role_command's --precision
      return run_compose(*o, *flags);
    };
  });
}

}  // namespace hl
