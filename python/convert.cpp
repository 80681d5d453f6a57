// Conversions between Python objects and headlab's (arrays, token ids, results) and settings by
// keyword, resolved through the CLI's flag table; shared by the files that bind each area.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include "bindings.h"
#include "lib/fileutil.h"
#include "lib/threads.h"
#include "train/settings.h"

namespace hl::bindings {

// ---- conversions ---------------------------------------------------------------------------

bool is_path_like(const py::handle& obj) { return py::isinstance<py::str>(obj) || py::hasattr(obj, "__fspath__"); }

void wrong_argument_type(const py::handle& obj, const std::string& what, const std::string& expected) {
  throw py::type_error(what + ": expected " + expected + ", got " + Py_TYPE(obj.ptr())->tp_name);
}

std::string path_from(const py::handle& obj, const std::string& what) {
  if (!is_path_like(obj)) wrong_argument_type(obj, what, "a path (str or os.PathLike)");
  const py::object name = py::module_::import("os").attr("fspath")(obj);
  // headlab records paths in JSON, which holds text: a bytes path is refused
  if (!py::isinstance<py::str>(name)) wrong_argument_type(name, what, "a path as text (str), not bytes");
  return name.cast<std::string>();
}

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

Tensor key_padding_from(const py::object& mask, const Ids& ids, const char* what) {
  if (mask.is_none()) return Tensor();
  py::array a = py::array::ensure(mask);
  if (!a || (a.dtype().kind() != 'i' && a.dtype().kind() != 'u' && a.dtype().kind() != 'b'))
    throw py::type_error(std::string(what) + ": expected an integer or bool array (1 = token, 0 = padding)");
  if (a.ndim() == 1) a = a.reshape({py::ssize_t(1), a.shape(0)});
  const int64_t B = ids.shape[0], T = ids.shape[1];
  if (a.ndim() != 2 || a.shape(0) != B || a.shape(1) != T)
    throw py::value_error(std::string(what) + ": shape " + shape_text(a) + " must be the ids' (" + std::to_string(B) + ", " +
                          std::to_string(T) + ")");
  const auto v = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  Tensor pad = Tensor::zeros({B, T});
  for (int64_t b = 0; b < B; ++b) {
    bool any = false;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t m = v.data()[b * T + t];
      if (m != 0 && m != 1)
        throw py::value_error(std::string(what) + ": values are 1 (token) or 0 (padding), got " + std::to_string(m));
      pad.data()[b * T + t] = m == 0 ? 1.f : 0.f;
      any |= m == 1;
    }
    if (!any) throw py::value_error(std::string(what) + ": row " + std::to_string(b) + " has no token (every entry is 0)");
  }
  return pad;
}

Ids ids_from(const py::object& obj, const char* what) {
  // rows of different lengths (a ragged list) make no array: say how to run them
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    std::vector<size_t> lens;
    for (const py::handle& row : obj)
      if (py::isinstance<py::list>(row) || py::isinstance<py::tuple>(row) || py::isinstance<py::array>(row)) lens.push_back(py::len(row));
    if (lens.size() > 1 && std::any_of(lens.begin(), lens.end(), [&](size_t n) { return n != lens[0]; })) {
      std::string l;
      for (size_t n : lens) l += (l.empty() ? "" : ", ") + std::to_string(n);
      throw py::value_error(std::string(what) + ": the rows have different lengths (" + l + "): pad them to one length and " +
                            "pass attention_mask (1 = token, 0 = padding), e.g. ids, mask = model.to_tokens(texts, " +
                            "padding_side='right')");
    }
  }
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

