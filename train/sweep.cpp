#include "train/run_dir.h"
#include "train/sweep.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lib/fileutil.h"
#include "analysis/detectors.h"
#include "models/checkpoint.h"

namespace hl {

using json = nlohmann::json;

namespace {

SweepRun read_run_files(const std::string& dir, int heads, uint64_t seed);

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

SweepRun read_finished_run(const std::string& dir, int heads, uint64_t seed, const std::string& remedy) {
  try {
    return read_run_files(dir, heads, seed);
  } catch (const json::exception& e) {
    fail(dir, ": the finished run stored there is unreadable (", e.what(), "); ", remedy);
  }
}

int SweepRun::heads_with_role(const std::string& r) const {
  int n = 0;
  for (const auto& layer : role)
    for (const std::string& x : layer) n += x == r;
  return n;
}

HeadRoleScores run_head_roles(const std::string& dir, int examples) {
  const std::string path = dir + "/roles.json";
  const uint64_t seed = 1234;  // the probe of headlab detect's default
  if (file_exists(path)) {
    try {
      const json j = json::parse(read_file(path));
      if (j.at("probe_examples").get<int>() == examples && j.at("probe_seed").get<uint64_t>() == seed) {
        HeadRoleScores r;  // in the detectors' own order (JSON objects keep theirs alphabetical)
        for (Detector d : {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction}) {
          r.detectors.push_back(to_string(d));
          r.scores.push_back(j.at("scores").at(to_string(d)).get<HeadGrid>());
        }
        return r;
      }
    } catch (const json::exception&) {
      // unreadable: computed again below and rewritten
    }
  }
  const std::unique_ptr<TransformerLM> model = load_model(dir + "/model.safetensors");
  HeadRoleScores r = detector_role_scores(*model, examples, seed);
  json scores = json::object();
  for (size_t d = 0; d < r.detectors.size(); ++d) scores[r.detectors[d]] = r.scores[d];
  write_file_atomic(path, json({{"probe", "varied_repeat_probe"}, {"probe_examples", examples}, {"probe_seed", seed},
                                {"scores", scores}}).dump(1) + "\n");
  return r;
}

void record_mechanisms(std::vector<SweepRun>& runs, const std::vector<std::string>& dirs, const SweepOptions& o) {
  std::map<int, size_t> first;  // head count -> index of its first seed's run
  for (size_t i = 0; i < runs.size(); ++i) {
    SweepRun& r = runs[i];
    r.roles = run_head_roles(dirs[i], o.role_examples);
    const size_t L = r.roles.scores.empty() ? 0 : r.roles.scores[0].size();
    r.role.assign(L, {});
    for (size_t l = 0; l < L; ++l)
      for (int h = 0; h < r.heads; ++h) r.role[l].push_back(head_role(r.roles, static_cast<int>(l), h, o.role_threshold));
    if (!first.count(r.heads)) {
      first[r.heads] = i;
      continue;
    }
    // this seed's heads matched to the first seed's by attention pattern (the residual bases of
    // two seeds differ, so their weights do not compare); an MPI rank without a shared filesystem
    // holds the roles of runs made elsewhere but not their models: those are not matched
    const size_t f = first[r.heads];
    if (!file_exists(dirs[f] + "/model.safetensors") || !file_exists(dirs[i] + "/model.safetensors")) continue;
    const std::unique_ptr<TransformerLM> a = load_model(dirs[f] + "/model.safetensors"), b = load_model(dirs[i] + "/model.safetensors");
    const HeadMatch m = match_heads(*a, *b, match_probe(*a, *b, std::max(1, o.role_examples / 2)), {MatchBy::Pattern, false});
    const PairRoles pr = pair_roles(m, runs[f].roles, r.roles, o.role_threshold);
    r.matched = true;
    r.match_similarity = m.mean_similarity;
    r.match_pairs = static_cast<int>(m.pairs.size());
    r.match_same_role = pr.same_role;
  }
}

void set_experiment_defaults(TrainArgs& a) {
  a.task = TaskConfig::preset("varcopy");
  a.model.d_model = 32;
  a.model.n_layers = 2;
  a.model.d_ff = 128;
  a.batch = 64;
  a.lr = 3e-3f;
  a.warmup = 100;
  a.schedule = "cosine";
  a.min_lr_ratio = 0.1f;
  a.steps = 600;
  a.eval_every = 50;
}

Spread spread(const std::vector<double>& v, double lo_bound, double hi_bound) {
  Spread s;
  if (v.empty()) return s;
  s.lo = *std::min_element(v.begin(), v.end());
  s.hi = *std::max_element(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  s.ci95 = t_interval95(v, lo_bound, hi_bound);
  return s;
}

std::vector<HeadCountSummary> summarize_sweep(const std::vector<SweepRun>& runs, const std::vector<int>& head_counts) {
  std::map<int, std::vector<const SweepRun*>> by_h;
  for (const SweepRun& r : runs) by_h[r.heads].push_back(&r);
  // a loss is >= 0 and a fraction in [0, 1]: their intervals are clipped to that
  auto over_seeds = [&](int h, double (*f)(const SweepRun&), double lo = -INFINITY, double hi = INFINITY) {
    std::vector<double> v;
    for (const SweepRun* r : by_h[h]) v.push_back(f(*r));
    return spread(v, lo, hi);
  };
  std::vector<HeadCountSummary> out;
  for (int h : head_counts) {
    const std::vector<const SweepRun*>& rs = by_h[h];
    if (rs.empty()) fail("summarize_sweep: no run with ", h, " heads");
    HeadCountSummary s;
    s.heads = h;
    s.d_head = rs[0]->d_head;
    s.params = rs[0]->params;
    s.runs = static_cast<int>(rs.size());
    s.loss = over_seeds(h, [](const SweepRun& r) { return r.loss; }, 0);
    s.perplexity = over_seeds(h, [](const SweepRun& r) { return std::exp(r.loss); });
    s.token_acc = over_seeds(h, [](const SweepRun& r) { return r.token_acc; }, 0, 1);
    s.exact = over_seeds(h, [](const SweepRun& r) { return r.exact; }, 0, 1);
    s.ar_exact = over_seeds(h, [](const SweepRun& r) { return r.ar_exact; }, 0, 1);
    s.train_s = over_seeds(h, [](const SweepRun& r) { return r.train_s; });
    s.peak_bytes = over_seeds(h, [](const SweepRun& r) { return r.peak_bytes; });
    for (const SweepRun* r : rs)
      if (r->first_99 >= 0) s.first_99.push_back(static_cast<double>(r->first_99));
    for (size_t i = 0; i < rs[0]->curve.size(); ++i) {
      std::vector<double> lv, av;
      for (const SweepRun* r : rs)
        if (i < r->curve.size()) lv.push_back(r->curve[i].second.loss), av.push_back(r->curve[i].second.token_acc);
      s.curve_steps.push_back(rs[0]->curve[i].first);
      s.curve_loss.push_back(spread(lv, 1e-6));  // positive: the loss curves are drawn on a log scale
      s.curve_acc.push_back(spread(av, 0, 1));
    }
    s.detectors = rs[0]->roles.detectors;
    std::vector<double> sims;
    for (const std::string& d : s.detectors) {
      int runs_with = 0, heads_with = 0;
      for (const SweepRun* r : rs) {
        const int n = r->heads_with_role(d);
        runs_with += n > 0;
        heads_with += n;
      }
      s.runs_with_role.push_back(runs_with);
      s.heads_with_role.push_back(heads_with);
    }
    for (const SweepRun* r : rs)
      if (r->matched) {
        sims.push_back(r->match_similarity);
        s.match_pairs += r->match_pairs;
        s.match_same_role += r->match_same_role;
      }
    s.match_similarity = spread(sims, 0, 1);
    out.push_back(s);
  }
  const double t1 = out.empty() ? 0 : out[0].train_s.mean, m1 = out.empty() ? 0 : out[0].peak_bytes.mean;
  for (HeadCountSummary& s : out) {
    s.time_rel = t1 > 0 ? s.train_s.mean / t1 : 0;
    s.memory_rel = m1 > 0 ? s.peak_bytes.mean / m1 : 0;
  }
  return out;
}

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
  if (o.role_examples < 1) fail("--role-examples must be positive, got ", o.role_examples);
  if (!(o.role_threshold >= 0 && o.role_threshold <= 1)) fail("--role-threshold must be in [0, 1], got ", o.role_threshold);
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
void train_run(const TrainArgs& a, int index, int total, const SweepObserver& obs) {
  TrainObserver to;
  if (obs.on_step) to.on_step = [&](int64_t step, int64_t, float loss, double) { obs.on_step(index, total, a, step, loss); };
  train_to_end(a, to);
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
    run_head_roles(a.out, o.role_examples);  // where the model is
    return json{{"summary", read_file(a.out + "/summary.json")}, {"metrics", read_file(a.out + "/metrics.jsonl")},
                {"roles", read_file(a.out + "/roles.json")}}.dump();
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
    write_file_atomic(dir + "/roles.json", files.at("roles").get<std::string>());
    write_file_atomic(dir + "/summary.json", files.at("summary").get<std::string>());
  }
  std::vector<SweepRun> runs;
  std::vector<std::string> dirs;
  for (int i = 0; i < total; ++i) {
    runs.push_back(read_finished_run(all[i].out, all[i].model.n_heads, all[i].seed));
    runs.back().reused = std::find(todo.begin(), todo.end(), i) == todo.end();
    dirs.push_back(all[i].out);
    if (obs.on_run) obs.on_run(i + 1, total, runs.back());
  }
  record_mechanisms(runs, dirs, o);
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
  std::vector<std::string> dirs;
  const int total = static_cast<int>(o.head_counts.size()) * o.seeds;
  int index = 0;
  for (int h : o.head_counts)
    for (int s = 0; s < o.seeds; ++s) {
      ++index;
      const TrainArgs a = sweep_run_args(base, o, out, h, s);
      reuse_only_if_same_settings(a.out, a, o.force, "--force");
      const bool finished = run_finished(a.out);
      if (!finished) train_run(a, index, total, obs);
      runs.push_back(read_finished_run(a.out, h, a.seed));
      runs.back().reused = finished;
      dirs.push_back(a.out);
      if (obs.on_run) obs.on_run(index, total, runs.back());
    }
  record_mechanisms(runs, dirs, o);
  return runs;
}

}  // namespace hl
