#include "cli/roles.h"

#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/checkpoint_task.h"

namespace hl {

std::pair<CLI::App*, std::shared_ptr<RoleOpts>> add_role_command(CLI::App& app, CommandRunner& runner, const std::string& name,
                                                                 const std::string& help, RoleRun run,
                                                                 const RoleOpts& defaults) {
  CLI::App* sub = app.add_subcommand(name, help);
  auto o = std::make_shared<RoleOpts>(defaults);
  RoleOpts& opts = *o;
  const std::string& command = name;
  sub->add_option("--checkpoint", opts.checkpoint, "Model checkpoint (safetensors)")->required();
  sub->add_option("--out", opts.out, "Output directory (default: runs/" + command + "-<date>-<time>)");
  sub->add_option("--task", opts.task, "Task of the data when the checkpoint does not name one")
      ->capture_default_str()->check(CLI::IsMember(task_names()));
  sub->add_option("--examples", opts.examples, "Sequences to average over")->capture_default_str()->check(in_range(1, 1e6));
  sub->add_option("--seed", opts.seed, "Seed of the sequences")->capture_default_str()->check(in_range(0, 1.8e19));
  sub->add_option("--threads", opts.threads, "Threads")->capture_default_str()->check(in_range(1, 1024));
  sub->callback([&runner, o, run] { runner = [o, run] { return run(*o); }; });
  return {sub, o};
}

RoleModel load_role_model(const RoleOpts& o) {
  set_num_threads(o.threads);
  const SafetensorsFile f = read_safetensors(o.checkpoint);
  RoleModel r{load_model(f), nullptr, checkpoint_task(f, TaskConfig::preset(o.task))};
  return r;
}

const Task& role_task(RoleModel& m, const std::string& checkpoint) {
  if (!m.task) m.task = task_for_model(m.model->cfg, m.config, checkpoint);
  return *m.task;
}

Heatmap head_heatmap(const std::string& title, const HeadGrid& g, const std::string& row_prefix, const std::string& col_prefix) {
  Heatmap m;
  m.title = title;
  m.rows = static_cast<int>(g.size());
  m.cols = m.rows ? static_cast<int>(g[0].size()) : 0;
  for (auto& row : g)
    for (double v : row) m.values.push_back(static_cast<float>(v));
  for (int c = 0; c < m.cols; ++c) m.xlabels.push_back(col_prefix + std::to_string(c));
  for (int r = 0; r < m.rows; ++r) m.ylabels.push_back(row_prefix + std::to_string(r));
  return m;
}

// One table and CSV with a row per (layer, head) and a column per grid.
void write_head_table(const std::string& path, const std::vector<std::string>& names, const std::vector<HeadGrid>& grids) {
  std::string csv = "layer,head";
  std::vector<std::string> header = {"layer", "head"};
  for (auto& n : names) csv += "," + n, header.push_back(n);
  csv += "\n";
  std::vector<std::vector<std::string>> table = {header};
  for (size_t l = 0; l < grids[0].size(); ++l)
    for (size_t h = 0; h < grids[0][l].size(); ++h) {
      std::vector<std::string> row = {std::to_string(l), std::to_string(h)};
      csv += std::to_string(l) + "," + std::to_string(h);
      for (const HeadGrid& g : grids) csv += "," + fixed(g[l][h], 6), row.push_back(fixed(g[l][h], 3));
      csv += "\n";
      table.push_back(row);
    }
  write_file_atomic(path, csv);
  print_table(table);
}

}  // namespace hl
