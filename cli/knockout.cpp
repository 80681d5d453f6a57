// headlab knockout: one ablation by hook name (zero, mean or resample; one head or all; some
// positions or all) on a checkpoint's held-out data: flags -> knockout -> a table of the clean
// and the ablated loss and accuracy with 95% bootstrap intervals, knockout.csv (per example) and
// knockout.json (the summary) in --out.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "analysis/ablation.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/run_dir.h"

namespace hl {

namespace {

using json = nlohmann::json;

std::string with_interval(double v, const Interval& ci, bool as_percent) {
  auto f = [&](double x) { return as_percent ? percent(x) : fixed(x, 4); };
  return f(v) + (ci.defined() ? " [" + f(ci.lo) + ", " + f(ci.hi) + "]" : "");
}

json interval_json(const Interval& ci) { return ci.defined() ? json{ci.lo, ci.hi} : json(nullptr); }

int run_knockout(const RoleOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("knockout") : o.out;
  RoleModel m = load_role_model(o);
  AblationOptions opt;
  opt.site = {o.knockout.hook, o.knockout.head, parse_positions_flag(o.knockout.positions, "--positions")};
  opt.kind = parse_ablation_kind(o.knockout.kind);
  opt.per_position = o.knockout.per_position;
  opt.seed = o.seed;
  if (o.knockout.per_position && opt.kind != AblationKind::Mean) fail("--per-position applies to --kind mean, not --kind ", o.knockout.kind);
  check_ablation_site(m.model->cfg, opt.site);  // before the data is made: a misspelt hook fails first
  const Task& task = role_task(m, o.checkpoint);
  check_fits_in_memory(knockout_memory_bytes(m.model->cfg, o.knockout.hook, opt.kind, o.examples, task.seq_len(), 64),
                       "--examples " + std::to_string(o.examples) + " of " + std::to_string(task.seq_len()) + " tokens");
  const std::vector<Batch> data = task.held_out(o.examples, o.seed, 64);
  const KnockoutResult r = knockout(*m.model, data, opt);
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "knockout");
  const std::string where = o.knockout.hook + (o.knockout.head >= 0 ? " head " + std::to_string(o.knockout.head) : "") +
                            (o.knockout.positions.empty() ? "" : " at positions " + o.knockout.positions);
  std::printf("%s ablation of %s on %zu held-out examples of task %s (95%% bootstrap intervals over the examples)\n\n",
              o.knockout.kind.c_str(), where.c_str(), r.counted.size(), m.config.name.c_str());
  print_table({{"", "loss", "token accuracy"},
               {"clean", with_interval(r.clean_mean_loss, r.clean_loss_ci95, false), with_interval(r.clean_token_acc, r.clean_acc_ci95, true)},
               {"ablated", with_interval(r.ablated_mean_loss, r.ablated_loss_ci95, false),
                with_interval(r.ablated_token_acc, r.ablated_acc_ci95, true)},
               {"ablated - clean", with_interval(r.ablated_mean_loss - r.clean_mean_loss, r.d_loss_ci95, false),
                with_interval(r.ablated_token_acc - r.clean_token_acc, r.d_acc_ci95, true)}});
  std::string csv = "example,counted_targets,clean_loss,ablated_loss,clean_acc,ablated_acc\n";
  char line[256];
  for (size_t i = 0; i < r.counted.size(); ++i) {
    std::snprintf(line, sizeof line, "%zu,%lld,%.9g,%.9g,%.9g,%.9g\n", i, static_cast<long long>(r.counted[i]), r.clean_loss[i],
                  r.ablated_loss[i], r.clean_acc[i], r.ablated_acc[i]);
    csv += line;
  }
  write_file_atomic(staged->staging() + "/knockout.csv", csv);
  json j = {{"hook", o.knockout.hook},
            {"head", o.knockout.head >= 0 ? json(o.knockout.head) : json(nullptr)},
            {"positions", opt.site.positions.empty() ? json(nullptr) : json(opt.site.positions)},
            {"kind", o.knockout.kind},
            {"per_position", o.knockout.per_position},
            {"task", m.config.name},
            {"examples", r.counted.size()},
            {"seed", o.seed},
            {"clean", {{"loss", r.clean_mean_loss}, {"token_acc", r.clean_token_acc}}},
            {"ablated", {{"loss", r.ablated_mean_loss}, {"token_acc", r.ablated_token_acc}}},
            {"ci95",
             {{"clean_loss", interval_json(r.clean_loss_ci95)},
              {"ablated_loss", interval_json(r.ablated_loss_ci95)},
              {"d_loss", interval_json(r.d_loss_ci95)},
              {"clean_token_acc", interval_json(r.clean_acc_ci95)},
              {"ablated_token_acc", interval_json(r.ablated_acc_ci95)},
              {"d_token_acc", interval_json(r.d_acc_ci95)}}}};
  if (!r.permutation.empty()) j["permutation"] = r.permutation;
  write_file_atomic(staged->staging() + "/knockout.json", j.dump(2) + "\n");
  staged->publish();
  std::printf("\nwrote %s/knockout.csv, knockout.json\n", out.c_str());
  return 0;
}

}  // namespace

void add_knockout_command(CLI::App& app, CommandRunner& runner) {
  RoleOpts defaults;
  defaults.examples = 256;
  auto [sub, o] = add_role_command(app, runner, "knockout",
                                   "Ablate one hook point by name (zero, mean or resample; one head or all; some positions or "
                                   "all): clean vs ablated loss and accuracy",
                                   run_knockout, defaults);
  sub->add_option("--hook", o->knockout.hook, "Hook point to ablate, e.g. blocks.1.attn.hook_z (headlab hooks lists them)")->required();
  sub->add_option("--head", o->knockout.head, "Only this head (hooks with a head axis); -1 = every head")
      ->capture_default_str()->check(in_range(-1, 4096));
  sub->add_option("--kind", o->knockout.kind, "zero, mean (over the held-out examples) or resample (another example's activation)")
      ->capture_default_str()->check(CLI::IsMember({"zero", "mean", "resample"}));
  sub->add_option("--positions", o->knockout.positions, "Only these positions, e.g. 3,4,5 (default: every position)");
  sub->add_flag("--per-position", o->knockout.per_position, "--kind mean: the mean at each position (default: over every position)");
}

}  // namespace hl
