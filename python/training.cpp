// Binds tasks (Task, its held-out Batches) and training (the Trainer behind headlab.train,
// run with Python callbacks and Ctrl-C, and train_settings).
#include <cmath>
#include <set>

#include "bindings.h"
#include "train/snapshots.h"

#include "train/atlas.h"
#include "lib/rng.h"
#include "models/checkpoint.h"
#include "train/run_plan.h"
#include "train/settings.h"

namespace hl::bindings {
namespace {

// ---- Task and held-out data ---------------------------------------------------------------

// Token ids of one array of a dict or the arguments, (N, T) like `like` when given.
Ids token_ids(const py::object& obj, const char* name, const std::string& what, const Ids* like) {
  Ids ids = ids_from(obj, name);
  if (like && ids.shape != like->shape)
    throw py::value_error(what + ": " + name + " has shape " + ids.shape.str() + " but input_ids is " + like->shape.str());
  return ids;
}

// A mask (N, T) of bool, uint8, integers or floats as floats: loss_mask (0 = not counted) or
// attention_mask (1 = token, 0 = padding), `name` in the messages.
std::vector<float> mask_from(const py::object& obj, const Ids& ids, const std::string& what, const std::string& name = "loss_mask") {
  const std::string meaning = name == "loss_mask" ? "0 = not counted" : "1 = token, 0 = padding";
  py::array m = py::array::ensure(obj);
  if (!m) throw py::type_error(what + ": " + name + " must be an array");
  if (m.ndim() != 2 || m.shape(0) != ids.shape[0] || m.shape(1) != ids.shape[1])
    throw py::value_error(what + ": " + name + " has shape " + shape_text(m) + " but input_ids is (" +
                          std::to_string(ids.shape[0]) + ", " + std::to_string(ids.shape[1]) + ")");
  const char kind = m.dtype().kind();
  if (kind != 'b' && kind != 'i' && kind != 'u' && kind != 'f')
    throw py::type_error(what + ": " + name + " must be bool, integer or float (" + meaning + "), got dtype " +
                         std::string(py::str(m.dtype())));
  check_copy_fits(m, 2 * sizeof(float), what + ": " + name);
  const auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(m);
  if (!f) throw py::type_error(what + ": cannot convert " + name + " of dtype " + std::string(py::str(m.dtype())) + " to float32");
  std::vector<float> mask(f.data(), f.data() + f.size());
  for (float v : mask)
    if (std::isnan(v)) throw py::value_error(what + ": " + name + " holds NaN (" + meaning + ")");
  return mask;
}

// The arrays of hl.Batches and of a Trainer's data: an input_ids array, or a dict with
// input_ids and optional targets, loss_mask, attention_mask and prompt_len (a batch dict of
// Task.sample fits).
struct UserArrays {
  TokenArrays tokens;
  py::object prompt_len = py::none();
};
UserArrays user_arrays(const py::object& obj, const std::string& what) {
  UserArrays u;
  if (!py::isinstance<py::dict>(obj)) {
    u.tokens.input_ids = ids_from(obj, "input_ids");
    return u;
  }
  py::dict d = obj;
  for (auto& [k, v] : d) {
    const std::string key = py::str(k);
    if (key != "input_ids" && key != "targets" && key != "loss_mask" && key != "attention_mask" && key != "prompt_len")
      throw py::value_error(what + ": unknown key '" + key + "' (a dict of arrays holds input_ids, optional targets, "
                            "loss_mask, attention_mask and prompt_len)");
  }
  if (!d.contains("input_ids")) throw py::value_error(what + ": a dict of arrays needs 'input_ids' (N, T)");
  TokenArrays& t = u.tokens;
  t.input_ids = ids_from(d["input_ids"], "input_ids");
  if (d.contains("targets") && !d["targets"].is_none()) t.targets = token_ids(d["targets"], "targets", what, &t.input_ids);
  if (d.contains("loss_mask") && !d["loss_mask"].is_none()) t.loss_mask = mask_from(d["loss_mask"], t.input_ids, what);
  if (d.contains("attention_mask") && !d["attention_mask"].is_none())
    t.attention_mask = mask_from(d["attention_mask"], t.input_ids, what, "attention_mask");
  if (d.contains("prompt_len")) u.prompt_len = d["prompt_len"];
  return u;
}

// Training data: rows of one length (a padded row would train on its padding).
TokenArrays token_arrays(const py::object& obj, const std::string& what) {
  TokenArrays t = user_arrays(obj, what).tokens;
  if (!t.attention_mask.empty())
    throw py::value_error(what + ": attention_mask: training rows are not padded (give loss_mask 0 where a row has no target)");
  return t;
}

// A task from keywords; data/eval_data may be arrays or dicts of arrays (tokens without a file).
std::unique_ptr<Task> task_from(TrainArgs& a, const py::object& data, const py::object& eval_data) {
  const bool arrays = !data.is_none() && !is_path_like(data);
  if (!arrays && !eval_data.is_none() && !is_path_like(eval_data))
    throw py::value_error("eval_data as arrays goes with data as arrays (task='tokens'); with data from a file, give "
                          "eval_data as a file too");
  if (!data.is_none() && !arrays) a.task.data = path_from(data, "data");
  if (!eval_data.is_none() && is_path_like(eval_data)) a.task.eval_data = path_from(eval_data, "eval_data");
  a.task.make_paths_absolute();
  if (!arrays) return nullptr;
  if (a.task.name != "tokens") throw py::value_error("arrays as data are sequences of task 'tokens' (task='tokens')");
  a.task.data = "(input_ids given from Python)";
  const TokenArrays train = token_arrays(data, "data");
  std::optional<TokenArrays> eval;
  if (!eval_data.is_none()) {
    a.task.eval_data = "(eval input_ids given from Python)";
    eval = token_arrays(eval_data, "eval_data");
  }
  return make_tokens_task(a.task, train, eval ? &*eval : nullptr);
}

py::dict batch_dict(const Batch& b) {
  py::dict d;
  d["input_ids"] = ids_to_array(b.inputs);
  d["targets"] = ids_to_array(b.targets);
  d["prompt_len"] = py::cast(b.prompt_len);
  return d;
}

// ---- the trainer ------------------------------------------------------------------------------

struct PyTrainer {
  std::unique_ptr<Trainer> trainer;
  std::vector<std::string> notices;  // plan_run's and the snapshots', for Trainer to show
};

// A keyword of the run-control table (out=, fork=, gate=[...]) into its field through the one
// converter of settings (a run's texts are paths); plan_run checks ranges and combinations.
void set_run_setting(RunRequest& r, const RunSetting& s, const py::handle& value) {
  const std::string key = s.name();
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, std::string>) *field = path_from(value, key);
        else *field = setting_value<T>(value, key);
      },
      s.field(r));
}