Ids counted_targets_from(const py::object& targets, const char* who) {
  const Ids t = ids_from(targets, "targets");
  if (std::none_of(t.data.begin(), t.data.end(), [](int32_t v) { return v >= 0; }))
    throw py::value_error(std::string(who) + ": every target is -1 (not counted): the mean over no positions is undefined");
  return t;
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

py::object typed_result(const char* type, const py::dict& fields) {
  return py::module_::import("headlab.results").attr(type)(**fields);
}

py::dict eval_fields(const EvalResult& e) {
  py::dict d;
  d["loss"] = e.loss;
  d["token_acc"] = e.token_acc;
  d["exact_match"] = e.exact_match;
  if (e.ar_exact_match >= 0) d["ar_exact_match"] = e.ar_exact_match;
  d["tokens"] = e.tokens;
  d["sequences"] = e.sequences;
  return d;
}

py::object eval_result(const EvalResult& e) { return typed_result("EvalResult", eval_fields(e)); }

py::object json_to_py(const json& j) { return py::module_::import("json").attr("loads")(j.dump()); }

// ---- settings by keyword (the CLI's flag table) ---------------------------------------------

// ---- one keyword's value as its setting's type ----------------------------------------------

namespace {
// Worded as the command line words it; lo NaN: no range.
void check_setting_range(double x, const py::handle& value, const std::string& key, double lo, double hi) {
  if (std::isnan(lo)) return;
  const std::string problem = range_problem(x, std::string(py::str(value)), lo, hi);
  if (!problem.empty()) throw py::value_error(key + ": " + problem);
}
}  // namespace

template <class T>
T setting_value(const py::handle& value, const std::string& key, double lo, double hi) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!py::isinstance<py::bool_>(value)) throw py::type_error(key + ": expected True or False");
    return value.cast<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!py::isinstance<py::str>(value)) wrong_argument_type(value, key, "a string");
    return value.cast<std::string>();
  } else if constexpr (std::is_floating_point_v<T>) {
    // any real number (NumPy scalars too), not text or a bool
    if (py::isinstance<py::str>(value) || py::isinstance<py::bool_>(value) || !PyNumber_Check(value.ptr()))
      wrong_argument_type(value, key, "a number");
    const double x = PyFloat_AsDouble(value.ptr());
    if (x == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      wrong_argument_type(value, key, "a number");
    }
    check_setting_range(x, value, key, lo, hi);
    return static_cast<T>(x);
  } else if constexpr (std::is_integral_v<T>) {
    // an integer (NumPy's too, anything with __index__), not a bool
    if (py::isinstance<py::bool_>(value) || !PyIndex_Check(value.ptr())) wrong_argument_type(value, key, "an integer");
    const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    check_setting_range(overflow ? overflow * INFINITY : static_cast<double>(v), value, key, lo, hi);
    if (overflow || v < static_cast<long long>(std::numeric_limits<T>::min()) ||
        (v > 0 && static_cast<unsigned long long>(v) > static_cast<unsigned long long>(std::numeric_limits<T>::max())))
      throw py::value_error(key + ": " + std::string(py::str(value)) + " is too large");
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return cast_arg<T>(value, key, "a list of int such as [100, 200]");
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>);
    return cast_arg<T>(value, key, "a list of str such as ['" + std::string(key == "gate" ? "0.1=0" : "0.1") + "']");
  }
}
template bool setting_value<bool>(const py::handle&, const std::string&, double, double);
template int64_t setting_value<int64_t>(const py::handle&, const std::string&, double, double);
template std::vector<int64_t> setting_value<std::vector<int64_t>>(const py::handle&, const std::string&, double, double);
template std::vector<std::string> setting_value<std::vector<std::string>>(const py::handle&, const std::string&, double, double);

