// headlab compose: Q-, K- and V-composition scores between heads of consecutive layers:
// flags -> composition_scores -> table, CSV and heatmaps in --out.
#include <cstdio>
#include <memory>

#include "analysis/circuits.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/run_dir.h"

namespace hl {

namespace {

int run_compose(const RoleOpts& o) {
  if (over_training_requested(o)) return write_scores_over_training(o.run, o.out, "compose", head_score_options(o));
  const std::string out = o.out.empty() ? default_out_dir("compose") : o.out;
  RoleModel m = load_role_model(o);
  const int L = m.model->cfg.n_layers;
  if (L < 2) fail(o.checkpoint, ": composition needs at least 2 layers, the model has ", L);
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "compose");
  std::vector<CompositionScores> layers;
  for (int l = 0; l + 1 < L; ++l) layers.push_back(composition_scores(*m.model, l, l + 1));
  write_compose_files(staged->staging(), layers, composition_baseline(m.model->cfg));
  staged->publish();
  std::printf("\nwrote %s/compose.csv, compose_baseline.csv, compose.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_compose_command(CLI::App& app, CommandRunner& runner) {
  auto [sub, o] =
      add_role_command(app, runner, "compose", "Q-, K- and V-composition scores between heads of consecutive layers", run_compose);
  add_run_option(sub, *o);
}

}  // namespace hl