py::object run_trainer(Trainer& t, const py::object& on_step, const py::object& on_eval) {
  if (t.has_run()) throw py::value_error("Trainer: run() was already called; make a new Trainer (resume=True continues a run)");
  TrainObserver obs;
  PendingSignal pending;  // Ctrl-C noticed at a step: the trainer stops after that step's checkpoint
  // Python code run from the trainer (a callback, and the building of its arguments: an
  // EvalResult is a Python object) that raises KeyboardInterrupt (Ctrl-C while it ran) stops the
  // run the same way, after the step's checkpoint.
  auto guarded = [&](auto&& python_code) {
    py::gil_scoped_acquire gil;
    try {
      python_code();
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_KeyboardInterrupt)) throw;
      pending.error.emplace(std::move(e));
      request_stop_on_this_thread();
    }
  };
  obs.on_step = [&](int64_t step, int64_t total, float loss, double tps) {
    if (!on_step.is_none()) guarded([&] { on_step(step, total, loss, tps); });
  };
  obs.on_eval = [&](int64_t step, const EvalResult& e) {
    if (!on_eval.is_none()) guarded([&] { on_eval(step, eval_result(e)); });
  };
  // the gradient atlas (log_grads, dump_grads_at), written into out as the command line writes it
  std::unique_ptr<GradAtlas> atlas;
  const TrainArgs& a = t.args();
  if (!a.out.empty() && (a.log_grads_every > 0 || !a.dump_grads_at.empty())) {
    atlas = std::make_unique<GradAtlas>(a.out, a.log_grads_every, a.dump_grads_at, a.resume);
    atlas->set_probe(t.task().held_out(64, a.eval_seed, 64)[0]);
    obs.on_gradients = [&](int64_t step, TransformerLM& m) { atlas->observe(step, m); };
  }
  StopPoll poll([&pending] { return pending.check(); });
  clear_stop_on_this_thread();
  TrainResult r;
  // However run() ends, the output directory is free afterwards (resume=True in this process),
  // and this thread's stop request is cleared.
  struct Release {
    Trainer& t;
    ~Release() {
      t.release_out_dir();
      clear_stop_on_this_thread();
    }
  } release_dir{t};
  try {
    py::gil_scoped_release release;
    r = t.run(obs);
  } catch (const Interrupted& e) {
    if (!t.args().out.empty()) write_summary(t.args().out, t.args(), t.partial_result(), /*finished=*/false);
    pending.raise(e.what());
  }
  if (!t.args().out.empty()) write_summary(t.args().out, t.args(), r);
  py::dict d;
  d["final_eval"] = eval_result(r.final_eval);
  d["steps"] = r.steps;
  d["wall_s"] = r.wall_s;
  d["train_s"] = r.train_s;
  d["params"] = r.params;
  d["skipped_steps"] = r.skipped_steps;
  d["first_step_99"] = r.first_step_99;
  py::list curve;
  for (auto& [s, e] : r.curve) {
    py::dict row = eval_fields(e);
    row["step"] = s;
    curve.append(typed_result("EvalResult", row));
  }
  d["curve"] = curve;
  return typed_result("TrainResult", d);
}

}  // namespace

