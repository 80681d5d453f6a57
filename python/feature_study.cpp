// What an SAE's features mean for a model, from Python (analysis/feature_attribution.h,
// analysis/feature_study.h, analysis/features_over_training.h, views/feature_page.h): the same
// library functions `headlab features` calls.
#include "analysis/feature_study.h"
#include "analysis/features_over_training.h"
#include "bindings.h"
#include "views/feature_page.h"

namespace hl::bindings {

namespace {

py::array doubles(const std::vector<double>& v, std::vector<py::ssize_t> shape) {
  py::array_t<double> a(shape);
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

}  // namespace

void bind_feature_study(py::module_& m) {
  m.def(
      "feature_head_outputs", [](const TransformerLM& model, const Sae& sae) { return view_of(feature_head_outputs(model, sae)); },
      py::arg("model"), py::arg("sae"),
      "For an SAE on blocks.L.attn.hook_z: each feature's decoder block of head h through head h's W_O, (d_sae, n_heads, "
      "d_model): what one unit of the feature writes into the residual stream through each head.");
  m.def(
      "feature_logit_effects",
      [](const TransformerLM& model, const Sae& sae, const std::vector<int>& features, double scale, int top_k) {
        py::list out;
        for (const FeatureLogitEffect& e : feature_logit_effects(model, sae, features, scale, top_k))
          out.append(py::dict(py::arg("feature") = e.feature, py::arg("logits") = doubles(e.logits, {py::ssize_t(e.logits.size())}),
                              py::arg("promoted") = e.promoted, py::arg("suppressed") = e.suppressed));
        return out;
      },
      py::arg("model"), py::arg("sae"), py::arg("features"), py::arg("scale") = 1.0, py::arg("top_k") = 10,
      "Each feature's direct effect on the logits per unit of activation: its output through W_O, ln_final with the fixed "
      "`scale` (feature_final_scale gives the data's mean) and W_U. A list of {feature, logits (vocab), promoted, suppressed}.");
  m.def(
      "feature_final_scale",
      [](TransformerLM& model, const py::object& data) {
        const DataArg d = data_arg(data, model, "feature_final_scale");
        return interruptible([&] { return final_norm_scale(model, d.batches()); });
      },
      py::arg("model"), py::arg("data"), "The mean of ln_final.hook_scale over the tokens of data, padding left out (1 without a final norm)");
  m.def(
      "feature_attribution",
      [](TransformerLM& model, const Sae& sae, const py::object& ids, int feature, const py::object& attention_mask) {
        const Ids x = ids_from(ids, "ids");
        const Tensor pad = key_padding_from(attention_mask, x, "feature_attribution: attention_mask");
        const FeatureSourceAttribution a = interruptible([&] { return feature_source_attribution(model, sae, x, feature, pad); });
        const py::ssize_t B = a.batch, T = a.tokens, H = a.heads;
        return py::dict(py::arg("contribution") = doubles(a.contribution, {B, T, H, T}), py::arg("bias") = a.bias,
                        py::arg("pre_activation") = doubles(a.pre_activation, {B, T}),
                        py::arg("activation") = doubles(a.activation, {B, T}));
      },
      py::arg("model"), py::arg("sae"), py::arg("ids"), py::arg("feature"), py::arg("attention_mask") = py::none(),
      "Direct feature attribution by source position for an SAE on hook_z: the feature's pre-activation at every query "
      "decomposed over heads and attended source tokens, contribution (B, T, H, T) [b, query, head, source], plus bias; "
      "contribution.sum((2, 3)) + bias == pre_activation. attention_mask (B, T), 1 = token, 0 = padding on either side "
      "of a row's tokens: each row as alone, in its columns; a padding query has no contribution and NaN activations.");
  m.def(
      "top_activating_examples",
      [](TransformerLM& model, const Sae& sae, const py::object& data, const std::vector<int>& features, int k, int before, int after) {
        const DataArg d = data_arg(data, model, "top_activating_examples");
        const auto top = interruptible([&] { return top_activating_examples(model, sae, d.batches(), features, k, before, after); });
        py::list out;
        for (const FeatureExamples& f : top) {
          py::list ex;
          for (const FeatureExample& e : f.examples)
            ex.append(py::dict(py::arg("row") = e.row, py::arg("position") = e.position, py::arg("max_activation") = e.max_activation,
                               py::arg("window_start") = e.window_start, py::arg("tokens") = e.tokens,
                               py::arg("activations") = e.activations));
          out.append(py::dict(py::arg("feature") = f.feature, py::arg("examples") = ex));
        }
        return out;
      },
      py::arg("model"), py::arg("sae"), py::arg("data"), py::arg("features"), py::arg("k") = 10, py::arg("before") = 8,
      py::arg("after") = 2,
      "Per feature, the k rows of data where it is largest, each as the window of tokens around its largest token with the "
      "feature's activation at each: [{feature, examples: [{row, position, max_activation, window_start, tokens, activations}]}]");
  m.def(
      "feature_presence",
      [](TransformerLM& model, const Sae& sae, const py::object& data) {
        const DataArg d = data_arg(data, model, "feature_presence");
        const FeaturePresence p = interruptible([&] { return feature_presence(model, sae, d.batches()); });
        const py::ssize_t F = static_cast<py::ssize_t>(p.mean_activation.size());
        return py::dict(py::arg("mean_activation") = doubles(p.mean_activation, {F}),
                        py::arg("firing_frequency") = doubles(p.firing_frequency, {F}), py::arg("tokens") = p.tokens);
      },
      py::arg("model"), py::arg("sae"), py::arg("data"),
      "Each feature's mean activation and firing frequency over every token of data (apply it to each snapshot of a run to "
      "follow the features over training)");
  m.def(
      "feature_ablation",
      [](TransformerLM& model, const Sae& sae, const py::object& data, const std::vector<int>& features, bool keep_error) {
        const DataArg d = data_arg(data, model, "feature_ablation");
        const FeatureAblation a = interruptible([&] { return feature_ablation_effects(model, sae, d.batches(), features, keep_error); });
        return py::dict(py::arg("base_loss") = a.base_loss, py::arg("features") = a.features,
                        py::arg("loss_change") = a.loss_change);
      },
      py::arg("model"), py::arg("sae"), py::arg("data"), py::arg("features"), py::arg("keep_error") = true,
      "Each feature's ablation effect on the loss: the SAE spliced in at its hook with the feature set to 0, minus nothing "
      "ablated. keep_error adds the SAE's error back (the base is then the model itself).");
  m.def(
      "match_sae_features",
      [](const Sae& a, const Sae& b) {
        const FeatureMatch r = match_sae_features(a, b);
        return py::dict(py::arg("partner") = r.partner, py::arg("cosine") = r.cosine, py::arg("mean_cosine") = r.mean_cosine);
      },
      py::arg("a"), py::arg("b"),
      "a's features matched one to one with b's by decoder cosine (Hungarian): {partner (b's feature per a's, -1 = none), "
      "cosine, mean_cosine}");
  m.def(
      "_feature_page",
      [](TransformerLM& model, const Sae& sae, const py::object& data, const std::vector<int>& features, int top_features, int examples,
         int before, int after, bool ablate, const std::vector<std::string>& token_texts, const std::string& title) {
        const DataArg d = data_arg(data, model, "feature_view");
        FeatureStudyOptions o;
        o.features = features, o.top_features = top_features, o.examples = examples, o.before = before, o.after = after;
        o.ablate = ablate;
        const FeatureStudy s = interruptible([&] { return feature_study(model, sae, d.batches(), o); });
        return views::feature_page(s, title, [&](int32_t t) {
          return t >= 0 && static_cast<size_t>(t) < token_texts.size() ? token_texts[static_cast<size_t>(t)] : std::to_string(t);
        }, true);
      },
      py::arg("model"), py::arg("sae"), py::arg("data"), py::arg("features"), py::arg("top_features"), py::arg("examples"),
      py::arg("before"), py::arg("after"), py::arg("ablate"), py::arg("token_texts"), py::arg("title"));
}

}  // namespace hl::bindings
