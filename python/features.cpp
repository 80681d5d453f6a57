// Sparse autoencoders from Python: hl.SAE (encode, decode, save, load in SAELens's layout) and
// hl.train_sae, over models/sae.h and train/sae_trainer.h.
#include "bindings.h"
#include "analysis/evaluate.h"
#include "analysis/features.h"
#include "lib/fileutil.h"
#include "models/sae.h"
#include "train/sae_trainer.h"

namespace hl::bindings {

void bind_features(py::module_& m) {
  py::class_<Sae>(m, "SAE", R"(A sparse autoencoder in SAELens's layout: W_enc (d_in, d_sae), b_enc, W_dec (d_sae, d_in),
b_dec, and for JumpReLU its thresholds. encode(x) = act((x - b_dec) W_enc + b_enc), decode(f) = f W_dec + b_dec.)")
      .def_property_readonly("d_in", [](const Sae& s) { return s.cfg.d_in; }, "Input width (a hook point's values per token)")
      .def_property_readonly("d_sae", [](const Sae& s) { return s.cfg.d_sae; }, "Number of features")
      .def_property_readonly("architecture", [](const Sae& s) { return sae_arch_name(s.cfg.arch); },
                             "standard, topk, batchtopk or jumprelu")
      .def_property_readonly("hook_name", [](const Sae& s) { return s.cfg.hook_name; }, "The hook point it reads")
      .def_property_readonly("hook_name_out", [](const Sae& s) { return s.cfg.hook_name_out; },
                             "A transcoder: the hook point it reconstructs (its splice replaces it); empty for an SAE")
      .def_property_readonly("d_out", [](const Sae& s) { return s.cfg.out_width(); }, "Output width (d_in for an SAE)")
      .def_property_readonly("W_enc", [](const Sae& s) { return view_of(s.W_enc, false); }, "(d_in, d_sae), read-only view")
      .def_property_readonly("W_dec", [](const Sae& s) { return view_of(s.W_dec, false); },
                             "(d_sae, d_in), read-only view: the rows are the features' directions")
      .def_property_readonly("b_enc", [](const Sae& s) { return view_of(s.b_enc, false); }, "(d_sae), read-only view")
      .def_property_readonly("b_dec", [](const Sae& s) { return view_of(s.b_dec, false); }, "(d_in), read-only view")
      .def(
          "encode",
          [](const Sae& s, const py::array& x) {
            NoGradGuard no_grad;
            return view_of(s.encode(tensor_from_array(x, "x")));
          },
          py::arg("x"), "Feature activations (N, d_sae) of activations x (N, d_in)")
      .def(
          "decode",
          [](const Sae& s, const py::array& f) {
            NoGradGuard no_grad;
            return view_of(s.decode(tensor_from_array(f, "f")));
          },
          py::arg("f"), "Reconstruction (N, d_in) of feature activations f (N, d_sae)")
      .def(
          "save",
          [](const Sae& s, const PathArg& dir) {
            make_dirs(dir.path);
            save_saelens(s, dir.path);
          },
          py::arg("dir"), "Writes dir/cfg.json and dir/sae_weights.safetensors in SAELens's layout")
      .def_static(
          "load", [](const PathArg& dir) { return load_saelens(dir.path); }, py::arg("dir"),
          "Reads an SAE saved by save() or by SAELens (standard, topk, jumprelu; cfg.json + sae_weights.safetensors)");

  m.def(
      "evaluate_sae",
      [](TransformerLM& model, const Sae& sae, const py::object& data) {
        const PyData d = py::isinstance<PyData>(data) ? data.cast<const PyData&>() : batches_from(data);
        HL_CHECK(!d.batches.empty(), "evaluate_sae: no data");
        check_data_fits_model(d.batches, model.cfg, "evaluate_sae");
        return json_to_py(sae_evaluation_json(interruptible([&] { return evaluate_sae(model, sae, d.batches); })));
      },
      py::arg("model"), py::arg("sae"), py::arg("data"),
      R"(The SAE measured on model over data (what hl.Batches takes: token ids (N, T), next-token targets): a dict of
l0, explained_variance, mse, dead_fraction, dense_fraction, density (per feature) and density_histogram (log10
buckets) on the activations at the SAE's hook, and the loss recovered when its reconstruction is spliced in:
loss_clean, loss_spliced, loss_zero_ablated, loss_recovered = (zero_ablated - spliced) / (zero_ablated - clean).
The same numbers as `headlab sae`'s metrics.json.)");

  m.def(
      "train_sae",
      [](TransformerLM& model, const std::string& hook, const py::object& data, const std::string& architecture,
         int64_t expansion, int64_t k, int64_t steps, int64_t batch, float lr, int64_t warmup, int64_t buffer,
         float l1_coefficient, float l0_coefficient, float bandwidth, uint64_t seed, const py::object& hook_out,
         int64_t sparsity_warmup) {
        const Ids ids = ids_from(data, "data");
        HL_CHECK(ids.shape.ndim == 2, "train_sae: data must be token ids (B, T), got ", ids.shape.str());
        HL_CHECK(expansion >= 1, "train_sae: expansion must be at least 1, got ", expansion);
        return interruptible([&] {
          SaeConfig cfg;
          cfg.d_in = model_activations(model, hook, {ids}, 1, 0)(1).size(1);
          if (!hook_out.is_none()) {  // a transcoder
            cfg.hook_name_out = hook_out.cast<std::string>(), cfg.apply_b_dec_to_input = false;
            cfg.d_out = model_activations(model, cfg.hook_name_out, {ids}, 1, 0)(1).size(1);
          }
          cfg.d_sae = cfg.d_in * expansion;
          cfg.arch = parse_sae_arch(architecture);
          cfg.k = k, cfg.bandwidth = bandwidth, cfg.initial_threshold = bandwidth, cfg.hook_name = hook;
          check_fits_in_memory(sae_training_bytes(cfg, batch, buffer + ids.numel()),
                               "train_sae: an SAE of " + std::to_string(cfg.d_sae) + " features on " + std::to_string(batch) + "-row batches");
          SaeTrainArgs a;
          a.steps = steps, a.batch = batch, a.lr = lr, a.warmup = warmup, a.seed = seed;
          a.l1_coefficient = l1_coefficient, a.l0_coefficient = l0_coefficient, a.sparsity_warmup = sparsity_warmup;
          a.init_rows = std::min<int64_t>(4096, buffer);
          SaeTrainer trainer(cfg, a, model_activations(model, sae_source_hooks(cfg), {ids}, buffer, seed + 1));
          trainer.train();
          return trainer.sae();
        });
      },
      py::arg("model"), py::arg("hook"), py::arg("data"), py::arg("architecture") = "topk", py::arg("expansion") = 8,
      py::arg("k") = 8, py::arg("steps") = 1000, py::arg("batch") = 1024, py::arg("lr") = 4e-4f, py::arg("warmup") = 100,
      py::arg("buffer") = 16384, py::arg("l1_coefficient") = 5.f, py::arg("l0_coefficient") = 1.f, py::arg("bandwidth") = 0.001f,
      py::arg("seed") = 0, py::arg("hook_out") = py::none(), py::arg("sparsity_warmup") = 0,
      R"(Trains an SAE on model's activations at hook (e.g. "blocks.1.attn.hook_z", heads concatenated) over data,
token ids (B, T) run through the model and mixed in a shuffle buffer of `buffer` rows. Returns an SAE.
With hook_out, a transcoder from hook's activation to hook_out's (e.g. hook="blocks.0.ln2.hook_normalized",
hook_out="blocks.0.hook_mlp_out": the MLP's input to its output). sparsity_warmup: steps over which the L1 (standard)
or L0 (jumprelu) weight rises from 0.)");
}

}  // namespace hl::bindings