PyData batches_from(const py::object& input_ids, const py::object& targets, const py::object& loss_mask,
                    const py::object& batch_size, const py::object& prompt_len, const py::object& attention_mask) {
  const std::string what = "Batches";
  UserArrays u = user_arrays(input_ids, what);
  if (py::isinstance<py::dict>(input_ids)) {
    if (!targets.is_none() || !loss_mask.is_none() || !attention_mask.is_none())
      throw py::value_error(what + ": give targets, loss_mask and attention_mask inside the dict or as arguments, not both");
  } else {
    if (!targets.is_none()) u.tokens.targets = token_ids(targets, "targets", what, &u.tokens.input_ids);
    if (!loss_mask.is_none()) u.tokens.loss_mask = mask_from(loss_mask, u.tokens.input_ids, what);
    if (!attention_mask.is_none()) u.tokens.attention_mask = mask_from(attention_mask, u.tokens.input_ids, what, "attention_mask");
  }
  if (!prompt_len.is_none()) {
    if (!u.prompt_len.is_none()) throw py::value_error(what + ": give prompt_len inside the dict or as an argument, not both");
    u.prompt_len = prompt_len;
  }
  const int64_t N = u.tokens.input_ids.shape[0];
  std::vector<int> prompt;  // per row; empty = no answers
  if (!u.prompt_len.is_none()) {
    py::array a = py::array::ensure(u.prompt_len);
    if (py::isinstance<py::bool_>(u.prompt_len) || (a && a.dtype().kind() == 'b'))
      throw py::type_error(what + ": prompt_len must be an integer or (N,) integers, not bools");
    if (a && a.ndim() == 0) {  // one length for every row
      const Ids one = ids_from(a.reshape({py::ssize_t(1)}), "prompt_len");
      const int64_t p = one.data[0];
      if (p < 0 || p > INT32_MAX) throw py::value_error(what + ": prompt_len " + std::to_string(p) + " is negative or too large");
      prompt.assign(static_cast<size_t>(N), static_cast<int>(p));
    } else {
      const Ids p = ids_from(u.prompt_len, "prompt_len");  // (1, N)
      if (p.shape[0] != 1) throw py::value_error(what + ": prompt_len must be an integer or (N,) integers, got shape " + p.shape.str());
      prompt.assign(p.data.begin(), p.data.end());
    }
  }
  int bs = 128;  // as Task.held_out
  if (!batch_size.is_none()) {
    if (py::isinstance<py::bool_>(batch_size) || !PyIndex_Check(batch_size.ptr()))
      throw py::type_error(what + ": batch_size must be an integer");
    const int64_t b = batch_size.cast<int64_t>();
    if (b < 1 || b > INT32_MAX) throw py::value_error(what + ": batch_size must be positive, got " + std::to_string(b));
    bs = static_cast<int>(b);
  }
  return PyData{token_batches(u.tokens, bs, what, prompt)};
}