const std::vector<TlSpelling>& tl_spellings() {
  // (TransformerLens's value, headlab's): the first pair of a headlab value is how it reads
  static const std::vector<TlSpelling> spellings = {
      {"act_fn", "activation", "TransformerLens's activation name (TL: gelu = erf, gelu_new = tanh)",
       {{"gelu", "gelu_erf"}, {"gelu_new", "gelu_tanh"}, {"gelu_fast", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"},
        {"relu", "relu"}, {"silu", "silu"}, {"relu2", "relu2"}}},
      {"normalization_type", "normalization", "TransformerLens's norm name: LN or RMS (Gemma's 1 + w reads as RMS)",
       {{"LN", "layernorm"}, {"RMS", "rmsnorm"}, {"RMS", "rmsnorm_1p"}}},
      {"positional_embedding_type", "positions", "TransformerLens's positions: standard (learned), sinusoidal or rotary",
       {{"standard", "learned"}, {"sinusoidal", "sinusoidal"}, {"rotary", "rotary"}, {"none", "none"}}},
      {"original_architecture", "arch", "The Hugging Face class of the --arch preset (None: none)",
       {{"GPT2LMHeadModel", "gpt2"}, {"LlamaForCausalLM", "llama"}, {"GPTNeoXForCausalLM", "neox"},
        {"Gemma2ForCausalLM", "gemma2"}}},
  };
  return spellings;
}

py::object tl_value(const TlSpelling& s, const std::string& native) {
  for (const auto& [tl, h] : s.values)
    if (h == native) return py::str(tl);
  if (native.empty()) return py::none();  // arch '' : no preset
  return py::str(native);                 // headlab's own (relu2, none): TransformerLens has no name for it
}

std::optional<std::pair<std::string, py::object>> native_setting(const std::string& key, const py::handle& value,
                                                                  const std::string& who) {
  for (const TlSpelling& s : tl_spellings()) {
    if (key != s.tl) continue;
    const std::string native = s.native;
    if (value.is_none() && native == "arch") return std::make_pair(native, py::object(py::str("")));
    if (value.is_none() && native == "normalization")
      throw py::value_error(who + key + ": None (no norm) is not in headlab: give 'LN' or 'RMS'");
    if (!py::isinstance<py::str>(value))
      throw py::type_error(who + key + ": expected a string, got " + std::string(py::str(value.get_type().attr("__name__"))));
    const std::string v = value.cast<std::string>();
    if (v == "LNPre" || v == "RMSPre")
      throw py::value_error(who + key + ": '" + v + "' (a norm whose weights are folded into the next layer) is not in "
                            "headlab: give 'LN' or 'RMS'");
    std::string names;
    for (const auto& [tl, h] : s.values) {
      if (v == tl) return std::make_pair(native, py::object(py::str(h)));
      if (names.find("'" + tl + "'") == std::string::npos) names += std::string(names.empty() ? "" : ", ") + "'" + tl + "'";
    }
    throw py::value_error(who + key + " must be one of " + names + ", got '" + v + "'");
  }
  return std::nullopt;
}

namespace {

// Sets one row of the flag table from a Python value; raises naming the keyword.
void set_setting(TrainFlagValues& v, const std::string& key, const py::handle& value) {
  const TrainSetting* s = find_train_setting(key);
  if (!s) throw py::type_error("unknown setting '" + key + "' (the names are the CLI's flags with _ for -, e.g. d_model, or ModelConfig's, e.g. n_heads)");
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        *field = setting_value<T>(value, key, s->lo, s->hi);
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
    std::string key = k.cast<std::string>();
    if (skip && skip(key)) continue;
    // a model setting under TransformerLens's name (n_heads) is the one under its flag's (heads)
    if (!find_train_setting(key))
      for (const ConfigField& f : config_fields())
        if (key == f.name && *f.flag && find_train_setting(f.flag)) key = f.flag;
    py::object value = py::reinterpret_borrow<py::object>(val);
    if (auto native = native_setting(key, val, "")) std::tie(key, value) = *native;  // act_fn='gelu': activation='gelu_erf'
    set_setting(v, key, value);  // unknown names raise here
    if (!given.insert(find_train_setting(key)->flag).second)
      throw py::type_error("the setting " + find_train_setting(key)->name() + " is given twice (under its two names)");
  }
  return resolve_train_flags(v, [&](const std::string& f) { return given.count(f) > 0; }, task_training_defaults);
}

namespace {
// A float32 setting as the shortest decimal that reads back as the same float32 (1e-05, not
// 9.999999747378752e-06), so that reprs and to_dict show what was given.
py::object short_float(float v) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(text, nullptr) == v) break;
  }
  return py::float_(std::strtod(text, nullptr));
}
}  // namespace

