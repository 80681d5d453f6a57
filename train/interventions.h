// Interventions on single heads for counterfactual forks of a run (`headlab train --fork`): a
// run continued from one of its snapshots with one head gated off, frozen or re-initialised,
// everything else (data order, RNG, schedule) as in the original. Stored in the fork's settings
// as text ("1.0=0" gate, "0.1" freeze or reinit) and reapplied when the fork resumes.
#pragma once
#include <string>
#include <vector>

#include "lib/optim.h"
#include "models/transformer.h"

namespace hl {

struct HeadIntervention {
  enum Kind { Gate, Freeze, Reinit } kind = Gate;
  int layer = 0, head = 0;
  float value = 0.f;  // Gate: the gate's value (0 = the head's output is removed)
};
// "L.H=V" for gate, "L.H" for freeze and reinit; fails naming `flag` and the text.
HeadIntervention parse_intervention(HeadIntervention::Kind kind, const std::string& text, const std::string& flag);
std::string to_string(const HeadIntervention& i);  // the text parse_intervention reads
// Every intervention of a run's settings (gate, freeze, reinit texts), checked against `cfg`:
// a layer or head out of range, a head named twice for the same kind, freeze or reinit in a
// model whose heads share key/value heads -> one message naming the flag.
std::vector<HeadIntervention> parse_interventions(const std::vector<std::string>& gate, const std::vector<std::string>& freeze,
                                                  const std::vector<std::string>& reinit, const ModelConfig& cfg);

// The elements one head owns: rows h*d_head..(h+1)*d_head-1 of W_Q, W_K, W_V (and their
// biases), columns of W_O (W_O's bias is shared by all heads and not included).
struct HeadSlice {
  std::string name;              // the parameter's name, e.g. blocks.0.attn.W_Q.weight
  Tensor param;
  std::vector<int64_t> indices;  // flat indices into param
};
std::vector<HeadSlice> head_slices(TransformerLM& model, int layer, int head);

// Applies the interventions to a training model: gates set; frozen heads' values kept (call
// keep_frozen before training and after each optimizer step; zero_frozen_grads before clipping,
// so the frozen head adds nothing to the global norm); reinit (once, at the fork) draws the
// head's slices again as the model's initialiser does (normal, std 0.02; biases 0) from a
// generator seeded with (seed, layer, head) and zeroes the optimizer's state of those elements.
class HeadInterventions {
 public:
  HeadInterventions() = default;
  HeadInterventions(TransformerLM& model, std::vector<HeadIntervention> list);
  bool empty() const { return list_.empty(); }
  void set_gates(TransformerLM& model) const;
  void reinit(TransformerLM& model, Optimizer& opt, uint64_t seed) const;
  void remember_frozen();  // the values freeze keeps: those of now
  void zero_frozen_grads() const;
  void restore_frozen() const;
  const std::vector<HeadIntervention>& list() const { return list_; }

 private:
  std::vector<HeadIntervention> list_;
  std::vector<HeadSlice> frozen_;
  std::vector<std::vector<float>> frozen_values_;
};

}  // namespace hl
