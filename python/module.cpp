// headlab._core: the C++ library seen from Python (pybind11). The package `headlab`
// (python/headlab/__init__.py) re-exports it and adds what is easier to write in Python
// (progress display, no_grad as a context manager).
//
// Memory: np.asarray(tensor) is a view of the tensor's storage (buffer protocol, float32, C
// order); the array keeps the tensor alive. headlab.tensor(array) always copies. Every long
// C++ call releases the GIL; Python callbacks (hooks, training callbacks) take it back.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "analysis/circuits.h"
#include "analysis/detectors.h"
#include "analysis/patching.h"
#include "analysis/evaluate.h"
#include "analysis/heads.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "models/checkpoint.h"
#include "models/hooks.h"
#include "models/transformer.h"
#include "train/settings.h"
#include "train/trainer.h"

namespace py = pybind11;
using namespace hl;
using json = nlohmann::json;

namespace {

// ---- conversions ---------------------------------------------------------------------------

std::string shape_text(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// A float32 copy of any real array (float64 is rounded); other dtypes raise TypeError.
// Refuses an array whose copy (`bytes_per_element` each) would not fit in memory: a broadcast
// view can describe 2^40 elements in a few bytes.
void check_copy_fits(const py::array& a, double bytes_per_element, const std::string& what) {
  double n = 1;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) n *= static_cast<double>(a.shape(i));
  check_fits_in_memory(n * bytes_per_element, what + ": a copy of an array of shape " + shape_text(a));
}

Tensor tensor_from_array(const py::array& a, const std::string& what) {
  const char kind = a.dtype().kind();
  if (kind != 'f') throw py::type_error(what + ": expected a float array, got dtype " + std::string(py::str(a.dtype())));
  if (a.ndim() > kMaxDims) throw py::value_error(what + ": at most " + std::to_string(kMaxDims) + " dimensions, got shape " + shape_text(a));
  check_copy_fits(a, 2 * sizeof(float), what);  // NumPy's contiguous float32 copy, then ours
  const auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!f) throw py::type_error(what + ": cannot convert an array of dtype " + std::string(py::str(a.dtype())) + " to float32");
  Shape s;
  s.ndim = static_cast<int>(f.ndim());
  for (int i = 0; i < s.ndim; ++i) s.dims[i] = f.shape(i);
  Tensor t = Tensor::empty(s);
  std::copy_n(f.data(), f.size(), t.data());
  return t;
}

// Token ids from a list or an integer array, (T) or (B, T); int32 range checked.
Ids ids_from(const py::object& obj, const char* what = "ids") {
  py::array a = py::array::ensure(obj);
  if (!a) throw py::type_error(std::string(what) + ": expected an integer array or list of token ids");
  if (a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
    throw py::type_error(std::string(what) + ": token ids must be integers, got dtype " + std::string(py::str(a.dtype())));
  if (a.ndim() == 1) a = a.reshape({py::ssize_t(1), a.shape(0)});
  if (a.ndim() != 2) throw py::value_error(std::string(what) + ": expected (T) or (B, T) token ids, got shape " + shape_text(a));
  check_copy_fits(a, sizeof(int64_t) + sizeof(int32_t), what);
  const auto v = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!v) throw py::type_error(std::string(what) + ": cannot convert an array of dtype " + std::string(py::str(a.dtype())) + " to int64");
  Ids ids(Shape{v.shape(0), v.shape(1)});
  for (py::ssize_t i = 0; i < v.size(); ++i) {
    const int64_t x = v.data()[i];
    if (x < INT32_MIN || x > INT32_MAX) throw py::value_error(std::string(what) + ": id " + std::to_string(x) + " is out of range");
    ids.data[i] = static_cast<int32_t>(x);
  }
  return ids;
}

py::array ids_to_array(const Ids& ids) {
  std::vector<py::ssize_t> shape(ids.shape.dims, ids.shape.dims + ids.shape.ndim);
  py::array_t<int32_t> a(shape);
  std::copy(ids.data.begin(), ids.data.end(), a.mutable_data());
  return a;
}

// A NumPy view of t's storage; the array keeps the tensor alive.
py::array view_of(const Tensor& t, bool writeable = true) {
  if (!t.defined()) throw py::value_error("tensor is undefined");
  std::vector<py::ssize_t> shape(t.shape().dims, t.shape().dims + t.ndim()), strides(t.ndim());
  py::ssize_t step = sizeof(float);
  for (int i = t.ndim() - 1; i >= 0; --i) strides[i] = step, step *= shape[i];
  py::capsule owner(new Tensor(t), [](void* p) { delete static_cast<Tensor*>(p); });
  py::array a(py::dtype::of<float>(), shape, strides, t.data(), owner);
  if (!writeable) a.attr("setflags")(py::arg("write") = false);
  return a;
}

py::array grid_array(const HeadGrid& g) {
  const py::ssize_t L = static_cast<py::ssize_t>(g.size()), H = L ? static_cast<py::ssize_t>(g[0].size()) : 0;
  py::array_t<double> a({L, H});
  for (py::ssize_t l = 0; l < L; ++l) std::copy(g[l].begin(), g[l].end(), a.mutable_data(l, 0));
  return a;
}

