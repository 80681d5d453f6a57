// Pruning heads with hard-concrete L0 gates (Voita et al. 2019): fine-tune a trained model with
// a gate per head and the penalty lambda * (expected number of open heads); heads whose
// evaluation gate is 0 are pruned. `headlab prune --method l0` is flags -> these -> writers.
#pragma once
#include <vector>

#include "analysis/evaluate.h"
#include "models/l0_gates.h"

namespace hl {

struct L0Options {
  double lambda = 0.05;     // weight of the expected number of open heads in the loss
  int steps = 300;          // fine-tuning steps
  float lr = 1e-3f;         // Adam, the model's parameters
  float gate_lr = 0.1f;     // Adam, the gates' log_a
  float init_log_a = 3.f;   // gates start almost surely open: P(g = 1) ~ 0.93
  int batch = 64;
  float clip = 1.f;
  uint64_t seed = 0;
};

struct L0Result {
  double lambda = 0;
  std::vector<std::vector<float>> gates;  // evaluation gates (layers, heads); 0 = pruned
  int heads_kept = 0;
  EvalResult eval;  // held-out, with those gates
};

// Fine-tunes `model` in place; leaves the evaluation gates in it.
L0Result l0_finetune(TransformerLM& model, const Task& task, const std::vector<Batch>& eval_data, const L0Options& o);

}  // namespace hl
