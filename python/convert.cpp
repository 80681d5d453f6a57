// Conversions between Python objects and headlab's (arrays, token ids, results) and settings by
// keyword, resolved through the CLI's flag table; shared by the files that bind each area.
#include <cmath>
#include <limits>
#include <set>

#include "bindings.h"
#include "lib/fileutil.h"
#include "lib/threads.h"
#include "train/settings.h"

namespace hl::bindings {

// ---- conversions ---------------------------------------------------------------------------

std::string shape_text(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

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

Ids ids_from(const py::object& obj, const char* what) {
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

py::array view_of(const Tensor& t, bool writeable) {
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

namespace {

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

}  // namespace

TrainArgs args_from_kwargs(const py::dict& kwargs, const std::function<bool(const std::string&)>& skip,
                           bool task_training_defaults) {
  TrainFlagValues v;
  std::set<std::string> given;
  for (auto& [k, val] : kwargs) {
    const std::string key = k.cast<std::string>();
    if (skip && skip(key)) continue;
    set_setting(v, key, val);
    given.insert(find_train_setting(key)->flag);
  }
  return resolve_train_flags(v, [&](const std::string& f) { return given.count(f) > 0; }, task_training_defaults);
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

int threads_for_this_machine(int most) {
  const ThreadChoice c = choose_threads(most);
  if (!c.notice.empty()) {
    const std::string text = c.notice + " (threads=" + std::to_string(most) + " to use them anyway)";
    if (PyErr_WarnEx(PyExc_RuntimeWarning, text.c_str(), 1) != 0) throw py::error_already_set();  // warnings as errors
  }
  return c.threads;
}

}  // namespace hl::bindings