DataArg data_arg(const py::object& obj, const TransformerLM& model, const std::string& fn) {
  DataArg d;
  if (obj.is_none()) throw py::type_error(fn + ": give the data (Batches, an input_ids array (N, T) or a dict of arrays)");
  if (py::isinstance<PyData>(obj))
    d.given = &obj.cast<const PyData&>();
  else
    d.owned = batches_from(obj);
  if (d.batches().empty()) throw py::value_error(fn + ": no data");
  check_data_fits_model(d.batches(), model.cfg, fn);
  return d;
}

void bind_tasks(py::module_& m) {
  // ---- tasks --------------------------------------------------------------------------------
  py::class_<PyData>(m, "Batches", "Batches of held-out rows: a task's (Task.held_out), a probe's, or your arrays")
      .def(py::init([](const py::object& input_ids, const py::object& targets, const py::object& loss_mask,
                       const py::object& batch_size, const py::object& prompt_len, const py::object& attention_mask) {
             return batches_from(input_ids, targets, loss_mask, batch_size, prompt_len, attention_mask);
           }),
           py::arg("input_ids"), py::arg("targets") = py::none(), py::arg("loss_mask") = py::none(),
           py::arg("batch_size") = py::none(), py::arg("prompt_len") = py::none(), py::arg("attention_mask") = py::none(),
           "Batches(input_ids (N, T), targets=None, loss_mask=None, batch_size=128, prompt_len=None, attention_mask=None), or "
           "Batches({'input_ids': ..., 'targets': ..., 'loss_mask': ...}): rows by the tokens task's rule "
           "(targets -1 = not counted; without targets position t predicts input t+1; loss_mask 0 = not counted). "
           "attention_mask (1 = token, 0 = padding): rows of different lengths padded on either side, each analysed as "
           "the row alone (padding neither attended to nor counted); a left-padded row's tokens are moved to its first "
           "columns (prompt_len counts the padded columns, as the ids)")
      .def_property_readonly("rows", [](const PyData& d) {
        int64_t n = 0;
        for (const Batch& b : d.batches) n += b.size();
        return n;
      }, "Rows over all batches")
      .def("__len__", [](const PyData& d) { return d.batches.size(); })
      .def("__getitem__", [](const PyData& d, size_t i) {
        if (i >= d.batches.size()) throw py::index_error("batch " + std::to_string(i));
        return batch_dict(d.batches[i]);
      }, py::arg("i"), "Batch i as a dict of arrays (input_ids, targets, prompt_len)");
  py::class_<PyTask>(m, "Task", "A task of the command line (copy, varcopy, induction, text, tokens, ...): its data and vocabulary")
      .def(py::init([](const std::string& name, py::kwargs kw) {
             kw["task"] = name;
             py::object data = kw.contains("data") ? py::object(kw["data"]) : py::object(py::none());
             py::object eval_data = kw.contains("eval_data") ? py::object(kw["eval_data"]) : py::object(py::none());
             TrainArgs a = args_from_kwargs(kw, [](const std::string& k) { return k == "data" || k == "eval_data"; });
             std::unique_ptr<Task> t = task_from(a, data, eval_data);
             return PyTask{t ? std::shared_ptr<Task>(std::move(t)) : std::shared_ptr<Task>(make_task(a.task))};
           }),
           py::arg("name") = "copy",
           "Task('varcopy', length=..., alphabet=..., data=...): a task with the CLI's settings by keyword")
      .def_property_readonly("name", [](const PyTask& t) { return t.task->config().name; }, "The task's name")
      .def_property_readonly("vocab_size", [](const PyTask& t) { return t.task->vocab_size(); }, "Its vocabulary size (a model's d_vocab)")
      .def_property_readonly("seq_len", [](const PyTask& t) { return t.task->seq_len(); }, "The length of its rows")
      .def_property_readonly("symbols", [](const PyTask& t) { return t.task->symbols(); },
                             "Ids 0..symbols-1 are ordinary symbols (special tokens come after): what a corruption may use")
      .def_property_readonly("rows_are_answers", [](const PyTask& t) { return t.task->rows_are_answers(); },
                             "Whether a row's targets form one answer, so exact match means something (False for "
                             "language modelling: text, token data without targets or loss_mask)")
      .def("held_out", [](const PyTask& t, int n, uint64_t seed, int batch) {
             PyData d{t.task->held_out(n, seed, batch)};
             int64_t rows = 0;
             for (const Batch& b : d.batches) rows += b.size();
             // a task reading rows from data holds only so many: say so rather than return fewer
             if (rows < n)
               throw py::value_error("held_out(" + std::to_string(n) + "): the task holds " + std::to_string(rows) +
                                     " held-out rows (" + (t.task->config().eval_data.empty() ? "the last 10% of its data"
                                                                                              : "its eval_data") +
                                     "); ask for at most " + std::to_string(rows) + ", or give eval_data");
             return d;
           },
           py::arg("n") = 1000, py::arg("seed") = 1234, py::arg("batch") = 128,
           "n held-out rows (Batches of `batch` rows), the same for the same seed")
      .def("sample", [](const PyTask& t, int batch, uint64_t seed) {
             Rng rng(seed);
             return batch_dict(t.task->sample(batch, rng));
           }, py::arg("batch") = 64, py::arg("seed") = 0, "A training-style batch: input_ids, targets, prompt_len")
      .def("token_text", [](const PyTask& t, int32_t id) { return t.task->token_text(id); }, py::arg("id"),
           "The text of a token of the task (its symbol's name)");
}

