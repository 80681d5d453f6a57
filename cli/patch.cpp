// headlab patch: activation and attribution patching per head (hook_z) and per residual
// position: flags -> activation_patching -> tables, CSVs and heatmaps in --out. With --hook (and
// --axes), generic activation patching of any hook point over its layer/head/pos axes:
// flags -> generic_activation_patch -> patch_<hook>.csv and patch_<hook>.json.
#include <cstdio>
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "analysis/detectors.h"
#include "analysis/patching.h"
#include "cli/progress.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/run_dir.h"

namespace hl {

namespace {

std::vector<std::string> split_axes(const std::string& text) {
  std::vector<std::string> axes;
  size_t at = 0;
  while (!text.empty()) {
    const size_t comma = text.find(',', at);
    axes.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return axes;
}

// --hook: the generic loop over the hook's axes, one CSV row per index (full precision: the
// numbers Python's activation_patching gives, bit for bit) and a JSON of the grid.
int run_generic_patch(const RoleOpts& o, const std::string& out, RoleModel& m, const PatchingInputs& in) {
  const std::vector<std::string> axes = o.patch.axes.empty() ? default_patch_axes(*m.model, o.patch.hook) : split_axes(o.patch.axes);
  const PatchGrid g = generic_activation_patch(*m.model, in, o.patch.hook, axes);
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "patch");
  std::string stem = o.patch.hook;
  std::replace(stem.begin(), stem.end(), '.', '_');
  std::string csv, header;
  for (const std::string& a : axes) header += a + ",";
  csv = header + "restored\n";
  std::vector<std::vector<std::string>> table = {split_axes(header + "restored")};
  table[0].erase(std::remove(table[0].begin(), table[0].end(), std::string()), table[0].end());
  std::vector<int64_t> idx(axes.size());
  char value[64];
  for (size_t flat = 0; flat < g.values.size(); ++flat) {
    for (int64_t f = static_cast<int64_t>(flat), a = static_cast<int64_t>(axes.size()) - 1; a >= 0; --a)
      idx[a] = f % g.shape[a], f /= g.shape[a];
    std::vector<std::string> row;
    for (int64_t i : idx) csv += std::to_string(i) + ",", row.push_back(std::to_string(i));
    std::snprintf(value, sizeof value, "%.17g", g.values[flat]);
    csv += std::string(value) + "\n";
    row.push_back(fixed(g.values[flat], 4));
    table.push_back(row);
  }
  std::printf("activation patching of %s over %s, %zu rows of %s (one %s token corrupted per row); logit difference clean %.4f, "
              "corrupted %.4f; restored fraction: 1 = the clean run's, 0 = the corrupted run's\n\n",
              o.patch.hook.c_str(), o.patch.axes.empty() ? (axes[0] + (axes.size() > 1 ? "," + axes[1] : "")).c_str() : o.patch.axes.c_str(),
              in.answers.size(), patching_data_name(o, m).c_str(), o.corrupt.c_str(),
              g.clean_metric, g.corrupted_metric);
  warn_if_corruption_changes_little(g.clean_metric, g.corrupted_metric);
  if (table.size() <= 65) print_table(table);
  else std::printf("(%zu values: see the CSV)\n", g.values.size());
  write_file_atomic(staged->staging() + "/patch_" + stem + ".csv", csv);
  nlohmann::json j = {{"hook", o.patch.hook},        {"hooks", g.hooks},   {"axes", axes},
                      {"shape", g.shape},      {"values", g.values}, {"clean_metric", g.clean_metric},
                      {"corrupted_metric", g.corrupted_metric},      {"rows", in.answers.size()},
                      {"task", o.data == "probe" ? std::string("probe") : m.config.name}, {"seed", o.seed}};
  write_file_atomic(staged->staging() + "/patch_" + stem + ".json", j.dump(2) + "\n");
  staged->publish();
  std::printf("\nwrote %s/patch_%s.csv, patch_%s.json\n", out.c_str(), stem.c_str(), stem.c_str());
  return 0;
}

int run_patch(const RoleOpts& o) {
  if (over_training_requested(o)) {
    if (!o.patch.hook.empty()) fail("--hook goes with --checkpoint: --run patches hook_z per head over training");
    if (!o.saes.empty()) fail("--sae goes with --checkpoint: --run patches hook_z per head over training");
    return write_scores_over_training(o.run, o.out, "patch", head_score_options(o));
  }
  const std::string out = o.out.empty() ? default_out_dir("patch") : o.out;
  if (!o.patch.axes.empty() && o.patch.hook.empty()) fail("--axes needs --hook (the hook point to patch over them)");
  RoleModel m = load_role_model(o);
  // a misspelt hook fails here, before the data is made (given axes are checked against the
  // hook's shape by the patching itself, before its first run)
  if (!o.patch.hook.empty() && o.patch.axes.empty()) (void)default_patch_axes(*m.model, o.patch.hook);
  // every example is in one batch, cached twice, with gradients once; --data probe: any model
  const PatchingInputs in = role_patching_inputs(m, o, patching_memory_bytes, "patch", o.data == "probe");
  if (!o.patch.hook.empty()) return run_generic_patch(o, out, m, in);
  PatchingResult r;
  {  // the ETA after the first runs is the time up front (runs from a later layer are cheaper)
    std::unique_ptr<ProgressBar> bar;
    r = activation_patching(*m.model, in, [&](size_t done, size_t runs) {
      if (!bar) bar = std::make_unique<ProgressBar>("patch", static_cast<int64_t>(runs), stderr_is_terminal());
      bar->update(static_cast<int64_t>(done), "patched runs");
    });
    if (bar) bar->finish();
  }
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "patch");
  std::printf("activation patching, %zu rows of %s (one %s token corrupted per row); logit difference clean %.4f, "
              "corrupted %.4f; 1 = the clean run's, 0 = the corrupted run's\n\nper head (hook_z):\n\n",
              in.answers.size(), patching_data_name(o, m).c_str(), o.corrupt.c_str(),
              r.clean_metric, r.corrupted_metric);
  warn_if_corruption_changes_little(r.clean_metric, r.corrupted_metric);
  write_patch_files(staged->staging(), r);
  std::printf("\ncorrelation of attribution with exact patching: heads %.3f, residual positions %.3f\n", r.z_correlation,
              r.resid_correlation);
  staged->publish();
  std::printf("wrote %s/patch_heads.csv, patch_resid.csv, patch_heads.png, patch_resid.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_patch_command(CLI::App& app, CommandRunner& runner) {
  RoleOpts defaults;
  defaults.examples = 64;
  defaults.data = "task";
  auto [sub, o] = add_role_command(app, runner, "patch",
                                   "Activation and attribution patching per head (hook_z) and per residual position; with "
                                   "--hook, activation patching of any hook point over its axes",
                                   run_patch, defaults);
  add_patching_data_options(sub, *o);
  add_run_option(sub, *o);
  add_corrupt_option(sub, *o);
  sub->add_option("--hook", o->patch.hook,
                  "Patch this hook point over --axes instead (e.g. hook_z, hook_resid_pre, attn.hook_q_input; a full name "
                  "such as blocks.1.attn.hook_z takes no layer axis)");
  sub->add_option("--axes", o->patch.axes,
                  "--hook: the axes to patch over, comma-separated: layer, head, pos, src_pos, feature (default: layer,head for "
                  "hooks with heads, else layer,pos; feature for an --sae's hook_sae_acts_post; a feature equal in the clean and corrupted runs, as most of a sparse "
                  "SAE's are, is not run, so the time grows with the features that differ)");
  add_sae_option(sub, *o);  // --hook HOOK.hook_sae_acts_post --axes feature[,pos]: a feature is a node
}

}  // namespace hl