// The model settings in Python: TransformerLens's name where it has one (cfg.n_layers), each
// also accepted by ModelConfig(...) under its CLI flag's name (layers=), and headlab's own
// (norm, positions, ...) as the CLI names them. One table for the attributes, to_dict, the repr
// and the constructor, so that ModelConfig(**cfg.to_dict()) gives cfg back.
const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = {
      {"d_vocab", "vocab_size", "Vocabulary size", [](const ModelConfig& c) -> py::object { return py::int_(c.vocab_size); }},
      {"d_model", "", "Residual stream width", [](const ModelConfig& c) -> py::object { return py::int_(c.d_model); }},
      {"n_layers", "layers", "Transformer blocks", [](const ModelConfig& c) -> py::object { return py::int_(c.n_layers); }},
      {"n_heads", "heads", "Attention heads per layer", [](const ModelConfig& c) -> py::object { return py::int_(c.n_heads); }},
      {"n_key_value_heads", "kv_heads", "Key/value heads (grouped-query attention); = n_heads without",
       [](const ModelConfig& c) -> py::object { return py::int_(c.kv_heads()); }},
      {"d_head", "", "Head size", [](const ModelConfig& c) -> py::object { return py::int_(c.head_dim()); }},
      {"d_mlp", "d_ff", "Feed-forward width; 0 = attention-only", [](const ModelConfig& c) -> py::object { return py::int_(c.d_ff); }},
      {"n_ctx", "max_seq_len", "Longest sequence (positions)", [](const ModelConfig& c) -> py::object { return py::int_(c.max_seq_len); }},
      {"norm", "", "pre or post LayerNorm", [](const ModelConfig& c) -> py::object { return py::str(to_string(c.norm)); }},
      // a SwiGLU gate is silu whatever the field holds: said as what the model computes
      {"activation", "", "gelu_erf, gelu_tanh, relu, relu2 or silu (mlp swiglu: silu)", [](const ModelConfig& c) -> py::object {
         return py::str(c.mlp == Mlp::SwiGLU ? "silu" : to_string(c.activation));
       }},
      {"positions", "", "learned, sinusoidal, rotary or none", [](const ModelConfig& c) -> py::object { return py::str(to_string(c.positions)); }},
      {"attn_bias", "", "Biases on W_Q, W_K, W_V, W_O", [](const ModelConfig& c) -> py::object { return py::bool_(c.attn_bias); }},
      {"mlp_bias", "", "Biases on the feed-forward layers", [](const ModelConfig& c) -> py::object { return py::bool_(c.mlp_bias); }},
      {"head_bias", "", "A bias on the unembedding (b_U)", [](const ModelConfig& c) -> py::object { return py::bool_(c.head_bias); }},
      {"eps", "layer_norm_eps", "LayerNorm epsilon", [](const ModelConfig& c) -> py::object { return short_float(c.layer_norm_eps); }},
      {"dropout", "", "Dropout on embeddings and residual branches", [](const ModelConfig& c) -> py::object { return short_float(c.dropout); }},
      {"attn_dropout", "", "Dropout on attention weights", [](const ModelConfig& c) -> py::object { return short_float(c.attn_dropout); }},
      // block options (docs/architectures.md)
      {"normalization", "", "layernorm, rmsnorm or rmsnorm_1p", [](const ModelConfig& c) -> py::object { return py::str(to_string(c.normalization)); }},
      {"sandwich_norm", "", "A norm on attention's and the MLP's output (Gemma 2)", [](const ModelConfig& c) -> py::object { return py::bool_(c.sandwich_norm); }},
      {"mlp", "", "plain, swiglu or geglu", [](const ModelConfig& c) -> py::object { return py::str(to_string(c.mlp)); }},
      {"parallel_block", "", "x + attn(ln1 x) + mlp(ln2 x)", [](const ModelConfig& c) -> py::object { return py::bool_(c.parallel_block); }},
      {"embed_scale", "", "Token embeddings times sqrt(d_model)", [](const ModelConfig& c) -> py::object { return py::bool_(c.embed_scale); }},
      {"final_softcap", "", "Logit soft-cap; 0 = none", [](const ModelConfig& c) -> py::object { return short_float(c.final_softcap); }},
      // attention options (docs/architectures.md)
      {"rope_theta", "", "Rotary positions: the angles' base", [](const ModelConfig& c) -> py::object { return short_float(c.rope_theta); }},
      {"rope_theta_local", "", "Rotary positions: the local layers' angles' base; 0 = rope_theta", [](const ModelConfig& c) -> py::object { return short_float(c.rope_theta_local); }},
      {"rotary_dim", "", "Rotary positions: dims of each head that turn; 0 = rotary_pct's", [](const ModelConfig& c) -> py::object { return py::int_(c.rotary_dim); }},
      {"rotary_pct", "", "Rotary positions, rotary_dim 0: the fraction of each head that turns", [](const ModelConfig& c) -> py::object { return short_float(c.rotary_pct); }},
      {"rotary_style", "", "half (rotate-half) or interleaved (GPT-J)", [](const ModelConfig& c) -> py::object { return py::str(c.rotary_style); }},
      {"qk_norm", "", "RMSNorm over d_head on queries and keys", [](const ModelConfig& c) -> py::object { return py::bool_(c.qk_norm); }},
      {"attn_scale", "", "Score scale; 0 = 1/sqrt(d_head)", [](const ModelConfig& c) -> py::object { return short_float(c.attn_scale); }},
      {"attn_softcap", "", "Attention score soft-cap; 0 = none", [](const ModelConfig& c) -> py::object { return short_float(c.attn_softcap); }},
      {"sliding_window", "", "Local layers' window; 0 = none", [](const ModelConfig& c) -> py::object { return py::int_(c.sliding_window); }},
      {"window_layers", "", "all, alternate or L:G", [](const ModelConfig& c) -> py::object { return py::str(c.window_layers); }},
      {"qkv_bias", "", "Biases on W_Q, W_K, W_V", [](const ModelConfig& c) -> py::object { return py::bool_(c.qkv_bias); }},
      {"o_bias", "", "Bias on W_O", [](const ModelConfig& c) -> py::object { return py::bool_(c.o_bias); }},
      {"arch", "", "The --arch preset it was made with ('' = none)", [](const ModelConfig& c) -> py::object { return py::str(c.arch); }},
  };
  return fields;
}