py::dict eval_dict(const EvalResult& e) {
  py::dict d;
  d["loss"] = e.loss;
  d["token_acc"] = e.token_acc;
  d["exact_match"] = e.exact_match;
  if (e.ar_exact_match >= 0) d["ar_exact_match"] = e.ar_exact_match;
  d["tokens"] = e.tokens;
  d["sequences"] = e.sequences;
  return d;
}

py::object json_to_py(const json& j) { return py::module_::import("json").attr("loads")(j.dump()); }

// ---- settings by keyword (the CLI's flag table) ---------------------------------------------

// Sets one row of the flag table from a Python value; raises naming the keyword.
void set_setting(TrainFlagValues& v, const std::string& key, const py::handle& value) {
  const TrainSetting* s = find_train_setting(key);
  if (!s) throw py::type_error("unknown setting '" + key + "' (the names are the CLI's flags with _ for -, e.g. d_model)");
  auto check_range = [&](double x) {  // worded as the command line words it
    if (std::isnan(s->lo)) return;
    const std::string problem = range_problem(x, std::string(py::str(value)), s->lo, s->hi);
    if (!problem.empty()) throw py::value_error(key + ": " + problem);
  };
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (!py::isinstance<py::bool_>(value)) throw py::type_error(key + ": expected True or False");
          *field = value.cast<bool>();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!py::isinstance<py::str>(value)) throw py::type_error(key + ": expected a string");
          *field = value.cast<std::string>();
        } else if constexpr (std::is_floating_point_v<T>) {
          // any real number (NumPy scalars too), not text or a bool
          auto not_a_number = [&] { return py::type_error(key + ": expected a number, got " + std::string(py::str(value.get_type()))); };
          if (py::isinstance<py::str>(value) || py::isinstance<py::bool_>(value) || !PyNumber_Check(value.ptr())) throw not_a_number();
          const double x = PyFloat_AsDouble(value.ptr());
          if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            throw not_a_number();
          }
          check_range(x);
          *field = x;
        } else {
          // an integer (NumPy's too, anything with __index__), not a bool
          if (py::isinstance<py::bool_>(value) || !PyIndex_Check(value.ptr()))
            throw py::type_error(key + ": expected an integer, got " + std::string(py::str(value.get_type())));
          const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
          if (!i) throw py::error_already_set();
          int overflow = 0;
          const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
          const double x = overflow ? overflow * INFINITY : static_cast<double>(v);
          check_range(x);
          if (overflow || v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
            throw py::value_error(key + ": " + std::string(py::str(value)) + " is too large");
          *field = static_cast<T>(v);
        }
        if constexpr (std::is_same_v<T, std::string>) {
          if (!s->choices.empty() && std::find(s->choices.begin(), s->choices.end(), *field) == s->choices.end()) {
            std::string list;
            for (auto& c : s->choices) list += (list.empty() ? "" : ", ") + c;
            throw py::value_error(key + " must be one of " + list + ", got '" + *field + "'");
          }
        }
      },
      s->field(v));
}

// TrainArgs from keywords, as `headlab train` would resolve the same flags.
TrainArgs args_from_kwargs(const py::dict& kwargs, const std::function<bool(const std::string&)>& skip = {}) {
  TrainFlagValues v;
  std::set<std::string> given;
  for (auto& [k, val] : kwargs) {
    const std::string key = k.cast<std::string>();
    if (skip && skip(key)) continue;
    set_setting(v, key, val);
    given.insert(find_train_setting(key)->flag);
  }
  return resolve_train_flags(v, [&](const std::string& f) { return given.count(f) > 0; });
}

ModelConfig model_config_from_kwargs(const py::dict& kwargs) {
  py::dict flags;
  int64_t vocab = ModelConfig().vocab_size, max_len = ModelConfig().max_seq_len;
  for (auto& [k, val] : kwargs) {
    const std::string key = k.cast<std::string>();
    if (key == "vocab_size") {
      vocab = val.cast<int64_t>();
      continue;
    }
    if (key == "max_seq_len") {
      max_len = val.cast<int64_t>();
      continue;
    }
    const TrainSetting* s = find_train_setting(key);
    if (!s || (s->json_pointer.rfind("/model/", 0) != 0 && s->json_pointer.find("dropout") == std::string::npos))
      throw py::type_error("ModelConfig: unknown setting '" + key + "' (model settings: d_model, layers, heads, kv_heads, "
                           "d_head, d_ff, norm, activation, positions, attn_bias, mlp_bias, dropout, attn_dropout, "
                           "vocab_size, max_seq_len)");
    flags[k] = val;
  }
  ModelConfig c = args_from_kwargs(flags).model;
  c.vocab_size = vocab;
  c.max_seq_len = max_len;
  c.validate();
  return c;
}

// ---- hooks from Python callables -------------------------------------------------------------

void check_hook_name(const ModelConfig& cfg, const std::string& name) {
  for (auto& [n, shape] : hook_points(cfg))
    if (n == name) return;
  throw py::value_error("unknown hook point '" + name + "': headlab.hook_points(config) lists them");
}

// A Python callable kept by C++ (in hooks that the autograd graph holds): released with the GIL
// taken, since the graph may be freed by a backward that runs without it.
struct PyCallable {
  py::function fn;
  explicit PyCallable(py::function f) : fn(std::move(f)) {}
  ~PyCallable() {
    py::gil_scoped_acquire gil;
    fn = py::function();
  }
};
std::shared_ptr<PyCallable> keep(const py::function& f) { return std::make_shared<PyCallable>(f); }

