#include "train/run_dir.h"
#include "train/sweep.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lib/fileutil.h"

namespace hl {

using json = nlohmann::json;

namespace {

SweepRun read_run_files(const std::string& dir, int heads, uint64_t seed);
// Reads a finished run back from its summary.json and metrics.jsonl.
SweepRun read_run(const std::string& dir, int heads, uint64_t seed) {
  try {
    return read_run_files(dir, heads, seed);
  } catch (const json::exception& e) {
    fail(dir, ": the finished run stored there is unreadable (", e.what(), "); rerun with --force to recompute it");
  }
}

SweepRun read_run_files(const std::string& dir, int heads, uint64_t seed) {
  SweepRun r;
  r.heads = heads;
  r.seed = seed;
  const json s = json::parse(read_file(dir + "/summary.json"));
  r.d_head = s.at("config").at("model").at("d_head");
  r.params = s.at("parameters");
  const json& f = s.at("final");
  r.loss = f.at("loss");
  r.token_acc = f.at("token_acc");
  r.exact = f.at("exact_match");
  r.ar_exact = f.at("ar_exact_match");
  r.train_s = s.at("train_s");
  r.peak_bytes = s.at("peak_tensor_bytes");
  r.first_99 = s.at("first_step_99").is_null() ? -1 : s.at("first_step_99").get<int64_t>();
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    EvalResult e;
    e.loss = j.at("loss");
    e.token_acc = j.at("token_acc");
    e.exact_match = j.at("exact_match");
    r.curve.push_back({j.at("step").get<int64_t>(), e});
  }
  return r;
}

}  // namespace

TrainArgs sweep_run_args(const TrainArgs& base, const SweepOptions& o, const std::string& out, int h, int s) {
  TrainArgs a = base;
  a.model.n_heads = h;
  a.model.n_kv_heads = 0;
  if (o.policy == "fixed-d-model") {
    a.model.d_head = 0;
  } else {
    a.model.d_head = o.fixed_d_head;
    a.model.d_model = h * o.fixed_d_head;
  }
  a.seed = base.seed + static_cast<uint64_t>(s);
  a.checkpoint_every = std::max<int64_t>(1, a.steps / 4);
  a.out = out + "/runs/H" + std::to_string(h) + "-seed" + std::to_string(a.seed);
  return a;
}

void check_sweep(const TrainArgs& base, const SweepOptions& o, const std::string& out) {
  if (o.seeds < 1) fail("--seeds must be positive, got ", o.seeds);
  if (o.policy != "fixed-d-model" && o.policy != "fixed-d-head")
    fail("--policy must be fixed-d-model or fixed-d-head, got '", o.policy, "'");
  if (o.head_counts.empty()) fail("--head-counts: give at least one head count");
  for (size_t i = 0; i < o.head_counts.size(); ++i) {
    const int h = o.head_counts[i];
    if (h < 1) fail("--head-counts: head counts must be positive, got ", h);
    if (std::find(o.head_counts.begin(), o.head_counts.begin() + i, h) != o.head_counts.begin() + i)
      fail("--head-counts: ", h, " is given twice");
    if (o.policy == "fixed-d-model" && base.model.d_model % h)
      fail("--head-counts: ", h, " heads do not divide d_model ", base.model.d_model,
           " (use --policy fixed-d-head to grow d_model instead)");
  }
  for (int h : o.head_counts)
    for (int s = 0; s < o.seeds; ++s) check_training_resources(sweep_run_args(base, o, out, h, s));
}