py::dict config_dict(const ModelConfig& c) {
  py::dict d;
  for (const ConfigField& f : config_fields()) d[f.name] = f.get(c);
  return d;
}

int64_t positive_setting(const std::string& what, const py::handle& v) {
  if (!PyIndex_Check(v.ptr()) || py::isinstance<py::bool_>(v))
    throw py::type_error(what + ": expected an integer, got " + std::string(py::str(v.get_type().attr("__name__"))));
  const int64_t n = v.cast<int64_t>();
  if (n < 1) throw py::value_error(what + ": must be >= 1, got " + std::to_string(n));
  return n;
}

ModelConfig model_config_from_kwargs(const py::dict& given_kwargs) {
  // TransformerLens's spellings (act_fn='gelu') as headlab's settings (activation='gelu_erf')
  py::dict kwargs;
  for (auto& [k, val] : given_kwargs) {
    const std::string key = k.cast<std::string>();
    if (auto n = native_setting(key, val, "ModelConfig: ")) {
      if (given_kwargs.contains(n->first))
        throw py::type_error("ModelConfig: " + n->first + " is given twice (as " + n->first + " and " + key + ")");
      kwargs[py::str(n->first)] = n->second;
    } else {
      kwargs[k] = val;
    }
  }
  std::string names;
  for (const ConfigField& f : config_fields()) names += std::string(names.empty() ? "" : ", ") + f.name;
  // each keyword as its field's Python name; the CLI's name of a field is taken for it
  py::dict given;
  for (auto& [k, val] : kwargs) {
    const std::string key = k.cast<std::string>();
    const ConfigField* field = nullptr;
    for (const ConfigField& f : config_fields())
      if (key == f.name || (*f.flag && key == f.flag)) field = &f;
    if (!field) throw py::type_error("ModelConfig: unknown setting '" + key + "' (settings: " + names + ")");
    if (given.contains(field->name))
      throw py::type_error(std::string("ModelConfig: ") + field->name + " is given twice (as " + field->name + " and " +
                           field->flag + ")");
    given[field->name] = val;
  }
  // the fields the settings table knows go through it (its ranges and choices), under their flags
  py::dict flags;
  int64_t vocab = ModelConfig().vocab_size, max_len = ModelConfig().max_seq_len;
  bool head_bias = ModelConfig().head_bias;
  float eps = ModelConfig().layer_norm_eps;
  std::map<std::string, std::string> said;  // flag -> the name the caller used, for messages
  auto positive_int = [](const std::string& key, const py::handle& v) { return positive_setting("ModelConfig: " + key, v); };
  for (auto& [k, val] : kwargs) {
    const std::string key = k.cast<std::string>();
    const ConfigField* f = nullptr;
    for (const ConfigField& x : config_fields())
      if (key == x.name || (*x.flag && key == x.flag)) f = &x;
    const std::string name = f->name;
    if (name == "d_vocab") vocab = positive_int(key, val);
    else if (name == "n_ctx") max_len = positive_int(key, val);
    else if (name == "head_bias") {
      if (!py::isinstance<py::bool_>(val)) throw py::type_error("ModelConfig: " + key + ": expected True or False");
      head_bias = val.cast<bool>();
    } else if (name == "eps") {
      if (py::isinstance<py::bool_>(val) || !PyNumber_Check(val.ptr()) || py::isinstance<py::str>(val))
        throw py::type_error("ModelConfig: " + key + ": expected a number");
      eps = val.cast<float>();
      if (!(eps > 0) || !std::isfinite(eps)) throw py::value_error("ModelConfig: " + key + ": must be a finite number > 0");
    } else {
      const std::string flag = *f->flag ? f->flag : f->name;
      said[flag] = key;
      flags[py::str(flag)] = name == "n_key_value_heads" && val.is_none() ? py::int_(0) : py::reinterpret_borrow<py::object>(val);
    }
  }
  // the settings table's messages start with the flag's name: say the name the caller gave
  auto renamed = [&](const std::string& msg) {
    for (auto& [flag, key] : said)
      if (msg.rfind(flag, 0) == 0 && msg.size() > flag.size() && (msg[flag.size()] == ':' || msg[flag.size()] == ' '))
        return "ModelConfig: " + key + msg.substr(flag.size());
    return "ModelConfig: " + msg;
  };
  ModelConfig c;
  try {
    c = args_from_kwargs(flags).model;
  } catch (const py::type_error& e) {
    throw py::type_error(renamed(e.what()));
  } catch (const py::value_error& e) {
    throw py::value_error(renamed(e.what()));
  }
  c.vocab_size = vocab;
  c.max_seq_len = max_len;
  c.head_bias = head_bias;
  c.layer_norm_eps = eps;
  c.validate();
  return c;
}

int threads_for_this_machine(int most, bool quiet) {
  const ThreadChoice c = choose_threads(most);
  if (!c.notice.empty() && !quiet)
    py::module_::import("headlab.progress").attr("notice")("headlab: " + c.notice + " (threads=" + std::to_string(most) +
                                                           " to use them anyway)");
  return c.threads;
}

}  // namespace hl::bindings