// fn(activation, name) -> None or a replacement array of the same shape.
Hooks hooks_from(const ModelConfig& cfg, const std::vector<std::pair<std::string, py::function>>& fwd,
                 const std::vector<std::pair<std::string, py::function>>& bwd) {
  Hooks hooks;
  for (auto& [name, f] : fwd) {
    check_hook_name(cfg, name);
    hooks.add_forward(name, [fn = keep(f)](const Tensor& x, const std::string& n) -> Tensor {
      py::gil_scoped_acquire gil;
      py::object r;
      // An exception the hook raises (KeyboardInterrupt and SystemExit included) reaches the
      // caller as itself: error_already_set carries it through the C++ frames.
      r = fn->fn(view_of(x, /*writeable=*/false), n);
      if (r.is_none()) return Tensor();
      py::array a = py::array::ensure(r);
      if (!a) throw py::type_error("hook at " + n + ": return None or an array, got " + std::string(py::str(r.get_type())));
      Tensor t = tensor_from_array(a, "hook at " + n);
      if (t.shape() != x.shape())
        throw py::value_error("hook at " + n + ": the replacement has shape " + t.shape().str() + " but the activation is " +
                              x.shape().str());
      return t;
    });
  }
  for (auto& [name, f] : bwd) {
    check_hook_name(cfg, name);
    hooks.add_backward(name, [fn = keep(f)](const Tensor& g, const std::string& n) {
      py::gil_scoped_acquire gil;
      fn->fn(view_of(g.clone(), /*writeable=*/false), n);  // a copy: the gradient buffer is reused
    });
  }
  return hooks;
}

// The activation cache seen from Python: cache[name] is an array view.
struct PyCache {
  ActivationCache cache;
  py::array get(const std::string& name) const { return view_of(cache[name], false); }
  py::array grad(const std::string& name) const { return view_of(cache.grad(name), false); }
};

NameFilter filter_from(const py::object& names) {
  if (names.is_none()) return all_names();
  if (py::isinstance<py::str>(names)) return names_in({names.cast<std::string>()});
  if (py::isinstance<py::function>(names)) {
    return [f = keep(names)](const std::string& n) {
      py::gil_scoped_acquire gil;
      return f->fn(n).cast<bool>();
    };
  }
  return names_in(names.cast<std::vector<std::string>>());
}

// Ctrl-C (or any Python signal handler that raises) while C++ computes with the GIL released:
// Python notes the signal, and long work asks between steps or examples (PyErr_CheckSignals
// needs the GIL). The exception the handler raised is kept, to be raised as itself once the work
// has stopped cleanly; only the calling thread's work stops.
struct PendingSignal {
  std::optional<py::error_already_set> error;
  bool check() {  // with the GIL released
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    error.emplace();  // fetches (and clears) the handler's exception
    return true;
  }
  // KeyboardInterrupt says where the work stopped; another handler's exception stays as it was.
  [[noreturn]] void raise(const char* what) {
    if (error && !error->matches(PyExc_KeyboardInterrupt)) throw *error;
    PyErr_SetString(PyExc_KeyboardInterrupt, what);
    throw py::error_already_set();
  }
};

// Runs a long analysis without the GIL; Ctrl-C stops it between examples and raises
// KeyboardInterrupt (or the signal handler's own exception); the analysis writes nothing.
template <class F>
auto interruptible(F&& f) {
  PendingSignal pending;
  StopPoll poll([&pending] { return pending.check(); });
  clear_stop_on_this_thread();
  try {
    py::gil_scoped_release release;
    return f();
  } catch (const Stopped& e) {
    clear_stop_on_this_thread();
    pending.raise(e.what());
  }
}

// ---- Task and held-out data ---------------------------------------------------------------

struct PyTask {
  std::shared_ptr<Task> task;
};
struct PyData {  // held-out batches
  std::vector<Batch> batches;
};

TokenArrays token_arrays(const py::object& obj, const std::string& what) {
  TokenArrays t;
  if (py::isinstance<py::dict>(obj)) {
    py::dict d = obj;
    if (!d.contains("input_ids")) throw py::value_error(what + ": a dict of arrays needs 'input_ids' (N, T)");
    t.input_ids = ids_from(d["input_ids"], "input_ids");
    if (d.contains("targets")) t.targets = ids_from(d["targets"], "targets");
    if (d.contains("loss_mask")) {
      py::array m = py::array::ensure(d["loss_mask"]);
      if (!m) throw py::type_error(what + ": loss_mask must be an array");
      if (m.ndim() != 2 || m.shape(0) != t.input_ids.shape[0] || m.shape(1) != t.input_ids.shape[1])
        throw py::value_error(what + ": loss_mask has shape " + shape_text(m) + " but input_ids is (" +
                              std::to_string(t.input_ids.shape[0]) + ", " + std::to_string(t.input_ids.shape[1]) + ")");
      const char kind = m.dtype().kind();  // bool, integers or floats: 0 = not counted
      if (kind != 'b' && kind != 'i' && kind != 'u' && kind != 'f')
        throw py::type_error(what + ": loss_mask must be bool, integer or float (0 = not counted), got dtype " +
                             std::string(py::str(m.dtype())));
      check_copy_fits(m, 2 * sizeof(float), what + ": loss_mask");
      const auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(m);
      if (!f) throw py::type_error(what + ": cannot convert loss_mask of dtype " + std::string(py::str(m.dtype())) + " to float32");
      t.loss_mask.assign(f.data(), f.data() + f.size());
    }
  } else {
    t.input_ids = ids_from(obj, "input_ids");
  }
  return t;
}