void bind_training(py::module_& m) {
  // ---- training -------------------------------------------------------------------------------
  py::class_<PyTrainer>(m, "_Trainer")
      .def(py::init([](py::kwargs kw) {
        // the keywords of the run-control table (None = not given), of the settings table, and the data
        RunRequest r;
        std::set<std::string> given;
        py::dict settings;
        // the task sets the model's vocabulary and its rows' length: n_ctx and d_vocab (ModelConfig's
        // names) are checked as ModelConfig checks them, then against what the task makes
        std::optional<int64_t> n_ctx, d_vocab;
        for (auto& [k, v] : kw) {
          const std::string key = k.cast<std::string>();
          if (key == "data" || key == "eval_data") continue;
          if (key == "n_ctx" || key == "max_seq_len") n_ctx = positive_setting("Trainer: " + key, v);
          else if (key == "d_vocab" || key == "vocab_size") d_vocab = positive_setting("Trainer: " + key, v);
          else if (const RunSetting* s = find_run_setting(key)) {
            if (v.is_none()) continue;
            set_run_setting(r, *s, v);
            given.insert(s->flag);
          } else {
            settings[k] = v;
            if (const TrainSetting* s = find_train_setting(key)) given.insert(s->flag);
          }
        }
        TrainArgs a = args_from_kwargs(settings, {}, true);
        if (n_ctx) a.model.max_seq_len = *n_ctx;
        std::unique_ptr<Task> task = task_from(a, kw.contains("data") ? py::object(kw["data"]) : py::object(py::none()),
                                               kw.contains("eval_data") ? py::object(kw["eval_data"]) : py::object(py::none()));
        r.own_task = task != nullptr;
        r.given = [&](const std::string& f) { return given.count(f) > 0; };
        PyTrainer t;
        py::gil_scoped_release release;
        RunPlan plan = plan_run(a, r);
        if (!plan.threads_notice.empty())
          t.notices.push_back(plan.threads_notice + " (threads=" + std::to_string(plan.threads_wanted) + " to use them anyway)");
        t.trainer = std::make_unique<Trainer>(plan.args, std::move(task));
        const ModelConfig& made = t.trainer->model().cfg;
        if (n_ctx && made.max_seq_len != *n_ctx)
          throw py::value_error("Trainer: n_ctx " + std::to_string(*n_ctx) + " is shorter than the task's rows (" +
                                std::to_string(t.trainer->task().seq_len()) + " tokens)");
        if (d_vocab && made.vocab_size != *d_vocab)
          throw py::value_error("Trainer: d_vocab " + std::to_string(*d_vocab) + " is not the task's vocabulary (" +
                                std::to_string(made.vocab_size) + "): the task sets it (task='tokens': alphabet=)");
        if (const std::string s = snapshot_notice(*t.trainer); !s.empty()) t.notices.push_back(s);
        return t;
      }))
      .def_property_readonly("notices", [](const PyTrainer& t) { return t.notices; },
                             "What the run plan chose that the command line says on stderr (threads lowered on a busy "
                             "machine, the snapshots' disk), one line each")
      .def("run", [](PyTrainer& t, const py::object& on_step, const py::object& on_eval) {
             return run_trainer(*t.trainer, on_step, on_eval);
           }, py::arg("on_step") = py::none(), py::arg("on_eval") = py::none())
      .def("step", [](PyTrainer& t) {
        std::pair<float, float> r;
        {
          py::gil_scoped_release release;
          r = t.trainer->step();
        }
        return py::make_tuple(r.first, r.second);
      })
      .def_property_readonly("steps_done", [](const PyTrainer& t) { return t.trainer->steps_done(); })
      .def_property_readonly("snapshot_plan", [](const PyTrainer& t) {
        const Trainer::SnapshotPlan& p = t.trainer->snapshot_plan();
        return py::make_tuple(p.steps, p.bytes_each);
      }, "(steps of the snapshots still to write, bytes of each)")
      .def("evaluate", [](PyTrainer& t, bool ar) {
        EvalResult e;
        {
          py::gil_scoped_release release;
          e = t.trainer->evaluate_held_out(ar);
        }
        return eval_result(e);
      }, py::arg("autoregressive") = false)
      .def("save", [](PyTrainer& t, const PathArg& p) {
        save_checkpoint(p.path, t.trainer->model(), {}, {{"task", t.trainer->args().task.to_json()}});
      })
      .def_property_readonly("model", [](PyTrainer& t) -> TransformerLM& { return t.trainer->model(); },
                             py::return_value_policy::reference_internal)
      .def_property_readonly("task", [](PyTrainer& t) {
        // a view of the trainer's task that does not own it (the trainer outlives it via keep_alive)
        return PyTask{std::shared_ptr<Task>(std::shared_ptr<Task>(), const_cast<Task*>(&t.trainer->task()))};
      }, py::keep_alive<0, 1>())
      .def_property_readonly("held_out", [](PyTrainer& t) { return PyData{t.trainer->held_out()}; })
      .def_property_readonly("args", [](PyTrainer& t) { return json_to_py(json::parse(t.trainer->args().to_json())); });
  m.def("train_settings", [] {
    py::list rows;
    for (const TrainSetting& s : train_settings()) rows.append(py::make_tuple(s.name(), s.flag, s.help));
    return rows;
  }, "(keyword, flag, help) of every training setting");
}

}  // namespace hl::bindings
