#include "lib/stop.h"
#include "train/l0.h"

#include "lib/optim.h"

namespace hl {

L0Result l0_finetune(TransformerLM& model, const Task& task, const std::vector<Batch>& eval_data, const L0Options& o) {
  if (!(o.lambda >= 0) || !std::isfinite(o.lambda)) fail("--lambda must be a finite number >= 0, got ", o.lambda);
  HeadL0Gates gates(model.cfg, o.init_log_a);
  std::vector<NamedParam> params, gate_params;
  for (auto& [name, t] : model.named_parameters()) params.push_back({name, t, false});
  for (size_t l = 0; l < gates.log_a.size(); ++l) gate_params.push_back({"log_a." + std::to_string(l), gates.log_a[l], false});
  Adam opt(params, o.lr), gate_opt(gate_params, o.gate_lr);
  Rng rng(o.seed * 0x9E3779B97F4A7C15ull + 0x10);
  Batch b;
  model.train();
  for (int step = 0; step < o.steps; ++step) {
    throw_if_stopped();
    task.sample_into(b, o.batch, rng);
    gates.sample_into(model, rng);
    ForwardOptions fo;
    fo.key_padding = b.key_padding;
    Tensor loss = cross_entropy(model.forward(b.inputs, fo), b.targets);
    if (o.lambda > 0) loss = add(loss, mul_scalar(gates.penalty(), static_cast<float>(o.lambda)));
    loss.backward();
    if (!std::isfinite(loss.item())) fail("L0 fine-tuning: the loss is ", loss.item(), " at step ", step + 1, "; try a smaller --finetune-lr");
    if (o.clip > 0) clip_grad_norm(params, o.clip);
    opt.step();
    gate_opt.step();
    opt.zero_grad();
    gate_opt.zero_grad();
  }
  gates.eval_into(model);
  L0Result r;
  r.lambda = o.lambda;
  r.gates = model.gate_values();
  for (auto& row : r.gates)
    for (float g : row) r.heads_kept += g > 0.f;
  r.eval = evaluate(model, task, eval_data, false);
  return r;
}

}  // namespace hl