// A task from keywords; data/eval_data may be arrays or dicts of arrays (tokens without a file).
std::unique_ptr<Task> task_from(TrainArgs& a, const py::object& data, const py::object& eval_data) {
  const bool arrays = !data.is_none() && !py::isinstance<py::str>(data);
  if (!data.is_none() && !arrays) a.task.data = data.cast<std::string>();
  if (!eval_data.is_none() && py::isinstance<py::str>(eval_data)) a.task.eval_data = eval_data.cast<std::string>();
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
};

py::dict run_trainer(Trainer& t, const py::object& on_step, const py::object& on_eval) {
  if (t.has_run()) throw py::value_error("Trainer: run() was already called; make a new Trainer (resume=True continues a run)");
  TrainObserver obs;
  PendingSignal pending;  // Ctrl-C noticed at a step: the trainer stops after that step's checkpoint
  // A callback that raises KeyboardInterrupt (Ctrl-C while it ran) stops the run the same way.
  auto call = [&](const py::object& fn, auto&&... args) {
    if (fn.is_none()) return;
    py::gil_scoped_acquire gil;
    try {
      fn(std::forward<decltype(args)>(args)...);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_KeyboardInterrupt)) throw;
      pending.error.emplace(std::move(e));
      request_stop_on_this_thread();
    }
  };
  obs.on_step = [&](int64_t step, int64_t total, float loss, double tps) { call(on_step, step, total, loss, tps); };
  obs.on_eval = [&](int64_t step, const EvalResult& e) {
    if (on_eval.is_none()) return;
    py::gil_scoped_acquire gil;
    py::dict d = eval_dict(e);
    call(on_eval, step, d);
  };
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
  d["final_eval"] = eval_dict(r.final_eval);
  d["steps"] = r.steps;
  d["wall_s"] = r.wall_s;
  d["train_s"] = r.train_s;
  d["params"] = r.params;
  d["skipped_steps"] = r.skipped_steps;
  d["first_step_99"] = r.first_step_99;
  py::list curve;
  for (auto& [s, e] : r.curve) {
    py::dict row = eval_dict(e);
    row["step"] = s;
    curve.append(row);
  }
  d["curve"] = curve;
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "headlab: a small C++ transformer lab for studying attention heads";

  // C++ errors carry their one-line message; bad input is ValueError.
  py::register_exception<Error>(m, "HeadlabError", PyExc_ValueError);
  py::register_exception<NonFiniteError>(m, "NonFiniteError", PyExc_FloatingPointError);

  // ---- tensors ------------------------------------------------------------------------------
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(), "float32 tensor; np.asarray(t) is a view of its memory")
      .def_buffer([](Tensor& t) -> py::buffer_info {
        std::vector<py::ssize_t> shape(t.shape().dims, t.shape().dims + t.ndim()), strides(t.ndim());
        py::ssize_t step = sizeof(float);
        for (int i = t.ndim() - 1; i >= 0; --i) strides[i] = step, step *= shape[i];
        return py::buffer_info(t.data(), sizeof(float), py::format_descriptor<float>::format(), t.ndim(), shape, strides);
      })
      .def_property_readonly("shape", [](const Tensor& t) {
        return py::tuple(py::cast(std::vector<int64_t>(t.shape().dims, t.shape().dims + t.ndim())));
      })
      .def_property_readonly("ndim", &Tensor::ndim)
      .def("numpy", [](const Tensor& t) { return view_of(t); }, "A view of the tensor's memory (no copy)")
      .def("item", &Tensor::item)
      .def_property("requires_grad", &Tensor::requires_grad, [](Tensor& t, bool on) {
        if (!t.is_leaf()) throw py::value_error("requires_grad can only be set on a leaf tensor (one no op made)");
        t.requires_grad_(on);
      })
      .def_property_readonly("grad", [](const Tensor& t) -> py::object {
        Tensor g = t.grad();
        return g.defined() ? py::cast(g) : py::none();
      })
      .def("backward", [](const Tensor& t) {
        if (!t.requires_grad()) throw py::value_error("backward(): the tensor does not require grad (no graph leads to it)");
        if (t.numel() != 1) throw py::value_error("backward(): needs a one-element tensor, got shape " + t.shape().str());
        py::gil_scoped_release release;
        t.backward();
      })
      .def("zero_grad", &Tensor::zero_grad)
      .def("retain_grad", &Tensor::retain_grad)
      .def("detach", &Tensor::detach)
      .def("clone", &Tensor::clone)
      .def("__repr__", [](const Tensor& t) { return "headlab.Tensor" + t.shape().str(); })
      .def("__add__", [](const Tensor& a, const Tensor& b) { return add(a, b); })
      .def("__sub__", [](const Tensor& a, const Tensor& b) { return sub(a, b); })
      .def("__mul__", [](const Tensor& a, const Tensor& b) { return mul(a, b); })
      .def("__mul__", [](const Tensor& a, float s) { return mul_scalar(a, s); })
      .def("__rmul__", [](const Tensor& a, float s) { return mul_scalar(a, s); })
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); })
      .def("sum", [](const Tensor& t) { return sum(t); })
      .def("mean", [](const Tensor& t) { return mean(t); });

  m.def("tensor", [](const py::array& a, bool requires_grad) {
        Tensor t = tensor_from_array(a, "headlab.tensor");
        if (requires_grad) t.requires_grad_();
        return t;
      },
      py::arg("array"), py::arg("requires_grad") = false,
      "A float32 copy of a float array (float64 is rounded to float32); never a view");
  m.def("cross_entropy", [](const Tensor& logits, const py::object& targets) {
    const Ids t = ids_from(targets, "targets");
    if (std::none_of(t.data.begin(), t.data.end(), [](int32_t v) { return v >= 0; }))
      throw py::value_error("cross_entropy: every target is -1 (not counted): the mean over no positions is undefined");
    return cross_entropy(logits, t);
  },
        py::arg("logits"), py::arg("targets"), "Mean cross-entropy of (B, T, V) logits over targets != -1");
  m.def("softmax", [](const Tensor& x, int axis) { return softmax(x, axis); }, py::arg("x"), py::arg("axis") = -1);
  m.def("grad_enabled", &grad_enabled);
  py::class_<NoGradGuard>(m, "_NoGradGuard").def(py::init<>());
  m.def("set_num_threads", &set_num_threads);
  m.def("num_threads", &num_threads);
  m.def("live_tensors", [] { return TensorImpl::live_count.load(); }, "Tensors alive now (for leak checks)");

  // ---- models ---------------------------------------------------------------------------------
  py::class_<ModelConfig>(m, "ModelConfig", "Model settings with the CLI's names and defaults")
      .def(py::init([](py::kwargs kw) { return model_config_from_kwargs(kw); }))
      .def_readonly("vocab_size", &ModelConfig::vocab_size)
      .def_readonly("d_model", &ModelConfig::d_model)
      .def_readonly("layers", &ModelConfig::n_layers)
      .def_readonly("heads", &ModelConfig::n_heads)
      .def_property_readonly("kv_heads", &ModelConfig::kv_heads)
      .def_property_readonly("d_head", &ModelConfig::head_dim)
      .def_readonly("d_ff", &ModelConfig::d_ff)
      .def_readonly("max_seq_len", &ModelConfig::max_seq_len)
      .def_property_readonly("norm", [](const ModelConfig& c) { return to_string(c.norm); })
      .def_property_readonly("activation", [](const ModelConfig& c) { return to_string(c.activation); })
      .def_property_readonly("positions", [](const ModelConfig& c) { return to_string(c.positions); })
      .def_readonly("dropout", &ModelConfig::dropout)
      .def_readonly("attn_dropout", &ModelConfig::attn_dropout)
      .def("to_dict", [](const ModelConfig& c) { return json_to_py(json::parse(c.to_json())); })
      .def("__repr__", [](const ModelConfig& c) { return "headlab.ModelConfig(" + c.to_json() + ")"; });

  m.def("hook_points", [](const ModelConfig& c) { return hook_points(c); }, "(name, shape) of every hook point");

  py::class_<PyCache>(m, "ActivationCache", "Activations by hook name (read-only array views) and their gradients")
      .def("__getitem__", &PyCache::get)
      .def("grad", &PyCache::grad)
      .def("__contains__", [](const PyCache& c, const std::string& n) { return c.cache.has(n); })
      .def("has_grad", [](const PyCache& c, const std::string& n) { return c.cache.has_grad(n); })
      .def("keys", [](const PyCache& c) { return c.cache.names(); })
      .def("__len__", [](const PyCache& c) { return c.cache.size(); })
      .def("__iter__", [](const PyCache& c) { return py::iter(py::cast(c.cache.names())); });

  py::class_<TransformerLM>(m, "TransformerLM")
      .def(py::init([](const ModelConfig& c, uint64_t seed) {
             c.validate();
             return std::make_unique<TransformerLM>(c, seed);
           }),
           py::arg("config"), py::arg("seed") = 0)
      .def_static("load", [](const std::string& path) { return load_model(path); }, "A model from a headlab checkpoint (safetensors)")
      .def("save", [](const TransformerLM& model, const std::string& path) { save_checkpoint(path, model); },
           "Writes a checkpoint the CLI reads (atomic)")
      .def("load_parameters", [](TransformerLM& model, const std::string& path) { load_parameters(model, read_safetensors(path)); })
      .def_readonly("config", &TransformerLM::cfg)
      .def("train", [](TransformerLM& model, bool on) { model.train(on); }, py::arg("on") = true)
      .def("eval", [](TransformerLM& model) { model.eval(); })
      .def("forward", [](TransformerLM& model, const py::object& ids) {
             const Ids x = ids_from(ids);
             py::gil_scoped_release release;
             return model.forward(x);
           }, py::arg("ids"), "ids (T) or (B, T) -> logits (B, T, vocab)")
      .def("__call__", [](TransformerLM& model, const py::object& ids) {
             const Ids x = ids_from(ids);
             py::gil_scoped_release release;
             return model.forward(x);
           })
      .def("loss", [](TransformerLM& model, const py::object& ids, const py::object& targets) {
             const Ids x = ids_from(ids), y = ids_from(targets, "targets");
             py::gil_scoped_release release;
             return cross_entropy(model.forward(x), y);
           }, py::arg("ids"), py::arg("targets"), "Mean cross-entropy over targets != -1 (a tensor; call backward())")
      .def("named_parameters", [](const TransformerLM& model) {
             py::dict d;
             for (auto& [name, t] : model.named_parameters()) d[py::str(name)] = t;
             return d;
           }, "name -> Tensor (headlab's parameter names; np.asarray gives a view)")
      .def("zero_grad", [](TransformerLM& model) { model.zero_grad(); })
      .def("head_weights", [](const TransformerLM& model, int layer, int head, bool grads) {
             if (layer < 0 || layer >= model.cfg.n_layers || head < 0 || head >= model.cfg.n_heads)
               throw py::index_error("head (" + std::to_string(layer) + ", " + std::to_string(head) + ") is outside " +
                                     std::to_string(model.cfg.n_layers) + " layers x " + std::to_string(model.cfg.n_heads) + " heads");
             const MultiHeadAttention& a = model.blocks[layer]->attn;
             const int64_t dh = model.cfg.head_dim();
             const int kv = head / (model.cfg.n_heads / model.cfg.kv_heads());
             auto w = [&](const Tensor& t) -> Tensor {
               if (!grads) return t;
               if (!t.grad().defined()) throw py::value_error("no gradient yet: run backward() first");
               return t.grad();
             };
             py::dict d;
             d["W_Q"] = view_of(head_rows(w(a.W_Q.weight), head, dh));
             d["W_K"] = view_of(head_rows(w(a.W_K.weight), kv, dh));
             d["W_V"] = view_of(head_rows(w(a.W_V.weight), kv, dh));
             d["W_O"] = view_of(head_cols(w(a.W_O.weight), head, dh));
             return d;
           }, py::arg("layer"), py::arg("head"), py::arg("grads") = false,
           "Copies of head's blocks: W_Q, W_K, W_V (d_head, d_model) and W_O (d_model, d_head); grads=True: of their gradients")
      .def("gates", [](TransformerLM& model, int layer) { return model.gates(layer); }, "Head gates of a layer (H): a view to set")
      .def("gate_values", [](const TransformerLM& model) {
             HeadGrid g;
             for (auto& row : model.gate_values()) g.emplace_back(row.begin(), row.end());
             return grid_array(g);
           })
      .def("run_with_cache", [](TransformerLM& model, const py::object& ids, const py::object& names, bool with_grads) {
             const Ids x = ids_from(ids);
             NameFilter f = filter_from(names);
             std::pair<Tensor, ActivationCache> r;
             {
               py::gil_scoped_release release;
               r = model.run_with_cache(x, f, with_grads);
             }
             return py::make_tuple(r.first, PyCache{r.second});
           }, py::arg("ids"), py::arg("names") = py::none(), py::arg("with_grads") = false,
           "(logits, cache): cache[name] for every hook name in `names` (None = all, a list, or a predicate)")
      .def("run_with_hooks", [](TransformerLM& model, const py::object& ids,
                                const std::vector<std::pair<std::string, py::function>>& fwd_hooks,
                                const std::vector<std::pair<std::string, py::function>>& bwd_hooks) {
             const Ids x = ids_from(ids);
             ForwardOptions opt;
             const Hooks hooks = hooks_from(model.cfg, fwd_hooks, bwd_hooks);
             opt.hooks = &hooks;
             py::gil_scoped_release release;
             return model.forward(x, opt);
           }, py::arg("ids"), py::arg("fwd_hooks") = std::vector<std::pair<std::string, py::function>>{},
           py::arg("bwd_hooks") = std::vector<std::pair<std::string, py::function>>{},
           "logits with hooks: fn(activation, name) may return a replacement; backward hooks fn(grad, name) run during backward()")
      .def_property_readonly("num_parameters", &TransformerLM::num_parameters);

  // ---- tasks --------------------------------------------------------------------------------
  py::class_<PyData>(m, "Batches", "Held-out batches of a task")
      .def("__len__", [](const PyData& d) { return d.batches.size(); })
      .def("__getitem__", [](const PyData& d, size_t i) {
        if (i >= d.batches.size()) throw py::index_error("batch " + std::to_string(i));
        return batch_dict(d.batches[i]);
      });
  py::class_<PyTask>(m, "Task")
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
      .def_property_readonly("name", [](const PyTask& t) { return t.task->config().name; })
      .def_property_readonly("vocab_size", [](const PyTask& t) { return t.task->vocab_size(); })
      .def_property_readonly("seq_len", [](const PyTask& t) { return t.task->seq_len(); })
      .def_property_readonly("rows_are_answers", [](const PyTask& t) { return t.task->rows_are_answers(); },
                             "Whether a row's targets form one answer, so exact match means something (False for "
                             "language modelling: text, token data without targets or loss_mask)")
      .def("held_out", [](const PyTask& t, int n, uint64_t seed, int batch) { return PyData{t.task->held_out(n, seed, batch)}; },
           py::arg("n") = 1000, py::arg("seed") = 1234, py::arg("batch") = 128)
      .def("sample", [](const PyTask& t, int batch, uint64_t seed) {
             Rng rng(seed);
             return batch_dict(t.task->sample(batch, rng));
           }, py::arg("batch") = 64, py::arg("seed") = 0, "A training-style batch: input_ids, targets, prompt_len")
      .def("token_text", [](const PyTask& t, int32_t id) { return t.task->token_text(id); });

  // ---- training -------------------------------------------------------------------------------
  py::class_<PyTrainer>(m, "_Trainer")
      .def(py::init([](py::kwargs kw) {
        std::set<std::string> extra = {"data", "eval_data", "out", "init", "resume"};
        TrainArgs a = args_from_kwargs(kw, [&](const std::string& k) { return extra.count(k) > 0; });
        if (kw.contains("out") && !kw["out"].is_none()) a.out = kw["out"].cast<std::string>();
        if (kw.contains("init") && !kw["init"].is_none()) a.init = kw["init"].cast<std::string>();
        if (kw.contains("resume")) a.resume = kw["resume"].cast<bool>();
        std::unique_ptr<Task> task = task_from(a, kw.contains("data") ? py::object(kw["data"]) : py::object(py::none()),
                                               kw.contains("eval_data") ? py::object(kw["eval_data"]) : py::object(py::none()));
        if (a.resume) {
          std::set<std::string> given;
          for (auto& [k, v] : kw)
            if (const TrainSetting* s = find_train_setting(k.cast<std::string>())) given.insert(s->flag);
          a = resume_args(a.out, a, [&](const std::string& f) { return given.count(f) > 0; });
        }
        PyTrainer t;
        py::gil_scoped_release release;
        t.trainer = std::make_unique<Trainer>(a, std::move(task));
        return t;
      }))
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
      .def("evaluate", [](PyTrainer& t, bool ar) {
        EvalResult e;
        {
          py::gil_scoped_release release;
          e = t.trainer->evaluate_held_out(ar);
        }
        return eval_dict(e);
      }, py::arg("autoregressive") = false)
      .def("save", [](PyTrainer& t, const std::string& path) {
        save_checkpoint(path, t.trainer->model(), {}, {{"task", t.trainer->args().task.to_json()}});
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

  // ---- analyses -------------------------------------------------------------------------------
  m.def("evaluate", [](TransformerLM& model, const PyTask& task, const PyData& data, bool ar) {
    py::gil_scoped_release release;
    const EvalResult e = evaluate(model, *task.task, data.batches, ar);
    py::gil_scoped_acquire gil;
    return eval_dict(e);
  }, py::arg("model"), py::arg("task"), py::arg("data"), py::arg("autoregressive") = false);
  m.def("head_importance", [](TransformerLM& model, const PyData& data, bool normalize) {
    HeadGrid g;
    {
      py::gil_scoped_release release;
      g = head_importance(model, data.batches, normalize);
    }
    return grid_array(g);
  }, py::arg("model"), py::arg("data"), py::arg("normalize") = false, "Michel et al. importance (L, H)");
  m.def("single_head_ablation", [](TransformerLM& model, const PyTask& task, const PyData& data) {
    AblationResult r;
    {
      py::gil_scoped_release release;
      r = single_head_ablation(model, *task.task, data.batches);
    }
    py::dict d;
    d["d_loss"] = grid_array(r.d_loss);
    d["d_acc"] = grid_array(r.d_acc);
    d["d_loss_mean"] = grid_array(r.d_loss_mean);
    d["d_acc_mean"] = grid_array(r.d_acc_mean);
    d["base"] = eval_dict(r.base);
    return d;
  }, "Change in held-out loss/accuracy when each head alone is zero- or mean-ablated: arrays (L, H)");
  m.def("attention_statistics", [](TransformerLM& model, const PyData& data) {
    HeadStats s;
    {
      py::gil_scoped_release release;
      s = attention_statistics(model, data.batches);
    }
    py::dict d;
    d["entropy"] = grid_array(s.entropy);
    d["entropy_norm"] = grid_array(s.entropy_norm);
    d["confidence"] = grid_array(s.confidence);
    d["argmax_distance"] = grid_array(s.argmax_distance);
    return d;
  });
  m.def("prune_curve", [](const TransformerLM& model, const PyTask& task, const PyData& data, const std::string& order,
                          double step_fraction, int min_per_layer, bool recompute, uint64_t seed) {
    std::unique_ptr<TransformerLM> copy = std::make_unique<TransformerLM>(model.cfg, 0);
    auto to = copy->named_parameters();
    const auto from = model.named_parameters();
    for (size_t i = 0; i < to.size(); ++i) to[i].second.copy_from(from[i].second);
    for (int l = 0; l < model.cfg.n_layers; ++l) copy->gates(l).copy_from(const_cast<TransformerLM&>(model).gates(l));
    std::function<HeadGrid(TransformerLM&)> rank;
    if (order == "importance")
      rank = [&](TransformerLM& m) { return head_importance(m, data.batches, false); };
    else if (order == "ablation")
      rank = [&](TransformerLM& m) { return single_head_ablation(m, *task.task, data.batches).d_loss; };
    else if (order == "random")
      rank = [&](TransformerLM&) { return random_ranking(model.cfg.n_layers, model.cfg.n_heads, seed); };
    else
      throw py::value_error("order must be importance, ablation or random, got '" + order + "'");
    PruneOptions o;
    o.step_fraction = step_fraction;
    o.min_per_layer = min_per_layer;
    o.recompute = recompute;
    std::vector<PruneStep> steps;
    {
      py::gil_scoped_release release;
      steps = prune_curve(*copy, *task.task, data.batches, rank, o);
    }
    py::dict d;
    std::vector<double> frac, loss, acc;
    py::list removed;
    for (const PruneStep& s : steps) {
      frac.push_back(s.fraction), loss.push_back(s.eval.loss), acc.push_back(s.eval.token_acc);
      removed.append(py::cast(s.removed));
    }
    d["fraction"] = py::array(py::cast(frac));
    d["loss"] = py::array(py::cast(loss));
    d["token_acc"] = py::array(py::cast(acc));
    d["removed"] = removed;
    return d;
  }, py::arg("model"), py::arg("task"), py::arg("data"), py::arg("order") = "importance", py::arg("step_fraction") = 0.1,
     py::arg("min_per_layer") = 0, py::arg("recompute") = false, py::arg("seed") = 1000,
     "Accuracy as heads are removed in an order (on a copy; the model is unchanged)");
  m.def("head_gradient_norms", [](const TransformerLM& model) {
    const auto rows = head_gradient_norms(model, 0);
    const int L = model.cfg.n_layers, H = model.cfg.n_heads;
    py::dict d;
    for (const char* mat : {"W_Q", "W_K", "W_V", "W_O"}) {
      HeadGrid g(L), w(L);
      for (const HeadNormRow& r : rows)
        if (r.matrix == mat) g[r.layer].push_back(r.grad_norm), w[r.layer].push_back(r.weight_norm);
      d[py::str(std::string("grad_") + mat)] = grid_array(g);
      d[py::str(std::string("weight_") + mat)] = grid_array(w);
    }
    (void)H;
    return d;
  }, "Gradient atlas of the current gradients: per-head Frobenius norms (L, H or H_kv) of grads and weights");
  m.def("repeated_random_tokens", [](int n, int k, int vocab, uint64_t seed) { return PyData{repeated_random_tokens(n, k, vocab, seed)}; },
        py::arg("n"), py::arg("k"), py::arg("vocab"), py::arg("seed") = 1234,
        "The detectors' probe: n sequences [r_1..r_k, r_1..r_k] of uniform random tokens");
  m.def("detect_heads", [](TransformerLM& model, const PyData& data, const std::string& kind, bool exclude_bos,
                           bool exclude_current_token) {
    const Detector d = parse_detector(kind);
    const HeadGrid g = interruptible([&] { return detect_heads(model, data.batches, d, {exclude_bos, exclude_current_token}); });
    return grid_array(g);
  }, py::arg("model"), py::arg("data"), py::arg("kind") = "induction", py::arg("exclude_bos") = false,
     py::arg("exclude_current_token") = false,
     "TransformerLens-style detector scores (L, H): previous_token, duplicate_token or induction");
  m.def("activation_patching", [](TransformerLM& model, const PyTask& task, const PyData& data, uint64_t seed) {
    if (data.batches.empty()) throw py::value_error("activation_patching: no data");
    check_fits_in_memory(patching_memory_bytes(model.cfg, data.batches[0].size(), data.batches[0].inputs.shape[1]),
                         "activation_patching: data of " + std::to_string(data.batches[0].size()) + " rows");
    const PatchingInputs in = corrupt_one_symbol(data.batches[0], task.task->symbols(), seed);
    const PatchingResult r = interruptible([&] { return activation_patching(model, in); });
    py::dict d;
    d["z_exact"] = grid_array(r.z_exact);
    d["z_attribution"] = grid_array(r.z_attribution);
    d["resid_exact"] = grid_array(r.resid_exact);
    d["resid_attribution"] = grid_array(r.resid_attribution);
    d["clean_metric"] = r.clean_metric;
    d["corrupted_metric"] = r.corrupted_metric;
    d["z_correlation"] = r.z_correlation;
    d["resid_correlation"] = r.resid_correlation;
    d["clean_ids"] = ids_to_array(in.clean);
    d["corrupted_ids"] = ids_to_array(in.corrupted);
    return d;
  }, py::arg("model"), py::arg("task"), py::arg("data"), py::arg("seed") = 1234,
     "Patching per head (hook_z, (L, H)) and per residual position ((L, T)), exact and attribution, normalised clean=1, corrupted=0");
  m.def("composition_scores", [](const TransformerLM& model, int layer_a, int layer_b) {
    const CompositionScores c = composition_scores(model, layer_a, layer_b);
    py::dict d;
    d["q"] = grid_array(c.q);
    d["k"] = grid_array(c.k);
    d["v"] = grid_array(c.v);
    return d;
  }, py::arg("model"), py::arg("layer_a"), py::arg("layer_b"), "Q/K/V composition [head of layer_a][head of layer_b]");
  m.def("qk_singular_values", [](const TransformerLM& model, int layer, int head) { return qk_circuit_singular_values(model, layer, head); });
  m.def("ov_singular_values", [](const TransformerLM& model, int layer, int head) { return ov_circuit_singular_values(model, layer, head); });
}
