// Internal to the Python module (python/*.cpp): the helpers shared by the files that bind each
// area, and one bind_<area>(m) per area, called by module.cpp in order.
#pragma once
// Every file of the module sees the same casters (pybind11 requires it).
#include <pybind11/complex.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "analysis/evaluate.h"
#include "analysis/heads.h"
#include "datasets/task.h"
#include "lib/stop.h"
#include "models/transformer.h"
#include "train/trainer.h"

namespace py = pybind11;

namespace hl::bindings {

using json = nlohmann::json;

// ---- conversions (convert.cpp) ---------------------------------------------------------------

std::string shape_text(const py::array& a);
// Refuses an array whose copy (`bytes_per_element` each) would not fit in memory: a broadcast
// view can describe 2^40 elements in a few bytes.
void check_copy_fits(const py::array& a, double bytes_per_element, const std::string& what);
// A float32 copy of any real array (float64 is rounded); other dtypes raise TypeError.
Tensor tensor_from_array(const py::array& a, const std::string& what);
// Token ids from a list or an integer array, (T) or (B, T); int32 range checked.
Ids ids_from(const py::object& obj, const char* what = "ids");
py::array ids_to_array(const Ids& ids);
// TransformerLens's attention_mask (B, T) or (T) of integers or bools, 1 = a token, 0 = padding, as
// the library's key padding (B, T), 1 = padding; the ids' shape, 0/1 and a token in every row
// checked, `what` leading the messages. Undefined for None.
Tensor key_padding_from(const py::object& mask, const Ids& ids, const char* what = "attention_mask");
// Targets of a mean loss: at least one counted (!= -1), else ValueError naming `who` (a mean
// over no positions is undefined, and 0.0 would look like a perfect model).
Ids counted_targets_from(const py::object& targets, const char* who);
// A NumPy view of t's storage; the array keeps the tensor alive.
py::array view_of(const Tensor& t, bool writeable = true);
py::array grid_array(const HeadGrid& g);
// A result object of headlab/results.py (EdgeResult, ...) with these fields: attributes, a repr
// that names them, to_dict(), and read as the dict earlier versions returned.
py::object typed_result(const char* type, const py::dict& fields);
py::dict eval_fields(const EvalResult& e);
py::object eval_result(const EvalResult& e);  // an EvalResult
py::object json_to_py(const json& j);

// ---- paths and typed arguments (convert.cpp) ---------------------------------------------------

// A file or directory name from Python: a str or any os.PathLike (pathlib.Path). Every function
// of the module that takes a path takes a PathArg (its caster is below).
struct PathArg {
  std::string path;
};
bool is_path_like(const py::handle& obj);
// The path obj names; a TypeError naming `what` when obj is not a str or os.PathLike.
std::string path_from(const py::handle& obj, const std::string& what);
// obj.cast<T>() whose failure says which argument and what it takes ("gate: expected a list of
// str such as ['0.1=0'], got str"), not pybind's "Unable to cast Python instance to C++ type".
[[noreturn]] void wrong_argument_type(const py::handle& obj, const std::string& what, const std::string& expected);
template <class T>
T cast_arg(const py::handle& obj, const std::string& what, const std::string& expected) {
  try {
    return obj.cast<T>();
  } catch (const py::cast_error&) {
    wrong_argument_type(obj, what, expected);
  }
}

// ---- settings by keyword (the CLI's flag table; convert.cpp) ---------------------------------

// One keyword's value as a setting of type T (bool, text, a number, a list of int or str), with a
// TypeError naming the keyword and what it takes, and a number's range [lo, hi] worded as the
// command line words it (lo NaN: none). The one converter of the settings table's keywords and
// the run plan's (hl.Trainer, hl.Task, hl.ModelConfig).
template <class T>
T setting_value(const py::handle& value, const std::string& key, double lo = NAN, double hi = NAN);

// TrainArgs from keywords, as `headlab train` would resolve the same flags.
// task_training_defaults: also the task's training defaults (the Trainer), see resolve_train_flags.
TrainArgs args_from_kwargs(const py::dict& kwargs, const std::function<bool(const std::string&)>& skip = {},
                           bool task_training_defaults = false);
// The model's settings by their Python names (TransformerLens's where it has one); `flag`: the
// CLI's name, also taken by ModelConfig(...) ("" = the same). convert.cpp.
struct ConfigField {
  const char* name;
  const char* flag;
  const char* doc;
  py::object (*get)(const ModelConfig&);
};
const std::vector<ConfigField>& config_fields();
// TransformerLens's names of settings headlab spells otherwise (act_fn: activation, with TL's
// values), read as cfg.act_fn and taken by ModelConfig(...) and hl.Trainer(...) as the setting
// they name; not in to_dict (one name per field there).
struct TlSpelling {
  const char* tl;
  const char* native;
  const char* doc;
  std::vector<std::pair<std::string, std::string>> values;  // (TransformerLens's, headlab's)
};
const std::vector<TlSpelling>& tl_spellings();
py::object tl_value(const TlSpelling& s, const std::string& native);  // cfg.act_fn from the activation
// (headlab's name, value) of a keyword given by its TransformerLens name; nullopt for other names.
// Raises naming the keyword (`who` leads the message) on a value neither spells.
std::optional<std::pair<std::string, py::object>> native_setting(const std::string& key, const py::handle& value,
                                                                  const std::string& who);
py::dict config_dict(const ModelConfig& c);  // {name: value} in the table's order
ModelConfig model_config_from_kwargs(const py::dict& kwargs);
// A setting that is a positive integer (d_vocab, n_ctx); raises naming `what`.
int64_t positive_setting(const std::string& what, const py::handle& v);
// The busy-machine rule (lib/threads.h) for work that would run on `most` threads when the caller
// chose no count: the count to use, the notice said unless quiet as hl.Trainer says it
// (headlab.progress.notice: stderr, or the cell's output in a notebook), in the CLI's words.
int threads_for_this_machine(int most, bool quiet = false);

// ---- Ctrl-C during long C++ work ---------------------------------------------------------------

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

// ---- Task and held-out data (bound in training.cpp, taken by analyses.cpp) ---------------------

struct PyTask {
  std::shared_ptr<Task> task;
};
struct PyData {  // held-out batches
  std::vector<Batch> batches;
};
// hl.Batches(input_ids, targets, loss_mask, batch_size, prompt_len), input_ids possibly a dict of
// those arrays: the one conversion of a user's arrays into batches (training.cpp).
PyData batches_from(const py::object& input_ids, const py::object& targets = py::none(),
                    const py::object& loss_mask = py::none(), const py::object& batch_size = py::none(),
                    const py::object& prompt_len = py::none(), const py::object& attention_mask = py::none());
// The data an analysis reads: a Batches, or what hl.Batches takes (an input_ids array or a dict
// of arrays), converted by that one constructor; checked against the model's vocabulary.
struct DataArg {
  std::optional<PyData> owned;  // converted from arrays
  const PyData* given = nullptr;
  const std::vector<Batch>& batches() const { return owned ? owned->batches : given->batches; }
};
DataArg data_arg(const py::object& obj, const TransformerLM& model, const std::string& fn);

// ---- the areas, bound in this order by module.cpp ------------------------------------------------

void bind_tensors(py::module_& m);   // tensors.cpp
void bind_models(py::module_& m);    // models.cpp: models, hooks and the activation cache
void bind_tasks(py::module_& m);     // training.cpp
void bind_training(py::module_& m);  // training.cpp
void bind_analyses(py::module_& m);  // analyses.cpp
void bind_views(py::module_& m);     // views.cpp: the pages of the inline views
void bind_tokenizer(py::module_& m);  // tokenizer.cpp: GPT-2's BPE tokenizer
void bind_features(py::module_& m);   // features.cpp: sparse autoencoders
void bind_precision(py::module_& m);  // precision.cpp: hl.precision("bf16"), a with block
void bind_feature_study(py::module_& m);  // feature_study.cpp: SAE features attributed, top examples, the feature view

}  // namespace hl::bindings

namespace pybind11::detail {
template <>
struct type_caster<hl::bindings::PathArg> {
  PYBIND11_TYPE_CASTER(hl::bindings::PathArg, const_name("str | os.PathLike"));
  bool load(handle src, bool) {
    if (!hl::bindings::is_path_like(src)) return false;  // pybind then lists the types it takes
    value.path = hl::bindings::path_from(src, "path");
    return true;
  }
  static handle cast(const hl::bindings::PathArg& p, return_value_policy, handle) { return str(p.path).release(); }
};
}  // namespace pybind11::detail
