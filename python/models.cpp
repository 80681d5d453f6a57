// Binds models (ModelConfig, TransformerLM, hook_points) and hooks: Python callables as forward
// and backward hooks, and the activation cache as read-only array views.
#include "bindings.h"

#include <cstdio>

#include "lib/safetensors.h"
#include "models/checkpoint.h"
#include "models/hooks.h"

namespace hl::bindings {
namespace {

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

}  // namespace

void bind_models(py::module_& m) {
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
      .def_readonly("attn_bias", &ModelConfig::attn_bias)
      .def_readonly("mlp_bias", &ModelConfig::mlp_bias)
      .def_readonly("head_bias", &ModelConfig::head_bias)
      .def("to_dict", [](const ModelConfig& c) { return json_to_py(json::parse(c.to_json())); })
      .def("__repr__", [](const ModelConfig& c) {  // the attribute names (as the CLI's flags), not the file's
        auto b = [](bool v) { return std::string(v ? "True" : "False"); };
        char dropout[64];
        std::snprintf(dropout, sizeof dropout, "dropout=%g, attn_dropout=%g", c.dropout, c.attn_dropout);
        return "headlab.ModelConfig(vocab_size=" + std::to_string(c.vocab_size) + ", d_model=" + std::to_string(c.d_model) +
               ", layers=" + std::to_string(c.n_layers) + ", heads=" + std::to_string(c.n_heads) +
               ", kv_heads=" + std::to_string(c.kv_heads()) + ", d_head=" + std::to_string(c.head_dim()) +
               ", d_ff=" + std::to_string(c.d_ff) + ", max_seq_len=" + std::to_string(c.max_seq_len) + ", norm='" +
               to_string(c.norm) + "', activation='" + to_string(c.activation) + "', positions='" + to_string(c.positions) +
               "', attn_bias=" + b(c.attn_bias) + ", mlp_bias=" + b(c.mlp_bias) + ", head_bias=" + b(c.head_bias) + ", " +
               dropout + ")";
      });

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
      .def("load_parameters", [](TransformerLM& model, const std::string& path) { load_parameters(model, read_checkpoint(path)); })
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
             // a misspelt name is refused here, as run_with_hooks refuses it, not at lookup
             if (py::isinstance<py::str>(names)) check_hook_name(model.cfg, names.cast<std::string>());
             else if (!names.is_none() && !py::isinstance<py::function>(names))
               for (const std::string& n : names.cast<std::vector<std::string>>()) check_hook_name(model.cfg, n);
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
}

}  // namespace hl::bindings
