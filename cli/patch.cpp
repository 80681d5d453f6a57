// headlab patch: activation and attribution patching per head (hook_z) and per residual
// position: flags -> activation_patching -> tables, CSVs and heatmaps in --out.
#include <cstdio>
#include <memory>

#include "analysis/patching.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/run_dir.h"

namespace hl {

namespace {

int run_patch(const RoleOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("patch") : o.out;
  RoleModel m = load_role_model(o);
  const Task& task = role_task(m, o.checkpoint);
  // every example is in one batch, cached twice, with gradients once
  check_fits_in_memory(patching_memory_bytes(m.model->cfg, o.examples, task.seq_len()),
                       "--examples " + std::to_string(o.examples) + " of " + std::to_string(task.seq_len()) + " tokens");
  const std::vector<Batch> held = task.held_out(o.examples, o.seed, o.examples);
  const PatchingInputs in = corrupt_one_symbol(held[0], task.symbols(), o.seed);
  const PatchingResult r = activation_patching(*m.model, in);
  claim_output_dir(out, "patch");
  std::printf("activation patching, %zu rows of task %s (one source symbol corrupted); logit difference clean %.4f, "
              "corrupted %.4f; 1 = the clean run's, 0 = the corrupted run's\n\nper head (hook_z):\n\n",
              in.answers.size(), m.config.name.c_str(), r.clean_metric, r.corrupted_metric);
  write_patch_files(out, r);
  std::printf("\ncorrelation of attribution with exact patching: heads %.3f, residual positions %.3f\n", r.z_correlation,
              r.resid_correlation);
  std::printf("wrote %s/patch_heads.csv, patch_resid.csv, patch_heads.png, patch_resid.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_patch_command(CLI::App& app, CommandRunner& runner) {
  RoleOpts defaults;
  defaults.examples = 64;
  add_role_command(app, runner, "patch", "Activation and attribution patching per head (hook_z) and per residual position",
                   run_patch, defaults);
}

}  // namespace hl