namespace {

// Trains one run of a sweep to its end, continuing from its checkpoint if it has one.
void train_run(TrainArgs a, int index, int total, const SweepObserver& obs) {
  a.resume = file_exists(a.out + "/checkpoint.safetensors");
  Trainer t(a);
  TrainObserver to;
  if (obs.on_step) to.on_step = [&](int64_t step, int64_t, float loss, double) { obs.on_step(index, total, a, step, loss); };
  try {
    write_summary(a.out, t.args(), t.run(to));
  } catch (const Interrupted&) {
    write_summary(a.out, t.args(), t.partial_result(), /*finished=*/false);
    throw;
  }
}

std::vector<SweepRun> sweep_across_ranks(const TrainArgs& base, const SweepOptions& o, const std::string& out,
                                         const SweepObserver& obs, ProcessGroup& group) {
  std::vector<TrainArgs> all;  // every run, in the single-process order
  for (int h : o.head_counts)
    for (int s = 0; s < o.seeds; ++s) all.push_back(sweep_run_args(base, o, out, h, s));
  const int total = static_cast<int>(all.size());
  // Rank 0 checks the sweep, holds its directory and decides which runs are left; it tells the
  // others, and every rank then takes runs from that list.
  std::unique_ptr<DirLock> lock;
  std::string todo_text;
  if (group.rank() == 0) {
    check_sweep(base, o, out);
    claim_output_dir(out, "ablate");
    make_dirs(out + "/runs");
    lock = std::make_unique<DirLock>(out);
    json todo = json::array();
    for (int i = 0; i < total; ++i) {
      reuse_only_if_same_settings(all[i].out, all[i], o.force, "--force");
      if (!run_finished(all[i].out)) todo.push_back(i);
    }
    todo_text = todo.dump();
  }
  group.broadcast(todo_text);
  const std::vector<int> todo = json::parse(todo_text).get<std::vector<int>>();
  const std::vector<std::string> made = group.share_work(static_cast<int>(todo.size()), [&](int item) {
    const int i = todo[static_cast<size_t>(item)];
    const TrainArgs& a = all[i];
    // another rank's copy of the run (its own disk, without a shared filesystem) must be of the
    // same settings before it is continued; rank 0 checked its own above
    if (group.rank() != 0) reuse_only_if_same_settings(a.out, a, o.force, "--force");
    train_run(a, i + 1, total, group.rank() == 0 ? obs : SweepObserver{});
    return json{{"summary", read_file(a.out + "/summary.json")}, {"metrics", read_file(a.out + "/metrics.jsonl")}}.dump();
  });
  if (group.rank() != 0) return {};
  for (size_t k = 0; k < todo.size(); ++k) {
    // a run made on another machine (no shared filesystem): its files into rank 0's `out`,
    // summary last (it marks the run finished)
    const std::string& dir = all[todo[k]].out;
    if (run_finished(dir)) continue;
    const json files = json::parse(made[k]);
    make_dirs(dir);
    write_file_atomic(dir + "/metrics.jsonl", files.at("metrics").get<std::string>());
    write_file_atomic(dir + "/summary.json", files.at("summary").get<std::string>());
  }
  std::vector<SweepRun> runs;
  for (int i = 0; i < total; ++i) {
    runs.push_back(read_run(all[i].out, all[i].model.n_heads, all[i].seed));
    runs.back().reused = std::find(todo.begin(), todo.end(), i) == todo.end();
    if (obs.on_run) obs.on_run(i + 1, total, runs.back());
  }
  return runs;
}

}  // namespace

std::vector<SweepRun> run_head_count_sweep(const TrainArgs& base, const SweepOptions& o, const std::string& out,
                                           const SweepObserver& obs, ProcessGroup* group) {
  if (group && group->size() > 1) return sweep_across_ranks(base, o, out, obs, *group);
  check_sweep(base, o, out);  // before any directory is made
  claim_output_dir(out, "ablate");
    make_dirs(out + "/runs");
  const DirLock lock(out);
  std::vector<SweepRun> runs;
  const int total = static_cast<int>(o.head_counts.size()) * o.seeds;
  int index = 0;
  for (int h : o.head_counts)
    for (int s = 0; s < o.seeds; ++s) {
      ++index;
      const TrainArgs a = sweep_run_args(base, o, out, h, s);
      reuse_only_if_same_settings(a.out, a, o.force, "--force");
      const bool finished = run_finished(a.out);
      if (!finished) train_run(a, index, total, obs);
      runs.push_back(read_run(a.out, h, a.seed));
      runs.back().reused = finished;
      if (obs.on_run) obs.on_run(index, total, runs.back());
    }
  return runs;
}

}  // namespace hl
