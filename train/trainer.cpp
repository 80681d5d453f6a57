#include "train/run_dir.h"
#include "train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "lib/autograd.h"
#include "lib/bf16.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "models/checkpoint.h"
#include "train/settings.h"
#include "train/snapshots.h"

namespace hl {

using json = nlohmann::json;

long peak_rss_kb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

namespace {

json rng_json(const Rng& r) {
  json a = json::array();
  for (uint64_t w : r.state()) a.push_back(w);
  return a;
}
void rng_from_json(Rng& r, const json& j, const std::string& source) {
  if (!j.is_array() || j.size() != 4) fail(source, ": bad RNG state in train_state");
  std::array<uint64_t, 4> s;
  for (int i = 0; i < 4; ++i) s[i] = j[i].get<uint64_t>();
  r.set_state(s);
}

double round6(double v) { return std::round(v * 1e6) / 1e6; }

}  // namespace

std::string eval_json(int64_t step, const EvalResult& e, float lr, double tokens_per_s, double wall_s) {
  json j = {{"step", step}, {"loss", e.loss}, {"token_acc", e.token_acc}, {"exact_match", e.exact_match}};
  if (e.ar_exact_match >= 0) j["ar_exact_match"] = e.ar_exact_match;
  j["lr"] = lr;
  j["tokens_per_s"] = std::round(tokens_per_s);
  j["wall_s"] = round6(wall_s);
  return j.dump();
}

// The run settings that are plain members of TrainArgs, each spelled once here: to_json and
// from_json both come from this list (a missing key reads as the default, so files written
// before a setting existed still load). The model and task have JSON of their own (docs/formats.md).
#define HEADLAB_TRAIN_SETTINGS(X)                                                                   \
  X(batch) X(steps) X(lr) X(schedule) X(warmup) X(min_lr_ratio) X(optimizer) X(weight_decay)        \
  X(decay_all) X(beta1) X(beta2) X(momentum) X(clip) X(seed) X(threads) X(eval_every)               \
  X(checkpoint_every) X(eval_size) X(eval_seed) X(eval_autoregressive) X(skip_nonfinite)            \
  X(log_grads_every) X(dump_grads_at) X(init) X(snapshot_every) X(snapshot_at) X(fork_from) X(gate_heads)    \
  X(freeze_heads) X(reinit_heads) X(data_files) X(precision)

std::string TrainArgs::to_json() const {
  json j = {{"model", json::parse(model.to_json())}, {"dropout", model.dropout}, {"attn_dropout", model.attn_dropout},
            {"task", json::parse(task.to_json())}};
#define HEADLAB_TO_JSON(field) j[#field] = field;
  HEADLAB_TRAIN_SETTINGS(HEADLAB_TO_JSON)
#undef HEADLAB_TO_JSON
  return j.dump();
}

TrainArgs TrainArgs::from_json(const std::string& text, const std::string& source) {
  try {
    const json j = json::parse(text);
    TrainArgs a;
    a.model = ModelConfig::from_json(j.at("model").dump(), source);
    a.model.dropout = j.value("dropout", a.model.dropout);
    a.model.attn_dropout = j.value("attn_dropout", a.model.attn_dropout);
    a.task = TaskConfig::from_json(j.at("task").dump(), source);
#define HEADLAB_FROM_JSON(field) \
  if (j.contains(#field)) j.at(#field).get_to(a.field);
    HEADLAB_TRAIN_SETTINGS(HEADLAB_FROM_JSON)
#undef HEADLAB_FROM_JSON
    return a;
  } catch (const json::exception& e) {
    fail(source, ": training arguments are unreadable (", e.what(), ")");
  }
}

void TrainArgs::validate() const {
  // The ranges and choices of the flag table, read where to_json() keeps each setting. NaN fails
  // every comparison, so each range is written as "inside" and negated.
  const json j = json::parse(to_json());
  for (const TrainSetting& s : train_settings()) {
    const json::json_pointer p(s.json_pointer);
    if (!j.contains(p)) continue;
    const json& v = j.at(p);
    if (!std::isnan(s.lo)) {
      // JSON has no NaN or infinity: a non-finite float reads back as null
      if (!v.is_number()) fail(s.flag, ": the value is not a finite number");
      const std::string problem = range_problem(v.get<double>(), v.dump(), s.lo, s.hi);
      if (!problem.empty()) fail(s.flag, ": ", problem);  // worded as the command line's flags
    }
    if (!s.choices.empty() && v.is_string() &&
        std::find(s.choices.begin(), s.choices.end(), v.get<std::string>()) == s.choices.end()) {
      std::string list;
      for (const std::string& c : s.choices) list += (list.empty() ? "" : ", ") + c;
      fail(s.flag, " must be one of ", list, ", got '", v.get<std::string>(), "'");
    }
  }
  if (log_grads_every < 0) fail("--log-grads must be at least 0, got ", log_grads_every);
  for (int64_t s : dump_grads_at)
    if (s < 1) fail("--dump-grads-at must be at least 1, got ", s);
  for (int64_t s : snapshot_at)
    if (s < 0 || s > steps)
      fail("--snapshot-at ", s, " is outside the run's steps 0..", steps, " (0 = the initial weights)");
  parse_schedule(schedule);
  if (run_precision(*this) == Precision::Bf16) require_bf16_cpu();
  task.validate();
  ModelConfig m = model;
  m.vocab_size = std::max<int64_t>(m.vocab_size, 1);
  m.validate();
  parse_interventions(gate_heads, freeze_heads, reinit_heads, m);
  if (fork_from.empty() && !(gate_heads.empty() && freeze_heads.empty() && reinit_heads.empty()))
    fail("--gate, --freeze and --reinit apply to a fork of a run: give --fork RUN --at STEP (or --fork-from FILE)");
}

namespace {
// The config the trainer builds: the task sets the vocabulary and the sequence length.
ModelConfig model_for(const TrainArgs& a, const Task& task) {
  ModelConfig m = a.model;
  m.vocab_size = task.vocab_size();
  m.max_seq_len = std::max<int64_t>(m.max_seq_len, task.seq_len());
  return m;
}
}  // namespace

void check_training_resources(const TrainArgs& a, const Task* given_task) {
  a.validate();
  std::unique_ptr<Task> own;
  if (!given_task) own = make_task(a.task);  // reads a data file, if the task has one
  const Task* task = given_task ? given_task : own.get();
  const ModelConfig m = model_for(a, *task);
  const int64_t T = task->seq_len();
  // the parts a user controls: the model's size, the training batch, the held-out set (its
  // token ids, and the forward of one evaluation batch of up to 128 sequences)
  const int eval_batch = std::min(a.eval_size, 128);
  const double params = 16.0 * static_cast<double>(parameter_count(m));
  const double step = estimate_step_bytes(m, a.batch, T, true) - params;
  const double eval_data = 20.0 * static_cast<double>(a.eval_size) * static_cast<double>(T);  // ids, targets, padding
  const double eval_forward = estimate_step_bytes(m, eval_batch, T, false);
  const double need = params + step + eval_data + eval_forward, have = available_memory_bytes();
  if (need <= have) return;
  const std::string seq = std::to_string(T) + "-token sequences (--length " + std::to_string(a.task.max_len) + ")";
  std::string what;
  const double most = std::max({params, step, eval_data, eval_forward});
  if (most == params)
    what = "a model of d_model " + std::to_string(m.d_model) + ", " + std::to_string(m.n_layers) + " layers, d_ff " +
           std::to_string(m.d_ff) + " and a vocabulary of " + std::to_string(m.vocab_size) + " (--d-model, --layers, --d-ff)";
  else if (most == step)
    what = "--batch " + std::to_string(a.batch) + " of " + seq;
  else if (most == eval_data)
    what = "--eval-size " + std::to_string(a.eval_size) + " held-out sequences of " + std::to_string(T) + " tokens";
  else
    what = "held-out batches of " + std::to_string(eval_batch) + " " + seq;
  fail(what, ": training needs about ", format_bytes(need), " of memory, more than the ", format_bytes(have),
       " available");
}


std::string stored_run_args(const std::string& dir) {
  try {
    if (file_exists(dir + "/summary.json")) return json::parse(read_file(dir + "/summary.json")).at("config").dump();
    if (file_exists(dir + "/checkpoint.safetensors")) {
      const SafetensorsFile f = read_safetensors(dir + "/checkpoint.safetensors");
      return json::parse(f.meta("train_state")).at("args").dump();
    }
  } catch (const json::exception& e) {
    fail(dir, ": the run stored there is unreadable (", e.what(), "); remove it or choose another --out");
  }
  return "null";
}

TrainArgs resume_args(const std::string& out, const TrainArgs& given,
                      const std::function<bool(const std::string& flag)>& given_flag) {
  if (out.empty()) fail("resume: give the run's directory (--out DIR; in Python out=DIR)");
  const std::string path = out + "/checkpoint.safetensors";
  if (!file_exists(path)) fail("resume: no run to resume in ", out, " (", path, " is missing)");
  const SafetensorsFile f = read_safetensors(path);
  json stored;
  try {
    stored = json::parse(f.meta("train_state")).at("args");
  } catch (const json::exception& e) {
    fail(path, ": its train_state metadata is unreadable (", e.what(), ")");
  }
  TrainArgs r = resume_with_flags(TrainArgs::from_json(stored.dump(), path), given, given_flag, path);
  r.out = out;
  r.resume = true;
  return r;
}

TrainArgs init_args(const TrainArgs& given, const std::function<bool(const std::string& flag)>& given_flag) {
  if (given.init.empty()) return given;
  const ModelConfig stored = checkpoint_config(read_checkpoint(given.init));
  TrainArgs r = given;
  r.model = stored;
  r.model.dropout = given.model.dropout;  // training settings, not the architecture
  r.model.attn_dropout = given.model.attn_dropout;
  const json now = json::parse(given.to_json()), then = json::parse(r.to_json());
  for (const TrainSetting& s : train_settings()) {
    if (s.json_pointer.rfind("/model/", 0) != 0 || !given_flag(s.flag)) continue;
    const json::json_pointer p(s.json_pointer);
    json a = now.value(p, json()), b = then.value(p, json());
    // 0 means "as many as the heads" / "d_model / heads" (of the checkpoint's model): compare what they amount to
    ModelConfig with_flag = r.model;
    with_flag.n_kv_heads = given.model.n_kv_heads, with_flag.d_head = given.model.d_head;
    if (s.json_pointer == "/model/n_kv_heads") a = with_flag.kv_heads(), b = r.model.kv_heads();
    if (s.json_pointer == "/model/d_head") a = with_flag.head_dim(), b = r.model.head_dim();
    if (a != b)
      fail(s.flag, " ", now.value(p, json()).dump(), " contradicts --init ", given.init, ", whose model has ",
           s.json_pointer.substr(7), " ", then.value(p, json()).dump(), ": leave the flag out to take the checkpoint's");
  }
  return r;
}

TrainArgs fork_args(const std::string& file, const TrainArgs& given,
                    const std::function<bool(const std::string& flag)>& given_flag) {
  if (!file_exists(file)) fail("fork: no training state at ", file);
  const SafetensorsFile f = read_safetensors(file);
  json stored;
  try {
    stored = json::parse(f.meta("train_state")).at("args");
  } catch (const std::exception& e) {
    fail(file, ": holds no training state to fork from (", e.what(), "); give a snapshot or checkpoint.safetensors of a run");
  }
  TrainArgs r = resume_with_flags(TrainArgs::from_json(stored.dump(), file), given, given_flag, file);
  r.out = given.out;
  r.resume = false;
  r.fork_from = file;
  r.gate_heads = given.gate_heads;
  r.freeze_heads = given.freeze_heads;
  r.reinit_heads = given.reinit_heads;
  r.log_grads_every = given.log_grads_every;
  r.dump_grads_at = given.dump_grads_at;
  return r;
}

std::string run_dir_of_state_file(const std::string& file) {
  std::filesystem::path dir = std::filesystem::path(file).parent_path();
  if (dir.filename() == "snapshots") dir = dir.parent_path();
  return dir.empty() ? "." : dir.string();
}

std::string first_setting_difference(const std::string& stored_json, const std::string& now_json) {
  std::set<std::string> ignored;  // settings that leave results alone
  for (const TrainSetting& s : train_settings())
    if (s.on_resume == OnResume::kIncidental) ignored.insert(s.json_pointer);
  ignored.insert("/snapshot_at");  // like --snapshot-every: which steps are kept leaves results alone
  return first_json_difference(json::parse(stored_json), json::parse(now_json), ignored);
}

std::string first_identity_difference(const std::string& stored_json, const std::string& now_json, const std::string& stored_side,
                                      const std::string& now_side) {
  std::set<std::string> ignored = {"/snapshot_at", "/data_files"};
  for (const TrainSetting& s : train_settings())
    if (s.on_resume != OnResume::kMustMatch) ignored.insert(s.json_pointer);
  for (const char* k : {"/init", "/log_grads_every", "/dump_grads_at", "/snapshot_every"}) ignored.insert(k);
  return first_json_difference(json::parse(stored_json), json::parse(now_json), ignored, stored_side, now_side);
}

namespace {
// The fingerprint of each data file of a task (none for a task without files, or for arrays
// given from Python, whose names are in parentheses).
std::map<std::string, std::string> data_file_fingerprints(const TaskConfig& t) {
  std::map<std::string, std::string> r;
  for (const std::string& path : {t.data, t.eval_data})
    if (!path.empty() && path.front() != '(') r[path] = file_fingerprint(path);
  return r;
}
}  // namespace

void reuse_only_if_same_settings(const std::string& dir, const TrainArgs& args, bool force, const std::string& force_flag) {
  const std::string stored = stored_run_args(dir);
  if (stored == "null") return;
  TrainArgs now = args;  // as the trainer stores them: vocabulary and length from the task
  now.model = model_for(args, *make_task(args.task));
  // read back and written again: a setting the stored run predates compares as its default
  const TrainArgs then_args = TrainArgs::from_json(stored, dir);
  if (!then_args.data_files.empty()) now.data_files = data_file_fingerprints(args.task);  // a run recorded its data
  const std::string then = then_args.to_json();
  reuse_only_if_same(dir, "a run", first_setting_difference(then, now.to_json()), force, force_flag, [&] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (ec) fail(dir, ": cannot remove the old run: ", ec.message());
  });
}

Trainer::Trainer(TrainArgs args) : Trainer(std::move(args), nullptr) {}

Trainer::Trainer(TrainArgs args, std::unique_ptr<Task> task, ProcessGroup* group)
    : args_(std::move(args)), task_(std::move(task)), data_rng_(0) {
  args_.task.make_paths_absolute();
  if (group && group->size() > 1) {
    if (args_.batch < group->size())
      fail("--batch ", args_.batch, " is smaller than the ", group->size(), " ranks: each rank needs at least one row");
    group_ = group;
  }
  check_training_resources(args_, task_.get());  // before anything is allocated or created
  // A resume or a fork continues bit for bit only on the data the run began with: a data file
  // changed since is refused, naming it. A new run records its files (runs that predate the
  // record begin it here).
  const std::map<std::string, std::string> data_now = data_file_fingerprints(args_.task);
  if (args_.resume || forking())
    for (const auto& [path, then] : args_.data_files) {
      const auto it = data_now.find(path);
      const std::string now = it != data_now.end() ? it->second : "not a data file of the task now";
      if (now != then)
        fail(path, ": the run's data file has changed since the run began (", then, " then, ", now, " now); ",
             args_.resume ? "resuming" : "forking", " on other data would not continue the run: restore the file, or start a new run");
    }
  args_.data_files = data_now;
  args_.threads = std::min(args_.threads, usable_cores());  // what runs is what the summary records
  if (!task_) task_ = make_task(args_.task);
  args_.model = model_for(args_, *task_);
  if (forking()) {
    if (!file_exists(args_.fork_from)) fail("fork: no training state at ", args_.fork_from);
    namespace fs = std::filesystem;
    if (!args_.out.empty() && fs::weakly_canonical(run_dir_of_state_file(args_.fork_from)) == fs::weakly_canonical(args_.out))
      fail("--out ", args_.out, ": the fork needs a directory of its own, not the run it forks");
  }
  // A directory this constructor makes is removed again when a later check fails (--init's
  // vocabulary, the snapshots' disk space): a refused run leaves no directory, lock or mark.
  struct RemoveIfRefused {
    std::string dir;
    ~RemoveIfRefused() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_if_refused;
  if (!args_.out.empty()) {
    if (writes_files()) {
      std::error_code ec;
      if (!std::filesystem::exists(args_.out, ec)) remove_if_refused.dir = args_.out;
      claim_output_dir(args_.out, "train");
      lock_ = std::make_unique<DirLock>(args_.out);
      remove_stale_temp_files(args_.out);
    }
    if (!args_.resume && file_exists(checkpoint_path()))
      fail(args_.out, " already holds a run (checkpoint.safetensors): pass --resume to continue it, "
                      "or choose another --out");
  }
  model_ = std::make_unique<TransformerLM>(args_.model, args_.seed);
  std::vector<NamedParam> params;
  for (auto& [name, t] : model_->named_parameters()) {
    const bool no_decay = t.ndim() < 2 || name.find("emb") != std::string::npos;  // biases, norms, embeddings
    params.push_back({name, t, args_.decay_all || !no_decay});
  }
  if (args_.optimizer == "sgd")
    opt_ = std::make_unique<SGD>(params, args_.lr, args_.momentum, args_.weight_decay);
  else
    opt_ = std::make_unique<Adam>(params, args_.lr, args_.beta1, args_.beta2, 1e-8f, args_.weight_decay,
                                  args_.optimizer == "adamw");
  sched_ = LrSchedule{parse_schedule(args_.schedule), args_.lr, args_.warmup, args_.steps, args_.min_lr_ratio};
  data_rng_ = training_data_rng(args_.seed);
  plan_snapshots();
  held_out_ = task_->held_out(args_.eval_size, args_.eval_seed, std::min(args_.eval_size, 128));
  // Data given as arrays (from Python) has no file to read back: the held-out rows go into the
  // run directory, where `headlab view` finds them beside the checkpoint.
  if (writes_files() && !args_.task.data.empty() && args_.task.data.front() == '(')
    save_token_rows(held_out_rows_path(args_.out), held_out_);
  interventions_ = HeadInterventions(*model_, parse_interventions(args_.gate_heads, args_.freeze_heads, args_.reinit_heads, args_.model));
  if (!args_.init.empty() && !args_.resume && !forking()) {  // weights made elsewhere (e.g. PyTorch), same config
    // (a fork of a run begun with --init starts from its snapshot instead)
    const SafetensorsFile f = read_checkpoint(args_.init);
    const ModelConfig c = checkpoint_config(f);
    if (c.vocab_size != args_.model.vocab_size)
      fail("--init ", args_.init, ": its vocabulary of ", c.vocab_size, " tokens does not fit task ", args_.task.name, " (",
           args_.model.vocab_size, " tokens)");
    if (c.positions == Positions::Learned && c.max_seq_len < task_->seq_len())
      fail("--init ", args_.init, ": its position table has ", c.max_seq_len, " positions but task ", args_.task.name,
           "'s sequences have ", task_->seq_len(), " tokens");
    check_checkpoint_tensors(args_.model, f);
    load_parameters(*model_, f);
  }
  remove_if_refused.dir.clear();  // every check passed: the directory stays
}

void Trainer::plan_snapshots() {
  const bool wanted = args_.snapshot_every > 0 || !args_.snapshot_at.empty();
  if (!wanted) return;
  if (args_.out.empty())
    fail("snapshots are kept in the run's directory: give --out (in Python out=) with --snapshot-every / --snapshot-at");
  if (!writes_files()) return;  // rank 0 of a data-parallel run writes them
  // a resumed run writes only the snapshots after its checkpoint's step, a fork those after its
  // state's step (the steps up to it are the original run's)
  int64_t start = 0;
  const std::string from = args_.resume ? checkpoint_path() : forking() ? args_.fork_from : std::string();
  if (!from.empty() && file_exists(from)) {
    try {
      start = json::parse(read_safetensors(from).meta("train_state")).at("step").get<int64_t>();
    } catch (const json::exception& e) {
      fail(from, ": its train_state metadata is unreadable (", e.what(), ")");
    }
  }
  for (int64_t s : planned_snapshot_steps(args_))
    if ((s > start || (s == 0 && start == 0)) && !file_exists(snapshot_path(args_.out, s))) snapshot_plan_.steps.push_back(s);
  if (snapshot_plan_.steps.empty()) return;
  // The size of a snapshot is that of the resume state as it is now (the tensors do not change
  // size), give or take the digits of the step and the times in its metadata.
  snapshot_plan_.bytes_each = static_cast<double>(resume_state(args_.steps, 1e9).serialize().size()) + 64;
  check_snapshots_fit_on_disk(args_.out, static_cast<int64_t>(snapshot_plan_.steps.size()), snapshot_plan_.bytes_each);
}

std::string held_out_rows_path(const std::string& dir) { return dir + "/eval_data.safetensors"; }

void save_token_rows(const std::string& path, const std::vector<Batch>& data) {
  if (data.empty()) fail(path, ": no rows to write");
  const int64_t T = data[0].inputs.shape[1];
  Ids ids, targets;
  for (const Batch& b : data) {
    ids.data.insert(ids.data.end(), b.inputs.data.begin(), b.inputs.data.end());
    targets.data.insert(targets.data.end(), b.targets.data.begin(), b.targets.data.end());
  }
  ids.shape = targets.shape = Shape{static_cast<int64_t>(ids.data.size()) / T, T};
  SafetensorsWriter w;
  w.add_ids("input_ids", ids, DType::I32);
  w.add_ids("targets", targets, DType::I32);  // -1 = not counted
  w.write(path);
}

void train_to_end(TrainArgs a, const TrainObserver& obs) {
  a.resume = file_exists(a.out + "/checkpoint.safetensors");
  Trainer t(a);
  try {
    write_summary(a.out, t.args(), t.run(obs));
  } catch (const Interrupted&) {
    write_summary(a.out, t.args(), t.partial_result(), /*finished=*/false);
    throw;
  }
}

Rng training_data_rng(uint64_t seed) {
  Rng r(0);
  r.seed_with(seed * 0x9E3779B97F4A7C15ull + 0x5EED);
  return r;
}

std::string Trainer::checkpoint_path() const { return args_.out + "/checkpoint.safetensors"; }

namespace {
std::string last_good(int64_t last_ckpt, const std::string& path) {
  return last_ckpt > 0 ? "the last good checkpoint, step " + std::to_string(last_ckpt) + ", is intact" +
                             (path.empty() ? "" : " in " + path)
                       : "no checkpoint was written yet";
}
}  // namespace

void Trainer::check_weights_finite(int64_t step, int64_t last_ckpt) const {
  for (auto& [name, t] : model_->named_parameters()) {
    const float* d = t.data();
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      if (!std::isfinite(d[i]))
        throw NonFiniteError("step " + std::to_string(step) + ": parameter " + name +
                             " is no longer finite; stopping without saving it (" +
                             last_good(last_ckpt, args_.out.empty() ? "" : checkpoint_path()) +
                             "; try a smaller --lr or --clip)");
  }
}

SafetensorsWriter Trainer::resume_state(int64_t step, double wall_s) const {
  SafetensorsWriter w;
  add_model(w, *model_);
  for (auto& [name, t] : opt_->state()) w.add("optim." + name, t);
  json state = {{"step", step},
                {"optimizer_steps", opt_->steps()},
                {"data_rng", rng_json(data_rng_)},
                {"dropout_rng", rng_json(model_->dropout_rng)},
                {"wall_s", wall_s},
                {"train_s", train_s_so_far_},
                {"eval_s", eval_s_so_far_},
                {"args", json::parse(args_.to_json())}};
  w.set_meta("train_state", state.dump());
  w.set_meta("task", args_.task.to_json());
  return w;
}

void Trainer::save(int64_t step, double wall_s) {
  if (!writes_files()) return;
  resume_state(step, wall_s).write(checkpoint_path());
  save_checkpoint(args_.out + "/model.safetensors", *model_, {}, {{"task", args_.task.to_json()}});
}

void Trainer::save_snapshot_if_due(int64_t step, double wall_s, int64_t last_ckpt) {
  if (args_.out.empty() || !snapshot_due(args_, step)) return;
  // the checkpoint's rule, nothing non-finite is kept, checked on every rank (the weights are the
  // same on each) so that all stop together rather than the others waiting for rank 0
  check_weights_finite(step, last_ckpt);
  if (!writes_files()) return;
  make_dirs(snapshot_dir(args_.out));
  resume_state(step, wall_s).write(snapshot_path(args_.out, step));
}

int64_t Trainer::restore(double& wall_s, const std::string& path) {
  if (!file_exists(path)) fail(path, ": nothing to resume (no checkpoint in ", args_.out, ")");
  SafetensorsFile f = read_safetensors(path);
  const ModelConfig saved = checkpoint_config(f);
  const json a = json::parse(saved.to_json()), b = json::parse(args_.model.to_json());
  for (auto it = a.begin(); it != a.end(); ++it)
    if (b.contains(it.key()) && b[it.key()] != it.value())
      fail(path, ": checkpoint config does not match the flags: ", it.key(), " is ", it.value().dump(),
           " in the checkpoint but ", b[it.key()].dump(), " in the flags");
  load_parameters(*model_, f);
  json st;
  try {
    st = json::parse(f.meta("train_state"));
  } catch (const json::exception& e) {
    fail(path, ": train_state is not valid JSON");
  }
  std::vector<std::pair<std::string, Tensor>> opt_state;
  for (auto& [name, t] : f.tensors)
    if (name.rfind("optim.", 0) == 0) opt_state.push_back({name.substr(6), f.f32(name)});
  opt_->load_state(opt_state, st.at("optimizer_steps").get<int64_t>());
  rng_from_json(data_rng_, st.at("data_rng"), path);
  rng_from_json(model_->dropout_rng, st.at("dropout_rng"), path);
  wall_s = st.at("wall_s").get<double>();
  train_s_so_far_ = st.value("train_s", 0.0);
  eval_s_so_far_ = st.value("eval_s", 0.0);
  return st.at("step").get<int64_t>();
}

int64_t Trainer::start_state(double& wall_s) {
  int64_t start = 0;
  if (args_.resume) {
    start = restore(wall_s, checkpoint_path());
  } else if (forking()) {
    start = restore(wall_s, args_.fork_from);
    interventions_.reinit(*model_, *opt_, args_.seed);  // once, at the fork; a resumed fork has them in its checkpoint
    // the fork's history up to the fork: the original run's metrics lines of those steps
    const std::string original = run_dir_of_state_file(args_.fork_from) + "/metrics.jsonl";
    if (writes_files()) {
      std::string kept;
      if (file_exists(original)) {
        std::ifstream in(original);
        std::string line;
        while (std::getline(in, line)) {
          try {
            if (!line.empty() && json::parse(line).at("step").get<int64_t>() <= start) kept += line + "\n";
          } catch (const json::exception&) {
            continue;  // a torn last line
          }
        }
      }
      write_file_atomic(args_.out + "/metrics.jsonl", kept);
    }
  }
  interventions_.set_gates(*model_);
  interventions_.remember_frozen();
  return start;
}

float Trainer::apply_step(float loss, const std::function<void(TransformerLM&)>& on_gradients) {
  interventions_.zero_frozen_grads();
  const float norm = apply_gradients(*model_, *opt_, loss, args_.clip, on_gradients);
  interventions_.restore_frozen();
  return norm;
}

bool run_finished(const std::string& dir) {
  const std::string path = dir + "/summary.json";
  if (!file_exists(path)) return false;
  try {
    return json::parse(read_file(path)).value("finished", true);
  } catch (const json::exception& e) {
    fail(path, ": unreadable (", e.what(), ")");
  }
}

void write_summary(const std::string& out, const TrainArgs& args, const TrainResult& r, bool finished) {
  const EvalResult& e = r.final_eval;
  json j = {{"finished", finished},
            {"config", json::parse(args.to_json())},
            {"final", {{"step", r.steps}, {"loss", e.loss}, {"perplexity", std::exp(e.loss)},
                       {"token_acc", e.token_acc}, {"exact_match", e.exact_match},
                       {"ar_exact_match", e.ar_exact_match}}},
            {"first_step_99", r.first_step_99 >= 0 ? json(r.first_step_99) : json(nullptr)},
            {"wall_s", r.wall_s},
            {"train_s", r.train_s},
            {"eval_s", r.eval_s},
            {"steps", r.steps},
            {"skipped_steps", r.skipped_steps},
            {"parameters", r.params},
            {"ranks", r.ranks},
            {"peak_tensor_bytes", r.peak_tensor_bytes},
            {"peak_rss_kb", r.peak_rss_kb}};
  write_file_atomic(out + "/summary.json", j.dump(2) + "\n");
}

Tensor batch_loss(TransformerLM& model, const Batch& batch) {
  // positions after a row's last target are not computed (the copy tasks' padding: about 45%),
  // and the last block's feed-forward and the head run only where there is a target
  thread_local BatchScratch scratch;  // reused: no allocation per step
  const Ids* targets = nullptr;
  const Tensor logits = forward_batch(model, batch, scratch, targets);
  return cross_entropy(logits, *targets);
}

std::pair<float, float> train_step(TransformerLM& model, Optimizer& opt, const Batch& batch, float clip,
                                   const std::function<void(TransformerLM&)>& on_gradients) {
  const Tensor loss = batch_loss(model, batch);
  loss.backward();
  const float loss_v = loss.item();
  return {loss_v, apply_gradients(model, opt, loss_v, clip, on_gradients)};
}

float apply_gradients(TransformerLM& model, Optimizer& opt, float loss, float clip,
                      const std::function<void(TransformerLM&)>& on_gradients) {
  const float norm = clip_grad_norm(opt.params(), clip);
  if (std::isfinite(loss) && std::isfinite(norm)) {
    if (on_gradients) on_gradients(model);
    opt.step();
  }
  opt.zero_grad();
  return norm;
}

void finetune(TransformerLM& model, const Task& task, int steps, float lr, int batch, uint64_t seed) {
  std::vector<NamedParam> params;
  for (auto& [name, t] : model.named_parameters()) params.push_back({name, t, t.ndim() >= 2});
  Adam opt(params, lr, 0.9f, 0.999f, 1e-8f, 0.01f, true);
  Rng rng(seed);
  const bool was = model.training();
  model.train();
  Batch b;
  for (int i = 0; i < steps; ++i) {
    task.sample_into(b, batch, rng);
    train_step(model, opt, b, 1.f);
  }
  model.train(was);
}

std::pair<float, float> Trainer::step_at(int64_t step, const std::function<void(TransformerLM&)>& on_gradients) {
  const PrecisionScope precision(run_precision(args_));
  opt_->lr = sched_.at(step);
  task_->sample_into(batch_, args_.batch, data_rng_);
  if (group_) return data_parallel_step(step, on_gradients);
  const Tensor loss = batch_loss(*model_, batch_);  // train_step's work, with the interventions around the update
  loss.backward();
  const float loss_v = loss.item();
  return {loss_v, apply_step(loss_v, on_gradients)};
}

std::pair<float, float> Trainer::data_parallel_step(int64_t step,
                                                    const std::function<void(TransformerLM&)>& on_gradients) {
  // This rank's rows of the global batch. Its mean loss is weighted by its share of the batch's
  // counted targets, so the gradients summed over the ranks are those of the global batch's
  // mean loss, as one process computes them up to the order of the additions.
  const int64_t B = batch_.size(), rank = group_->rank(), ranks = group_->size();
  batch_.rows_into(B * rank / ranks, B * (rank + 1) / ranks, shard_);
  const int64_t mine = shard_.counted_targets(), all = batch_.counted_targets();
  // Dropout masks of this rank's rows: from (seed, step, rank), so the ranks draw different masks
  // and a resumed run draws the same ones (the checkpoint holds rank 0's generator only).
  if (args_.model.dropout > 0.f || args_.model.attn_dropout > 0.f)
    model_->dropout_rng.seed_with((args_.seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(step) << 20) ^
                                  static_cast<uint64_t>(rank) ^ 0xD9D9u);
  float weighted_loss = 0;
  if (mine > 0) {
    const Tensor loss = batch_loss(*model_, shard_) * (static_cast<float>(mine) / static_cast<float>(all));
    loss.backward();
    weighted_loss = loss.item();
  }
  // Every gradient, whether this rank has it, the weighted loss and this rank's stop request in
  // one buffer, summed over the ranks in rank order: every rank then takes the same step and
  // stops at the same one. A parameter no rank has a gradient for keeps none (the optimizer
  // skips it, as in one process).
  const std::vector<NamedParam>& params = opt_->params();
  const int64_t np = static_cast<int64_t>(params.size());
  int64_t n = np + 2;
  for (const NamedParam& p : params) n += p.param.numel();
  summed_.resize(static_cast<size_t>(n));  // allocates on the first step only
  float* at = summed_.data();
  float* has = summed_.data() + n - 2 - np;  // (np) 1 where this rank has the gradient
  for (int64_t i = 0; i < np; ++i) {
    const Tensor& p = params[static_cast<size_t>(i)].param;
    const Tensor g = p.grad();
    if (g.defined()) std::copy_n(g.data(), g.numel(), at);
    else std::fill_n(at, p.numel(), 0.f);
    has[i] = g.defined() ? 1.f : 0.f;
    at += p.numel();
  }
  at += np;
  at[0] = weighted_loss;
  at[1] = stop_requested() ? 1.f : 0.f;
  group_->sum_in_rank_order(summed_.data(), n);
  const float* sum = summed_.data();
  for (int64_t i = 0; i < np; ++i) {
    const Tensor& p = params[static_cast<size_t>(i)].param;
    if (has[i] > 0.f)
      if (float* g = grad_buffer(p)) std::copy_n(sum, p.numel(), g);
    sum += p.numel();
  }
  at = summed_.data() + n - 2;
  const float loss_v = at[0];  // 0 when no rank has a counted target, as cross_entropy gives
  group_stop_ = at[1] > 0;
  return {loss_v, apply_step(loss_v, on_gradients)};
}

std::pair<float, float> Trainer::step(const std::function<void(TransformerLM&)>& on_gradients) {
  if (ran_) fail("Trainer: step() after run(): use one or the other on a trainer");
  if (manual_step_ < 0) {
    double wall = 0;
    manual_step_ = start_state(wall);
    task_->seek(manual_step_, args_.batch);
    set_num_threads(args_.threads);  // once: both stay as set (evaluation restores the mode)
    model_->train();
    if (manual_step_ == 0) save_snapshot_if_due(0, 0, 0);  // the initial weights
  }
  const auto r = step_at(manual_step_, on_gradients);
  ++manual_step_;
  // with out: what run() writes as it goes, at the same steps: a metrics line every eval_every
  // steps and at the last, a checkpoint every checkpoint_every steps and at the last
  if (writes_files()) {
    const int64_t done = manual_step_;
    const bool last = done == args_.steps;
    if (done % args_.eval_every == 0 || last) {
      const PrecisionScope precision(run_precision(args_));
      const EvalResult e = evaluate(*model_, *task_, held_out_, args_.eval_autoregressive || last);
      const std::string path = args_.out + "/metrics.jsonl";
      // the first line of a fresh run starts the file; a resumed loop appends
      FILE* f = open_log(path, manual_metrics_started_ || args_.resume || !args_.fork_from.empty());
      const std::string line = eval_json(done, e, sched_.at(done - 1), 0, 0) + "\n";
      const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
      if (std::fclose(f) != 0 || !ok) fail(path, ": write failed: ", std::strerror(errno));
      manual_metrics_started_ = true;
    }
    save_snapshot_if_due(done, 0, 0);
    if (done % args_.checkpoint_every == 0 || last) {
      check_weights_finite(done, 0);
      save(done, 0);
    }
  }
  return r;
}

EvalResult Trainer::evaluate_held_out(bool autoregressive) {
  set_num_threads(args_.threads);
  const PrecisionScope precision(run_precision(args_));
  return evaluate(*model_, *task_, held_out_, autoregressive);
}

TrainResult Trainer::run(const TrainObserver& obs) {
  using clock = std::chrono::steady_clock;
  if (manual_step_ >= 0) fail("Trainer: run() after step(): use one or the other on a trainer");
  if (ran_) fail("Trainer: run() a second time: make a new trainer (with resume to continue the run)");
  ran_ = true;
  set_num_threads(args_.threads);
  TrainResult res;
  res.params = model_->num_parameters();
  res.ranks = group_ ? group_->size() : 1;
  double wall_offset = 0;
  int64_t start = 0;
  const std::string metrics_path = writes_files() ? args_.out + "/metrics.jsonl" : "";
  start = start_state(wall_offset);
  if (args_.resume || forking()) {
    if (start > args_.steps)
      fail("--steps ", args_.steps, " is below step ", start, ", which the run in ", args_.out,
           " has already reached: give --steps ", start, " or more");
    task_->seek(start, args_.batch);  // a task reading its rows in order continues where it stopped
    // Drop eval lines written after the checkpoint (a crash between eval and checkpoint).
    if (file_exists(metrics_path)) {
      std::ifstream in(metrics_path);
      std::string line, kept;
      while (std::getline(in, line)) {
        if (line.empty()) continue;
        try {
          const json j = json::parse(line);
          const int64_t s = j.at("step").get<int64_t>();
          if (s > start) continue;
          EvalResult e;
          e.loss = j.at("loss");
          e.token_acc = j.at("token_acc");
          e.exact_match = j.at("exact_match");
          res.curve.push_back({s, e});
          if (res.first_step_99 < 0 && e.token_acc >= 0.99) res.first_step_99 = s;
        } catch (const json::exception&) {
          continue;  // a torn last line from a crash
        }
        kept += line + "\n";
      }
      write_file_atomic(metrics_path, kept);
    }
  }
  FILE* metrics = metrics_path.empty() ? nullptr : open_log(metrics_path, start);
  struct Closer {
    FILE*& f;
    ~Closer() { if (f) std::fclose(f); }
  } closer{metrics};
  const auto t0 = clock::now();
  auto wall = [&] { return wall_offset + std::chrono::duration<double>(clock::now() - t0).count(); };
  auto window_start = clock::now();
  int64_t window_tokens = 0;
  model_->train();
  pool_reset_peak();
  int64_t last_ckpt = start;
  if (start == 0) save_snapshot_if_due(0, 0, 0);  // the initial weights
  for (int64_t step = start; step < args_.steps; ++step) {
    const float lr = sched_.at(step);
    const Batch& batch = batch_;
    const auto step_start = clock::now();
    const auto [loss_v, norm] = step_at(step, [&](TransformerLM& m) {
      if (obs.on_gradients) obs.on_gradients(step + 1, m);
    });
    train_s_so_far_ += std::chrono::duration<double>(clock::now() - step_start).count();
    if (!std::isfinite(loss_v) || !std::isfinite(norm)) {
      const std::string what = !std::isfinite(loss_v) ? "loss is " + std::to_string(loss_v)
                                                       : "gradient norm is " + std::to_string(norm);
      // a skipped step cannot help when the weights themselves are already broken
      check_weights_finite(step + 1, last_ckpt);
      if (!args_.skip_nonfinite)
        throw NonFiniteError("step " + std::to_string(step + 1) + ": " + what + "; stopping (" +
                             last_good(last_ckpt, args_.out.empty() ? "" : checkpoint_path()) +
                             "; --skip-nonfinite skips such steps instead)");
      ++res.skipped_steps;
    }
    window_tokens += batch.inputs.numel();
    if (obs.on_step) {
      const double secs = std::chrono::duration<double>(clock::now() - window_start).count();
      obs.on_step(step + 1, args_.steps, loss_v, secs > 0 ? window_tokens / secs : 0);
    }
    const bool last = step + 1 == args_.steps;
    // with data-parallel ranks rank 0 alone evaluates (the weights are the same on every rank)
    if (leads() && ((step + 1) % args_.eval_every == 0 || last)) {
      const double secs = std::chrono::duration<double>(clock::now() - window_start).count();
      const double tps = secs > 0 ? window_tokens / secs : 0;
      // The pool keeps the evaluation's buffers for the next evaluation: trimming them here made
      // every evaluation, and the training steps after it, fault their pages in again (a fifth
      // of a study run's time at d_head 2), and peak memory is the same either way.
      const auto eval_start = clock::now();
      std::optional<PrecisionScope> precision(run_precision(args_));
      EvalResult e = evaluate(*model_, *task_, held_out_, args_.eval_autoregressive || last);
      precision.reset();
      eval_s_so_far_ += std::chrono::duration<double>(clock::now() - eval_start).count();
      if (!std::isfinite(e.loss)) {
        check_weights_finite(step + 1, last_ckpt);
        throw NonFiniteError("step " + std::to_string(step + 1) + ": the held-out loss is " + std::to_string(e.loss) +
                             "; stopping (" + last_good(last_ckpt, args_.out.empty() ? "" : checkpoint_path()) + ")");
      }
      res.curve.push_back({step + 1, e});
      if (res.first_step_99 < 0 && e.token_acc >= 0.99) res.first_step_99 = step + 1;
      if (metrics) {
        const std::string line = eval_json(step + 1, e, lr, tps, wall()) + "\n";
        if (std::fwrite(line.data(), 1, line.size(), metrics) != line.size() || std::fflush(metrics) != 0)
          fail(metrics_path, ": write failed: ", std::strerror(errno), " (", last_good(last_ckpt, checkpoint_path()), ")");
      }
      if (obs.on_eval) obs.on_eval(step + 1, e);
      window_start = clock::now();
      window_tokens = 0;
    }
    const bool stop = group_ ? group_stop_ : stop_requested();
    save_snapshot_if_due(step + 1, wall(), last_ckpt);  // before the checkpoint: a resume rewrites a lost one
    if ((step + 1) % args_.checkpoint_every == 0 || last || stop) {
      check_weights_finite(step + 1, last_ckpt);  // nothing non-finite is ever checkpointed
      save(step + 1, wall());
      last_ckpt = step + 1;
    }
    if (stop && !last) {
      res.steps = step + 1;
      res.wall_s = wall();
      res.train_s = train_s_so_far_;
      res.eval_s = eval_s_so_far_;
      res.peak_rss_kb = peak_rss_kb();
      if (!res.curve.empty()) res.final_eval = res.curve.back().second;
      partial_ = res;
      throw Interrupted("stopped at step " + std::to_string(step + 1) + " of " + std::to_string(args_.steps) +
                            (args_.out.empty() ? "" : "; checkpoint written to " + checkpoint_path()),
                        step + 1);
    }
  }
  res.steps = args_.steps;
  res.wall_s = wall();
  res.train_s = train_s_so_far_;
  res.eval_s = eval_s_so_far_;
  res.peak_rss_kb = peak_rss_kb();
  res.peak_tensor_bytes = pool_stats().bytes_peak;
  if (!res.curve.empty()) res.final_eval = res.curve.back().second;
  if (start >= args_.steps && leads()) {  // resumed a finished run: evaluate once more for the summary
    const PrecisionScope precision(run_precision(args_));
    res.final_eval = evaluate(*model_, *task_, held_out_, true);
  }
  return res;
}

}  // namespace hl
