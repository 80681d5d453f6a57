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
  auto sae_forward = [](const Sae& s, const py::array& x) {
    NoGradGuard no_grad;
    return view_of(s.forward(tensor_from_array(x, "x")));
  };
  py::class_<Sae>(m, "SAE", R"(A sparse autoencoder in SAELens's layout: W_enc (d_in, d_sae), b_enc, W_dec (d_sae, d_in),
b_dec, and for JumpReLU its thresholds. encode(x) = act((x - b_dec) W_enc + b_enc), decode(f) = f W_dec + b_dec,
forward(x) = the reconstruction of x in x's units. With normalize_activations="layer_norm", encode normalises each row
first and decode's output is in those normalised units: forward(x) (and the splice) scale it back.)")
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
      .def_property_readonly("normalize_activations", [](const Sae& s) { return s.cfg.normalize_activations; },
                             "none, or layer_norm: encode normalises each row, decode's output is in those units")
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
          py::arg("f"),
          "f W_dec + b_dec (N, d_out) of feature activations f (N, d_sae): in the normalised units when "
          "normalize_activations is layer_norm (forward(x) gives x's units)")
      .def("forward", sae_forward, py::arg("x"),
           "The reconstruction (N, d_out) of activations x (N, d_in), in x's units (what the splice writes)")
      .def("__call__", sae_forward, py::arg("x"), "sae(x) = sae.forward(x)")
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
         int64_t sparsity_warmup, int64_t lr_decay_steps, const std::string& jumprelu_sparsity, float tanh_scale,
         float pre_act_coefficient, const py::object& out, bool resume, int64_t snapshot_every,
         const py::object& normalize_activations) {
        // token ids (B, T), hl.Batches or a dict of arrays; padding (attention_mask) is no activation
        const DataArg d = data_arg(data, model, "train_sae");
        const std::vector<Batch> batches = d.batches();
        int64_t batch_tokens = 0;  // the largest batch's tokens: what one top-up of the buffer adds
        for (const Batch& b : batches) batch_tokens = std::max<int64_t>(batch_tokens, b.inputs.numel());
        HL_CHECK(!resume || !out.is_none(), "train_sae: resume=True continues the run in out=, which is not given");
        // Python's objects read here, with the GIL: the metrics over data itself, its next tokens the targets
        const std::string out_dir = out.is_none() ? std::string() : py::str(out).cast<std::string>();
        const std::string transcoder_out = hook_out.is_none() ? std::string() : hook_out.cast<std::string>();
        const std::string normalize = normalize_activations.is_none() ? std::string() : normalize_activations.cast<std::string>();
        const std::vector<Batch> held_out = out.is_none() ? std::vector<Batch>() : batches;
        return interruptible([&] {
          SaeConfig cfg = sae_config_for_model(model, batches[0].inputs, hook, transcoder_out, architecture, expansion);
          cfg.k = k, cfg.bandwidth = bandwidth, cfg.initial_threshold = bandwidth;
          if (!normalize.empty()) cfg.normalize_activations = normalize;
          check_fits_in_memory(sae_training_bytes(cfg, batch, buffer + batch_tokens),
                               "train_sae: an SAE of " + std::to_string(cfg.d_sae) + " features on " + std::to_string(batch) + "-row batches");
          SaeTrainArgs a;
          a.steps = steps, a.batch = batch, a.lr = lr, a.warmup = warmup, a.seed = seed;
          a.l1_coefficient = l1_coefficient, a.l0_coefficient = l0_coefficient, a.sparsity_warmup = sparsity_warmup;
          a.lr_decay_steps = lr_decay_steps, a.jumprelu_sparsity = jumprelu_sparsity, a.tanh_scale = tanh_scale;
          a.pre_act_coefficient = pre_act_coefficient;
          a.init_rows = std::min<int64_t>(4096, buffer);
          ActivationStream stream = model_activation_stream(model, sae_source_hooks(cfg), batches, buffer, seed + 1);
          if (out_dir.empty()) {
            SaeTrainer trainer(cfg, a, std::move(stream));
            trainer.train();
            return trainer.sae();
          }
          SaeRunOptions opt;
          opt.out = out_dir, opt.resume = resume, opt.snapshot_every = snapshot_every;
          opt.out_flag = "out", opt.resume_flag = "resume=True";
          return train_sae_in_dir(model, cfg, a, std::move(stream), held_out, opt).sae;
        });
      },
      py::arg("model"), py::arg("hook"), py::arg("data"), py::arg("architecture") = "topk", py::arg("expansion") = 8,
      py::arg("k") = 8, py::arg("steps") = 1000, py::arg("batch") = 1024, py::arg("lr") = 4e-4f, py::arg("warmup") = 100,
      py::arg("buffer") = 16384, py::arg("l1_coefficient") = 5.f, py::arg("l0_coefficient") = 1.f, py::arg("bandwidth") = 0.001f,
      py::arg("seed") = 0, py::arg("hook_out") = py::none(), py::arg("sparsity_warmup") = 0, py::arg("lr_decay_steps") = 0,
      py::arg("jumprelu_sparsity") = "step", py::arg("tanh_scale") = 4.f, py::arg("pre_act_coefficient") = 0.f,
      py::arg("out") = py::none(), py::arg("resume") = false, py::arg("snapshot_every") = 0,
      py::arg("normalize_activations") = py::none(),
      R"(Trains an SAE on model's activations at hook (e.g. "blocks.1.attn.hook_z", heads concatenated) over data,
token ids (B, T), hl.Batches (a task's held_out, or arrays with an attention_mask: padding is never an activation) or
a dict of arrays, run through the model and mixed in a shuffle buffer of `buffer` rows. Returns an SAE.
With hook_out, a transcoder from hook's activation to hook_out's (e.g. hook="blocks.0.ln2.hook_normalized",
hook_out="blocks.0.hook_mlp_out": the MLP's input to its output). sparsity_warmup: steps over which the L1 (standard)
or L0 (jumprelu) weight rises from 0; lr_decay_steps: final steps over which the learning rate falls to 0.
jumprelu_sparsity: "step" (the L0 through a straight-through step) or "tanh" (sum of tanh(tanh_scale f |W_dec|));
pre_act_coefficient: weight of the dead features' relu(threshold - pre) |W_dec| (0: off).
normalize_activations: "none" or "layer_norm" (each row centred and scaled to unit std before the encoder, scaled
back after the decoder, SAELens's name); None: layer_norm for batchtopk, none for the others.
With out, a run directory as `headlab sae --out` writes: sae_state.safetensors (Ctrl-C saves it too), snapshots/stepN
every snapshot_every steps, and at the end cfg.json, sae_weights.safetensors and metrics.json (on data);
resume=True continues it bit for bit (same settings, steps may grow).)");
}

}  // namespace hl::bindings
