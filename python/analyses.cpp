// Binds the analyses of heads on held-out data: evaluation, importance and ablation, pruning,
// detectors, activation patching and circuit scores (long ones stop on Ctrl-C).
#include <optional>

#include "analysis/ablation.h"
#include "analysis/circuits.h"
#include "analysis/decompose.h"
#include "analysis/detectors.h"
#include "analysis/circuit_discovery.h"
#include "analysis/edges.h"
#include "analysis/qk_attribution.h"
#include "analysis/matching.h"
#include "analysis/patching.h"
#include "bindings.h"
#include "train/over_training.h"
#include "train/run_dir.h"
#include "lib/fileutil.h"
#include "models/padding.h"

namespace hl::bindings {
namespace {

// An analysis called (model, task, data) or (model, data): the task, or null when the second
// argument is the data (its rows' targets are the answers; a task adds nothing more).
const PyTask* split_task(py::object& task, py::object& data, const std::string& fn) {
  if (!task.is_none() && !py::isinstance<PyTask>(task)) {
    if (!data.is_none()) throw py::type_error(fn + ": task must be a Task, got " + std::string(py::str(task.get_type())));
    data = task;
    task = py::none();
  }
  return task.is_none() ? nullptr : &task.cast<const PyTask&>();
}

// Answers given as rows of (row, pos, clean token, corrupted token), checked against the ids and
// the model's vocabulary.
std::vector<PatchAnswer> answers_from(const py::object& answers, const Ids& clean, const TransformerLM& model, const std::string& fn) {
  std::vector<PatchAnswer> out;
  for (const auto& r : answers.cast<std::vector<std::vector<int64_t>>>()) {
    if (r.size() != 4) throw py::value_error(fn + ": each answer is (row, pos, clean token, corrupted token)");
    const int64_t B = clean.shape[0], T = clean.shape[1], V = model.cfg.vocab_size;
    if (r[0] < 0 || r[0] >= B || r[1] < 0 || r[1] >= T || r[2] < 0 || r[2] >= V || r[3] < 0 || r[3] >= V)
      throw py::value_error(fn + ": answer (" + std::to_string(r[0]) + ", " + std::to_string(r[1]) + ", " +
                            std::to_string(r[2]) + ", " + std::to_string(r[3]) + ") is outside the ids or the vocabulary");
    out.push_back({r[0], r[1], static_cast<int32_t>(r[2]), static_cast<int32_t>(r[3])});
  }
  if (out.empty()) throw py::value_error(fn + ": no answers");
  return out;
}

// The clean and corrupted ids (B, T) of one shape, and their attention_mask (one for both runs,
// padding on either side: left_align_rows moves each row's tokens first once the answers are read),
// of hl.activation_patching, edge_patching and path_patching.
PatchingInputs patching_ids(const py::object& clean, const py::object& corrupted, const py::object& attention_mask,
                            const std::string& fn) {
  PatchingInputs in;
  in.clean = ids_from(clean, "clean");
  in.corrupted = ids_from(corrupted, "corrupted");
  if (in.clean.shape != in.corrupted.shape)
    throw py::value_error(fn + ": the clean ids " + in.clean.shape.str() + " and the corrupted ids " + in.corrupted.shape.str() +
                          " must have one shape");
  in.key_padding = key_padding_from(attention_mask, in.clean);
  return in;
}

// The clean and corrupted ids, their attention_mask and the answers of hl.edge_patching and hl.path_patching.
PatchingInputs edge_inputs(const TransformerLM& model, const py::object& clean, const py::object& corrupted,
                           const py::object& attention_mask, const py::object& answers, const std::string& fn) {
  PatchingInputs in = patching_ids(clean, corrupted, attention_mask, fn);
  if (answers.is_none()) throw py::value_error(fn + ": give answers (rows of (row, pos, clean token, corrupted token))");
  in.answers = answers_from(answers, in.clean, model, fn);
  left_align_rows(in, fn);
  check_edge_inputs(model.cfg, in);
  return in;
}

// hl.activation_patching(model, clean, corrupted, hook=, axes=, answers=, metric=): the generic
// loop over the axes; an array indexed by them.
py::array generic_patching(TransformerLM& model, const py::object& clean, const py::object& corrupted, const std::string& hook,
                           const std::vector<std::string>& axes, const py::object& answers, const py::object& metric,
                           const py::object& attention_mask) {
  PatchingInputs in = patching_ids(clean, corrupted, attention_mask, "activation_patching");
  const std::vector<std::string> ax = axes.empty() ? default_patch_axes(model, hook) : axes;
  PatchGrid g;
  if (metric.is_none()) {
    if (answers.is_none())
      throw py::value_error("activation_patching: give answers (rows of (row, pos, clean token, corrupted token)) for the "
                            "default metric, or a metric(logits) -> float");
    in.answers = answers_from(answers, in.clean, model, "activation_patching");
    left_align_rows(in, "activation_patching");
    g = interruptible([&] { return generic_activation_patch(model, in, hook, ax); });
  } else {
    const std::vector<int64_t> lead = left_align_rows(in, "activation_patching");
    py::function f = metric.cast<py::function>();
    const PatchMetric pm = [&f, &lead](const Tensor& logits, const std::vector<int64_t>&) {
      Tensor shown = logits;  // (B, T, V), back in the columns the caller gave
      if (any_shift(lead)) {
        shown = logits.clone();
        rotate_rows_right(shown.data(), shown.size(1), shown.size(2), lead);
      }
      py::gil_scoped_acquire gil;
      return f(view_of(shown, false)).cast<double>();
    };
    g = interruptible([&] { return generic_activation_patch(model, in.clean, in.corrupted, hook, ax, pm); });
  }
  py::array_t<double> out(std::vector<py::ssize_t>(g.shape.begin(), g.shape.end()));
  std::copy(g.values.begin(), g.values.end(), out.mutable_data());
  return out;
}

// f() computed without the GIL (a short analysis; long ones are `interruptible`).
template <class F>
auto without_gil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

// A typed result (headlab/results.py) of named (L, H) grids, then the fields of `more`.
py::object grids_result(const char* type, std::initializer_list<std::pair<const char*, const HeadGrid&>> grids,
                        const py::dict& more = py::dict()) {
  py::dict d;
  for (const auto& [name, g] : grids) d[name] = grid_array(g);
  for (const auto& [k, v] : more) d[k] = v;
  return typed_result(type, d);
}

}  // namespace

void bind_analyses(py::module_& m) {
  // ---- analyses -------------------------------------------------------------------------------
  // heads over training: the scores of `analysis` at every snapshot of a run (train/over_training.h)
  m.def("_scores_over_training", [](const std::string& run, const std::string& analysis, const py::object& examples,
                                    uint64_t seed, const std::string& data, int length, int bos, bool exclude_bos,
                                    bool exclude_current, bool normalize, const std::string& task, const py::object& threads_given,
                                    const std::string& corrupt, const py::object& out_given, bool quiet) {
    // out: a directory for the files `headlab ANALYSIS --run` writes (True: where headlab view RUN reads them)
    std::string out;
    if (py::isinstance<py::bool_>(out_given)) out = out_given.cast<bool>() ? over_training_dir(run, analysis) : "";
    else if (!out_given.is_none()) out = py::str(out_given).cast<std::string>();
    const std::string kind = head_analysis(analysis).command;  // a bad name fails before anything is read
    if (!out.empty()) check_output_dir(out, kind, "out");
    // no count given: the busy-machine rule, as every command applies it
    const int threads = threads_given.is_none() ? threads_for_this_machine(TrainArgs{}.threads, quiet) : threads_given.cast<int>();
    HeadScoreOptions o;
    o.corruption = parse_corruption(corrupt);
    // True is an int to Python, and a float would be cast away: a whole number only
    if (!examples.is_none() && (!py::isinstance<py::int_>(examples) || py::isinstance<py::bool_>(examples)))
      throw py::type_error("scores_over_training: examples must be a whole number, got " +
                           std::string(py::str(examples.get_type().attr("__name__"))));
    if (!find_task(task)) {  // a checkpoint that names no task is read as `task`: an unknown name fails now
      TaskConfig unknown;
      unknown.name = task;
      unknown.validate();
    }
    o.examples = examples.is_none() ? head_analysis(analysis).default_examples() : examples.cast<int>();
    if (o.examples < 1) throw py::value_error("scores_over_training: examples must be at least 1, got " + std::to_string(o.examples));
    if (threads < 1) throw py::value_error("scores_over_training: threads must be at least 1, got " + std::to_string(threads));
    o.seed = seed, o.data = data, o.length = length, o.bos = bos;
    o.exclude_bos = exclude_bos, o.exclude_current = exclude_current, o.normalize = normalize;
    o.fallback_task = TaskConfig::preset(task);
    o.threads = threads;
    const ScoresOverTraining s = interruptible([&] { return scores_over_training(run, analysis, o); });
    if (!out.empty()) {  // the files appear together, or none, as the command's
      const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, kind, "out");
      write_scores_over_training_files(staged->staging(), s, o);
      staged->publish();
    }
    py::dict scores;
    for (size_t k = 0; k < s.score_names.size(); ++k) {
      py::array_t<double> a({static_cast<py::ssize_t>(s.steps.size()), static_cast<py::ssize_t>(s.layers),
                             static_cast<py::ssize_t>(s.heads)});
      std::copy(s.values[k].begin(), s.values[k].end(), a.mutable_data());
      scores[py::str(s.score_names[k])] = a;
    }
    py::dict r;
    r["steps"] = py::array_t<int64_t>(static_cast<py::ssize_t>(s.steps.size()), s.steps.data());
    r["checkpoints"] = s.checkpoints;
    r["scores"] = scores;
    if (!out.empty()) r["out"] = out;
    return typed_result("ScoresOverTraining", r);
  });
  m.def("head_analyses", [] {
        py::list rows;
        for (const HeadAnalysis& a : head_analyses())
          rows.append(typed_result("HeadAnalysis", py::dict(py::arg("name") = a.name, py::arg("command") = a.command,
                                                            py::arg("scores") = a.scores, py::arg("help") = a.help,
                                                            py::arg("default_examples") = a.default_examples())));
        return rows;
      },
      "The per-head analyses of scores_over_training (and `headlab COMMAND --run`), one HeadAnalysis per analysis: name, "
      "command, scores (the names of the grids it returns), help, default_examples");
  m.def("per_token_loss", [](TransformerLM& model, const py::object& ids, const py::object& targets) {
    const Ids x = ids_from(ids);
    Ids y;
    if (targets.is_none()) {  // next-token: position t predicts ids[t + 1]
      if (x.shape[1] < 2) throw py::value_error("per_token_loss: next-token loss needs at least 2 tokens per row");
      y = Ids(Shape{x.shape[0], x.shape[1] - 1});
      for (int64_t b = 0; b < x.shape[0]; ++b)
        for (int64_t t = 0; t + 1 < x.shape[1]; ++t) y.at(b, t) = x.at(b, t + 1);
    } else {
      y = ids_from(targets, "targets");
      if (y.shape[0] != x.shape[0] || y.shape[1] != x.shape[1])
        throw py::value_error("per_token_loss: targets " + y.shape.str() + " must have the shape of ids " + x.shape.str());
    }
    std::vector<double> loss;
    {
      py::gil_scoped_release release;
      EvalScope mode(model);  // dropout off, as every analysis
      NoGradGuard ng;
      loss = per_token_loss(model.forward(x), y);
    }
    py::array_t<double> a(std::vector<py::ssize_t>{y.shape[0], y.shape[1]});
    std::copy(loss.begin(), loss.end(), a.mutable_data());
    return a;
  }, py::arg("model"), py::arg("ids"), py::arg("targets") = py::none(),
     "Cross-entropy at each position: targets None = next token, (B, T-1); else (B, T) with 0 where the target is -1");
  m.def("evaluate", [](TransformerLM& model, py::object task, py::object data, bool ar) {
    split_task(task, data, "evaluate");
    const DataArg d = data_arg(data, model, "evaluate");
    return eval_result(without_gil([&] { return evaluate(model, d.batches(), ar); }));
  }, py::arg("model"), py::arg("task") = py::none(), py::arg("data") = py::none(), py::arg("autoregressive") = false,
     "An EvalResult: held-out loss, token_acc, exact_match (and ar_exact_match with autoregressive=True) over the data's counted targets");
  // the two importances: (model, data, normalize) -> (L, H) array, computed without the GIL
  auto bind_importance = [&m](const char* name, HeadGrid (*fn)(TransformerLM&, const std::vector<Batch>&, bool),
                              const char* doc) {
    m.def(name, [fn, name](TransformerLM& model, const py::object& data, bool normalize) {
      const DataArg d = data_arg(data, model, name);
      return grid_array(without_gil([&] { return fn(model, d.batches(), normalize); }));
    }, py::arg("model"), py::arg("data"), py::arg("normalize") = false, doc);
  };
  bind_importance("head_importance",
                  [](TransformerLM& model, const std::vector<Batch>& data, bool normalize) {
                    return head_importance(model, data, normalize);
                  },
                  "Michel et al. (2019) importance (L, H): the mean over examples of |dL(x)/d gate_h|, L(x) the example's mean loss");
  bind_importance("head_importance_per_token", head_importance_per_token,
                  "Token-level importance (L, H): |z_h . dL/dz_h| summed over non-padding positions over the counted targets, L the summed loss");
  m.def("single_head_ablation", [](TransformerLM& model, py::object task, py::object data) {
    split_task(task, data, "single_head_ablation");
    const DataArg dt = data_arg(data, model, "single_head_ablation");
    const AblationResult r = without_gil([&] { return single_head_ablation(model, dt.batches()); });
    return grids_result("AblationResult",
                        {{"d_loss", r.d_loss}, {"d_acc", r.d_acc}, {"d_loss_mean", r.d_loss_mean}, {"d_acc_mean", r.d_acc_mean}},
                        py::dict(py::arg("base") = eval_result(r.base)));
  }, py::arg("model"), py::arg("task") = py::none(), py::arg("data") = py::none(),
     "An AblationResult: the change in held-out loss/accuracy when each head alone is zero- or mean-ablated, arrays (L, H)");
  m.def("attention_statistics", [](TransformerLM& model, const py::object& data) {
    const DataArg dt = data_arg(data, model, "attention_statistics");
    const HeadStats s = without_gil([&] { return attention_statistics(model, dt.batches()); });
    return grids_result("HeadStats", {{"entropy", s.entropy}, {"entropy_norm", s.entropy_norm}, {"confidence", s.confidence},
                                      {"argmax_distance", s.argmax_distance}});
  }, py::arg("model"), py::arg("data"),
     "A HeadStats: per head (L, H), over non-padding queries, entropy, entropy_norm, confidence, argmax_distance");
  m.def("prune_curve", [](const TransformerLM& model, py::object task, py::object data_obj, const std::string& order,
                          double step_fraction, int min_per_layer, bool recompute, uint64_t seed) {
    split_task(task, data_obj, "prune_curve");
    const DataArg data = data_arg(data_obj, model, "prune_curve");
    std::unique_ptr<TransformerLM> copy = std::make_unique<TransformerLM>(model.cfg, 0);
    auto to = copy->named_parameters();
    const auto from = model.named_parameters();
    for (size_t i = 0; i < to.size(); ++i) to[i].second.copy_from(from[i].second);
    for (int l = 0; l < model.cfg.n_layers; ++l) copy->gates(l).copy_from(const_cast<TransformerLM&>(model).gates(l));
    std::function<HeadGrid(TransformerLM&)> rank;
    if (order == "importance")
      rank = [&](TransformerLM& m) { return head_importance(m, data.batches(), false); };
    else if (order == "ablation")
      rank = [&](TransformerLM& m) { return single_head_ablation(m, data.batches()).d_loss; };
    else if (order == "random")
      rank = [&](TransformerLM&) { return random_ranking(model.cfg.n_layers, model.cfg.n_heads, seed); };
    else
      throw py::value_error("order must be importance, ablation or random, got '" + order + "'");
    PruneOptions o;
    o.step_fraction = step_fraction;
    o.min_per_layer = min_per_layer;
    o.recompute = recompute;
    const std::vector<PruneStep> steps = without_gil([&] { return prune_curve(*copy, data.batches(), rank, o); });
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
    return typed_result("PruneCurve", d);
  }, py::arg("model"), py::arg("task") = py::none(), py::arg("data") = py::none(), py::arg("order") = "importance", py::arg("step_fraction") = 0.1,
     py::arg("min_per_layer") = 0, py::arg("recompute") = false, py::arg("seed") = 1000,
     "A PruneCurve: accuracy as heads are removed in an order (on a copy; the model is unchanged)");
  m.def("head_gradient_norms", [](const TransformerLM& model) {
    bool any = false;
    for (const auto& [name, p] : model.named_parameters()) any = any || p.grad().defined();
    if (!any)
      throw py::value_error("head_gradient_norms: the model holds no gradients (a training step clears them once "
                            "applied); call it after your own backward, e.g. model.loss(ids, targets).backward()");
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
    return typed_result("HeadGradientNorms", d);
  }, py::arg("model"), "A HeadGradientNorms: the gradient atlas of the current gradients, per-head Frobenius norms (L, H or H_kv) of grads and weights");
  m.def("repeated_random_tokens", [](int n, int k, int vocab, uint64_t seed) { return PyData{repeated_random_tokens(n, k, vocab, seed)}; },
        py::arg("n"), py::arg("k"), py::arg("vocab"), py::arg("seed") = 1234,
        "The fixed probe: n sequences [r_1..r_k, r_1..r_k] of uniform random tokens (every repeat k back)");
  m.def("varied_repeat_probe", [](int n, int k_max, int vocab, uint64_t seed, int32_t bos) {
          return PyData{varied_repeat_probe(n, k_max, vocab, seed, bos)};
        }, py::arg("n"), py::arg("k_max"), py::arg("vocab"), py::arg("seed") = 1234, py::arg("bos") = -1,
        "The probe position cannot fool: rows of 2 k_max random tokens with a block of k_max/2..k_max tokens "
        "repeated at a random place (detect's default)");
  m.def("detect_heads", [](TransformerLM& model, const py::object& data, const std::string& kind, bool exclude_bos,
                           bool exclude_current_token) {
    const Detector d = parse_detector(kind);
    const DataArg dt = data_arg(data, model, "detect_heads");
    const HeadGrid g = interruptible([&] { return detect_heads(model, dt.batches(), d, {exclude_bos, exclude_current_token}); });
    return grid_array(g);
  }, py::arg("model"), py::arg("data"), py::arg("kind") = "induction", py::arg("exclude_bos") = false,
     py::arg("exclude_current_token") = false,
     "TransformerLens-style detector scores (L, H): previous_token, duplicate_token or induction");
  m.def("match_heads", [](TransformerLM& a, TransformerLM& b, const py::object& data, const std::string& by, bool across_layers,
                          int examples, uint64_t seed) {
    const MatchBy how = parse_match_by(by);
    std::vector<Batch> probe;
    std::optional<DataArg> given;
    if (how == MatchBy::Pattern) {
      if (data.is_none()) {
        probe = match_probe(a, b, examples, seed);
      } else {
        given = data_arg(data, a, "match_heads");
        check_data_fits_model(given->batches(), b.cfg, "match_heads");
      }
    }
    const HeadMatch m = interruptible([&] { return match_heads(a, b, given ? given->batches() : probe, {how, across_layers}); });
    py::list pairs, ua, ub;
    for (const HeadPair& p : m.pairs) pairs.append(py::make_tuple(p.layer_a, p.head_a, p.layer_b, p.head_b, p.similarity));
    for (auto [l, h] : m.unmatched_a) ua.append(py::make_tuple(l, h));
    for (auto [l, h] : m.unmatched_b) ub.append(py::make_tuple(l, h));
    py::array_t<double> sim({static_cast<py::ssize_t>(m.similarity.size()),
                             static_cast<py::ssize_t>(m.similarity.empty() ? 0 : m.similarity[0].size())});
    for (size_t i = 0; i < m.similarity.size(); ++i)
      for (size_t j = 0; j < m.similarity[i].size(); ++j) sim.mutable_at(i, j) = m.similarity[i][j];
    py::dict out;
    out["by"] = to_string(how);
    out["pairs"] = pairs;
    out["unmatched_a"] = ua;
    out["unmatched_b"] = ub;
    out["similarity"] = sim;
    out["mean_similarity"] = m.mean_similarity;
    return typed_result("HeadMatch", out);
  }, py::arg("model_a"), py::arg("model_b"), py::arg("data") = py::none(), py::arg("by") = "pattern",
     py::arg("across_layers") = false, py::arg("examples") = 200, py::arg("seed") = 1234,
     "Heads of model_a matched one to one to heads of model_b (Hungarian assignment) by attention pattern on data "
     "(default: the varied repeat probe) or by QK/OV circuit weights; a HeadMatch: pairs (layer_a, head_a, layer_b, head_b, "
     "similarity), unmatched_a, unmatched_b, similarity (heads of A x heads of B, layer-major) and mean_similarity");
  m.def("hungarian", [](const std::vector<std::vector<double>>& cost) { return hungarian(cost); }, py::arg("cost"),
        "Optimal assignment of rows to distinct columns minimising the summed cost; -1 for rows left out (more rows than columns)");
  m.def("permute_heads", [](TransformerLM& model, int layer, const std::vector<int>& perm) { permute_heads(model, layer, perm); },
        py::arg("model"), py::arg("layer"), py::arg("perm"),
        "Reorder the heads of a layer in place (new head h = old head perm[h]); the model computes the same function");
  m.def("activation_patching", [](TransformerLM& model, py::object task, py::object data_obj, uint64_t seed,
                                  std::optional<int> alphabet) -> py::object {
    // (model, clean ids, corrupted ids): the generic form with its defaults
    if (!task.is_none() && !py::isinstance<PyTask>(task) && !data_obj.is_none() && !py::isinstance<PyData>(data_obj) &&
        !py::isinstance<py::dict>(data_obj))
      return py::object(generic_patching(model, task, data_obj, "hook_z", {}, py::none(), py::none(), py::none()));
    const PyTask* t = split_task(task, data_obj, "activation_patching");
    const DataArg data = data_arg(data_obj, model, "activation_patching");
    const Batch& first = data.batches()[0];  // the first batch's rows are patched
    check_fits_in_memory(patching_memory_bytes(model.cfg, first.size(), first.inputs.shape[1]),
                         "activation_patching: data of " + std::to_string(first.size()) + " rows");
    // the symbols a corruption may use: given, the task's, or the model's whole vocabulary
    const int symbols = alphabet ? *alphabet : t ? t->task->symbols() : static_cast<int>(model.cfg.vocab_size);
    if (symbols < 2 || symbols > model.cfg.vocab_size)
      throw py::value_error("activation_patching: alphabet " + std::to_string(symbols) + " must be in 2.." +
                            std::to_string(model.cfg.vocab_size) + " (the model's vocabulary)");
    const PatchingInputs in = corrupt_one_symbol(first, symbols, seed);
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
    return typed_result("PatchingResult", d);
  }, py::arg("model"), py::arg("task") = py::none(), py::arg("data") = py::none(), py::arg("seed") = 1234,
     py::arg("alphabet") = py::none(),
     "A PatchingResult: patching per head (hook_z, (L, H)) and per residual position ((L, T)), exact and attribution, normalised clean=1, corrupted=0");
  // ---- ablations by hook name and generic activation patching ------------------------------------
  m.def("corrupt_one_symbol", [](const PyTask& task, const PyData& data, uint64_t seed, const std::string& corrupt) {
    if (data.batches.empty()) throw py::value_error("corrupt_one_symbol: no data");
    const PatchingInputs in = corrupt_one_symbol(data.batches[0], task.task->symbols(), seed, parse_corruption(corrupt));
    py::dict d;
    d["clean"] = ids_to_array(in.clean);
    d["corrupted"] = ids_to_array(in.corrupted);
    py::array_t<int64_t> answers({static_cast<py::ssize_t>(in.answers.size()), py::ssize_t{4}});
    auto a = answers.mutable_unchecked<2>();
    for (size_t i = 0; i < in.answers.size(); ++i)
      a(i, 0) = in.answers[i].row, a(i, 1) = in.answers[i].pos, a(i, 2) = in.answers[i].clean, a(i, 3) = in.answers[i].corrupted;
    d["answers"] = answers;
    d["source_pos"] = py::array(py::cast(in.source_pos));
    return typed_result("PatchingInputs", d);
  }, py::arg("task"), py::arg("data"), py::arg("seed") = 1234, py::arg("corrupt") = "source",
     "A PatchingInputs: the patching inputs activation_patching(model, task, data) makes from the first batch: clean and corrupted ids "
     "(R, T), answers (R, 4) of (row, pos, clean token, corrupted token), source_pos (R): the position changed. "
     "corrupt='source' changes the answer's earlier occurrence, 'previous' the token before it (which the answer follows)");
  m.def("activation_patching", generic_patching, py::arg("model"), py::arg("clean"), py::arg("corrupted"), py::arg("hook") = "hook_z",
        py::arg("axes") = std::vector<std::string>{}, py::arg("answers") = py::none(), py::arg("metric") = py::none(),
        py::arg("attention_mask") = py::none(),
     "Generic activation patching: for every index over `axes` (layer, head, pos, src_pos) of `hook`, the corrupted run with "
     "the clean activation written there, scored by the restored fraction of the answers' logit difference (or metric(logits)); "
     "an array indexed by the axes. attention_mask (B, T), 1 = token, 0 = padding: rows of different lengths padded on "
     "either side, one mask for both runs; each row is measured as if it ran alone. Answers' pos and the metric's logits are in "
     "the padded columns given; the pos axis (and src_pos) counts each row's tokens from its first (rows left-aligned)");
  m.def("edge_patching", [](TransformerLM& model, const py::object& clean, const py::object& corrupted, const py::object& answers,
                            const std::string& method, int ig_steps, const std::string& ig_interpolate, double acdc_threshold,
                            const std::string& acdc_score, const py::object& target_edges, int prune_steps, double prune_lr,
                            const py::object& attention_mask) {
    EdgeMethodOptions mopt;  // the method's options, checked before the work
    mopt.method = method;
    mopt.ig.steps = ig_steps;
    mopt.ig.interpolate = parse_interpolation(ig_interpolate);
    mopt.acdc.score = parse_acdc_score(acdc_score);
    mopt.acdc.threshold = acdc_threshold;
    mopt.pruning.steps = prune_steps;
    mopt.pruning.lr = prune_lr;
    check_edge_method_options(mopt);
    if (method == "edge-pruning") {  // the target against the model's edges (default: 20 or every edge)
      const size_t n = circuit_edge_count(model.cfg);
      mopt.pruning.target_edges = target_edges.is_none() ? static_cast<int>(std::min<size_t>(20, n)) : cast_arg<int>(target_edges, "target_edges", "an int");
      check_edge_pruning_options(mopt.pruning, n);
    }
    const EdgeModel em = edge_model(model);  // grouped-query models run ungrouped
    const PatchingInputs in = edge_inputs(*em, clean, corrupted, attention_mask, answers, "edge_patching");
    check_fits_in_memory(edge_patching_memory_bytes(model.cfg, in.clean.shape[0], in.clean.shape[1]),
                         "edge_patching: " + std::to_string(in.clean.shape[0]) + " rows");
    const EdgeResult r = interruptible([&] { return edge_patching(*em, in); });
    const MethodScores ms = method == "attribution" ? MethodScores{} : interruptible([&] { return run_edge_method(*em, in, r, mopt); });
    std::vector<std::string> senders, receivers;
    py::array_t<double> exact(static_cast<py::ssize_t>(r.edges.size())), attribution(static_cast<py::ssize_t>(r.edges.size())),
        error(static_cast<py::ssize_t>(r.edges.size()));
    for (size_t i = 0; i < r.edges.size(); ++i) {
      const Edge& e = r.edges[i];
      senders.push_back(e.sender.name());
      receivers.push_back(e.receiver.name());
      exact.mutable_data()[i] = e.exact;
      attribution.mutable_data()[i] = e.attribution;
      error.mutable_data()[i] = e.linearisation_error();
    }
    py::dict d;
    d["senders"] = senders;
    d["receivers"] = receivers;
    d["exact"] = exact;
    d["attribution"] = attribution;
    d["linearisation_error"] = error;
    d["clean_metric"] = r.clean_metric;
    d["corrupted_metric"] = r.corrupted_metric;
    if (!model.saes.empty()) {  // model.add_sae: each hook_z SAE's features that differ, and its error, as senders
      std::vector<std::string> fs, fr;
      std::vector<double> fe, fa;
      for (const AttachedSae& a : model.saes)
        for (const FeatureSenderEdge& e : interruptible([&] { return feature_sender_edges(*em, in, *a.sae); })) {
          fs.push_back(e.sender_name(hook_layer(a.sae->cfg.hook_name)));
          fr.push_back(e.receiver.name());
          fe.push_back(e.exact), fa.push_back(e.attribution);
        }
      d["feature_senders"] = fs;
      d["feature_receivers"] = fr;
      d["feature_exact"] = py::array_t<double>(static_cast<py::ssize_t>(fe.size()), fe.data());
      d["feature_attribution"] = py::array_t<double>(static_cast<py::ssize_t>(fa.size()), fa.data());
    }
    if (!ms.scores.empty()) {  // the method's scores, edge order, under its name; acdc: its circuit
      d[py::str(method)] = py::array_t<double>(static_cast<py::ssize_t>(ms.scores.size()), ms.scores.data());
      if (!ms.circuit.empty()) {
        py::array_t<bool> kept(static_cast<py::ssize_t>(ms.circuit.size()));
        for (size_t i = 0; i < ms.circuit.size(); ++i) kept.mutable_data()[i] = ms.circuit[i];
        d["circuit"] = kept;
        d["circuit_edges"] = circuit_edge_names(em->cfg, ms.circuit, ms.mlp_circuit);  // with its MLP-sender edges
      }
    }
    return typed_result("EdgeResult", d);
  }, py::arg("model"), py::arg("clean"), py::arg("corrupted"), py::kw_only(), py::arg("answers"), py::arg("method") = "attribution",
     py::arg("ig_steps") = 5, py::arg("ig_interpolate") = "inputs", py::arg("acdc_threshold") = 0.1, py::arg("acdc_score") = "metric",
     py::arg("target_edges") = py::none(), py::arg("prune_steps") = 200, py::arg("prune_lr") = 0.1, py::arg("attention_mask") = py::none(),
     "An EdgeResult: exact edge patching and edge attribution of every edge (as headlab edges), senders and receivers (names, in edge "
     "order), exact, attribution and linearisation_error (attribution - exact) arrays, clean_metric and corrupted_metric "
     "(mean logit difference of the answers (row, pos, clean token, corrupted token)). method='eap-ig' (ig_steps, "
     "ig_interpolate 'inputs' or 'activations'), 'atp-star' (AtP*: the QK fix and GradDrop), 'acdc' (acdc_threshold, acdc_score "
     "'metric' or 'kl') or 'edge-pruning' (target_edges, default 20 or every edge; prune_steps, prune_lr) adds that method's "
     "scores under its name (acdc, edge-pruning: also 'circuit', the kept edges, and 'circuit_edges', their names with the "
     "kept MLP-sender edges 'mlp{l}->receiver'), as headlab edges --method. attention_mask (B, T), 1 = token, "
     "0 = padding: rows of different lengths padded on either side, one mask for both runs, each row measured as if alone "
     "(answers' pos in the padded columns given). A grouped-query model (n_kv_heads < n_heads) runs ungrouped: L{l}H{h}.k/.v is "
     "query head h's own copy of its group's key/value input. With SAEs on hook_z attached (model.add_sae), their features "
     "that differ between the runs and each SAE's error are senders too: feature_senders ('L1z.f17', 'L1z.err'), "
     "feature_receivers, feature_exact and feature_attribution");
  m.def("path_patching", [](TransformerLM& model, const py::object& clean, const py::object& corrupted, const std::string& sender,
                            const py::object& receivers, const py::object& answers, const py::object& attention_mask) {
    const EdgeModel em = edge_model(model);  // grouped-query models run ungrouped
    const PatchingInputs in = edge_inputs(*em, clean, corrupted, attention_mask, answers, "path_patching");
    const EdgeSender s = parse_sender(model.cfg, sender);
    std::vector<EdgeReceiver> rs;
    if (receivers.is_none()) rs = readers_of(model.cfg, s);
    else
      for (const std::string& r : cast_arg<std::vector<std::string>>(receivers, "receivers", "a list of str such as ['L1H0.q', 'logits']"))
        rs.push_back(parse_receiver(model.cfg, r));
    const PathPatchingResult p = interruptible([&] { return path_patching(*em, in, s, rs); });
    py::dict d;
    d["path"] = p.path;
    d["activation"] = p.activation;
    d["clean_metric"] = p.clean_metric;
    d["corrupted_metric"] = p.corrupted_metric;
    return typed_result("PathPatchingResult", d);
  }, py::arg("model"), py::arg("clean"), py::arg("corrupted"), py::kw_only(), py::arg("sender"), py::arg("receivers") = py::none(),
     py::arg("answers"), py::arg("attention_mask") = py::none(),
     "A PathPatchingResult: path patching of sender (embed or L{l}H{h}) to receivers (names; default: every reader): path = metric of the clean run "
     "with every receiver reading its input + the sender's corrupted-minus-clean output, minus the clean metric; activation = "
     "the same for the sender's whole output patched; clean_metric, corrupted_metric. attention_mask: as edge_patching's");
  m.def("qk_attribution", [](TransformerLM& model, const py::object& ids_obj, int64_t row, int layer, int head, const py::object& query,
                             const py::object& key, const py::object& answers, const py::object& source_pos, const std::string& key_rule,
                             const std::string& aggregate) {
    const Ids ids = ids_from(ids_obj, "ids");
    QkAttribution a;
    if (!answers.is_none()) {  // a task's sites, aggregated (the same call as headlab qk)
      if (!query.is_none() || !key.is_none())
        throw py::value_error("qk_attribution: give query and key (one site) or answers (a task's sites), not both");
      const QkKeyRule rule = parse_qk_key_rule(key_rule);
      const QkReduce reduce = parse_qk_reduce(aggregate);
      PatchingInputs in;
      in.answers = answers_from(answers, ids, model, "qk_attribution");
      if (rule == QkKeyRule::Source) {
        if (source_pos.is_none())
          throw py::value_error("qk_attribution: key_rule 'source' needs source_pos (per answer, its earlier occurrence: "
                                "hl.corrupt_one_symbol's source_pos)");
        in.source_pos = cast_arg<std::vector<int64_t>>(source_pos, "source_pos", "a list of int, one per answer");
      }
      const std::vector<QkSite> sites = qk_answer_sites(in, rule);
      a = interruptible([&] { return qk_attribution(model, ids, layer, head, sites, reduce); });
    } else {
      if (query.is_none() || key.is_none())
        throw py::value_error("qk_attribution: give query and key (one site), or answers (a task's sites, e.g. hl.corrupt_one_symbol's)");
      a = qk_attribution(model, ids, row, layer, head, cast_arg<int64_t>(query, "query", "int"), cast_arg<int64_t>(key, "key", "int"));
    }
    const auto C = static_cast<py::ssize_t>(a.components.size());
    py::array_t<double> pairs({C, C});
    std::copy(a.pairs.begin(), a.pairs.end(), pairs.mutable_data());
    py::array_t<int64_t> sites({static_cast<py::ssize_t>(a.sites.size()), py::ssize_t{3}});
    for (size_t i = 0; i < a.sites.size(); ++i) {
      sites.mutable_data(i, 0)[0] = a.sites[i].row;
      sites.mutable_data(i, 0)[1] = a.sites[i].query;
      sites.mutable_data(i, 0)[2] = a.sites[i].key;
    }
    py::dict d;
    d["layer"] = a.layer;
    d["head"] = a.head;
    d["components"] = a.components;
    d["pairs"] = pairs;
    d["score"] = a.score;
    d["query_totals"] = py::array(py::cast(a.query_totals()));
    d["key_totals"] = py::array(py::cast(a.key_totals()));
    d["sites"] = sites;
    d["aggregate"] = to_string(a.reduce);
    return typed_result("QkAttribution", d);
  }, py::arg("model"), py::arg("ids"), py::kw_only(), py::arg("row") = 0, py::arg("layer"), py::arg("head"), py::arg("query") = py::none(),
     py::arg("key") = py::none(), py::arg("answers") = py::none(), py::arg("source_pos") = py::none(), py::arg("key_rule") = "source",
     py::arg("aggregate") = "mean",
     "A QkAttribution: head (layer, head)'s scaled attention score split into pairs of upstream components (tok, pos, earlier "
     "heads L{l}H{h}, L{l}.b_O, mlp{l}, bias) through ln1 with its scale frozen (QK-norm's too; rotary parts turned by their "
     "position). One site: query and key of ids' row. A task's sites (as headlab qk): answers (rows of (row, pos, ...): query = "
     "pos) with key_rule 'source' (source_pos, the answer's earlier occurrence, as hl.corrupt_one_symbol gives), 'previous' or "
     "'max', the pairs' aggregate ('mean' or 'sum') over the sites. Fields: components (names), pairs (C, C) [query side, key "
     "side], score (the model's, aggregated the same way: the pairs sum to it), query_totals and key_totals (C), sites (S, 3) "
     "of (row, query, key), aggregate, layer, head");
  m.def("mean_activation", [](TransformerLM& model, const py::object& data_obj, const std::string& hook, bool per_position) {
    const DataArg data = data_arg(data_obj, model, "mean_activation");
    return interruptible([&] { return mean_activation(model, data.batches(), hook, per_position); });
  }, py::arg("model"), py::arg("data"), py::arg("hook"), py::arg("per_position") = false,
     "Mean of a hook's activation over the data's rows (and positions unless per_position): its shape with those axes of size 1");
  m.def("_ablated_activation", [](const ModelConfig& cfg, const std::string& hook, const py::array& x, int head,
                                  const std::vector<int64_t>& positions, const py::object& value) {
    const AblationSite site{hook, head, positions};
    check_ablation_site(cfg, site);
    const Tensor v = value.is_none() ? Tensor() : tensor_from_array(py::array::ensure(value), "ablation value");
    return ablated_activation(tensor_from_array(x, "activation at " + hook), hook_axes(cfg, hook), site, v);
  });
  m.def("_check_ablation_site", [](const ModelConfig& cfg, const std::string& hook, int head, const std::vector<int64_t>& positions) {
    check_ablation_site(cfg, {hook, head, positions});
  });
  m.def("_ablate", [](TransformerLM& model, const py::object& data_obj, const std::string& hook, int head, const std::string& kind,
                     const std::vector<int64_t>& positions, const py::object& mean_data, bool per_position, uint64_t seed,
                     const std::vector<int64_t>& permutation) {
    const DataArg data = data_arg(data_obj, model, "ablate");
    AblationOptions o;
    o.site = {hook, head, positions};
    o.kind = parse_ablation_kind(kind);
    o.per_position = per_position;
    if (!mean_data.is_none()) o.mean_data = data_arg(mean_data, model, "ablate: mean_data").batches();
    o.seed = seed;
    o.permutation = permutation;
    const KnockoutResult r = interruptible([&] { return knockout(model, data.batches(), o); });
    auto interval = [](const Interval& ci) { return py::make_tuple(ci.lo, ci.hi); };
    py::dict d, ci;
    d["clean_loss"] = r.clean_mean_loss;
    d["ablated_loss"] = r.ablated_mean_loss;
    d["clean_token_acc"] = r.clean_token_acc;
    d["ablated_token_acc"] = r.ablated_token_acc;
    d["clean_losses"] = py::array(py::cast(r.clean_loss));
    d["ablated_losses"] = py::array(py::cast(r.ablated_loss));
    d["clean_accs"] = py::array(py::cast(r.clean_acc));
    d["ablated_accs"] = py::array(py::cast(r.ablated_acc));
    d["counted"] = py::array(py::cast(r.counted));
    ci["clean_loss"] = interval(r.clean_loss_ci95);
    ci["ablated_loss"] = interval(r.ablated_loss_ci95);
    ci["d_loss"] = interval(r.d_loss_ci95);
    ci["clean_token_acc"] = interval(r.clean_acc_ci95);
    ci["ablated_token_acc"] = interval(r.ablated_acc_ci95);
    ci["d_token_acc"] = interval(r.d_acc_ci95);
    d["ci95"] = ci;
    if (!r.permutation.empty()) d["permutation"] = py::array(py::cast(r.permutation));
    return typed_result("KnockoutResult", d);
  }, py::arg("model"), py::arg("data"), py::arg("hook"), py::arg("head") = -1, py::arg("kind") = "zero",
     py::arg("positions") = std::vector<int64_t>{}, py::arg("mean_data") = py::none(), py::arg("per_position") = false,
     py::arg("seed") = 0, py::arg("permutation") = std::vector<int64_t>{},
     "A KnockoutResult: ablate a hook point by name (zero, mean or resample; one head or all; some positions or all): clean and ablated loss "
     "and accuracy, per example and overall, with 95% bootstrap intervals");
  m.def("composition_scores", [](const TransformerLM& model, int layer_a, int layer_b, std::optional<int64_t> offset) {
    const CompositionScores c = without_gil([&] { return composition_scores(model, layer_a, layer_b, offset); });
    return grids_result("CompositionScores", {{"q", c.q}, {"k", c.k}, {"v", c.v}});
  }, py::arg("model"), py::arg("layer_a"), py::arg("layer_b"), py::arg("offset") = py::none(),
     "A CompositionScores: Q/K/V composition, q, k, v [head of layer_a][head of layer_b]. On a rotary model Q- and K-composition "
     "use W_QK(offset) = (R(offset) W_Q)^T W_K at the key offset (query position - key position); offset None: their mean over "
     "offsets 0..n_ctx-1, as headlab compose. V-composition is never rotated; other models score the same at every offset");
  m.def("composition_baseline", [](const ModelConfig& cfg, int models, uint64_t seed) {
    if (models < 2) throw py::value_error("composition_baseline: models must be at least 2, got " + std::to_string(models));
    const CompositionBaseline b = without_gil([&] { return composition_baseline(cfg, models, seed); });
    py::dict d;
    const char* kinds[3] = {"q", "k", "v"};
    for (int k = 0; k < 3; ++k) {
      py::dict one;
      one["mean"] = b.mean[k];
      one["lo"] = b.lo[k];
      one["hi"] = b.hi[k];
      d[kinds[k]] = one;
    }
    return typed_result("CompositionBaseline", d);
  }, py::arg("config"), py::arg("models") = 20, py::arg("seed") = 1,
     "A CompositionBaseline: what composition scores random weights of config's shapes get: per kind (q, k, v) the mean and the 2.5th and 97.5th "
     "percentiles (lo, hi) over the head pairs of `models` random 2-layer models");
  m.def("qk_singular_values", [](const TransformerLM& model, int layer, int head, std::optional<int64_t> offset) {
    return qk_circuit_singular_values(model, layer, head, offset);
  }, py::arg("model"), py::arg("layer"), py::arg("head"), py::arg("offset") = py::none(),
     "Singular values (descending) of the head's QK circuit W_Q^T W_K (d_model x d_model, rank <= d_head). On a rotary model "
     "those of W_QK(offset) = (R(offset) W_Q)^T W_K; offset None: the mean of each over offsets 0..n_ctx-1, as the gradient "
     "atlas's circuits.csv");
  m.def("ov_eigenvalues", [](const TransformerLM& model, int layer, int head) {
    const auto ev = ov_circuit_eigenvalues(model, layer, head);
    py::array_t<std::complex<double>> a(static_cast<py::ssize_t>(ev.size()));
    std::copy(ev.begin(), ev.end(), a.mutable_data());
    return a;
  }, py::arg("model"), py::arg("layer"), py::arg("head"),
     "The d_head eigenvalues (complex) of the head's full OV circuit W_U W_O W_V W_E (layer norm weights folded in); the "
     "other vocab - d_head are 0");
  m.def("copying_score", [](const TransformerLM& model, int layer, int head) { return copying_score(model, layer, head); },
        py::arg("model"), py::arg("layer"), py::arg("head"),
        "Re(sum of the OV circuit's eigenvalues) / sum of their |.|: 1 copies, -1 suppresses (Elhage et al. 2021)");
  m.def("ov_singular_values", [](const TransformerLM& model, int layer, int head) { return ov_circuit_singular_values(model, layer, head); },
        py::arg("model"), py::arg("layer"), py::arg("head"),
        "Singular values (descending) of the head's OV circuit W_O W_V (d_model x d_model, rank <= d_head)");
}

}  // namespace hl::bindings
