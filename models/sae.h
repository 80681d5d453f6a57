// Sparse autoencoders on a hook point's activations, in SAELens's (v6) layout and forward:
//
//   W_enc (d_in, d_sae), b_enc (d_sae), W_dec (d_sae, d_in), b_dec (d_in), threshold (d_sae)
//   pre   = (x - b_dec) W_enc + b_enc        (b_dec subtracted only with apply_b_dec_to_input)
//   f     = act(pre)                          (N, d_sae): the feature activations
//   x_hat = f W_dec + b_dec                   (N, d_in)
//
// The activations, one per architecture: Standard relu (loss: L1 of f weighted by the decoder
// rows' norms), TopK (the k largest pre-activations of each row, then relu), BatchTopK (the
// k*N largest relu(pre) of the whole batch; a single threshold at inference), JumpReLU
// (pre where pre > threshold; loss: L0 through a straight-through step, Rajamanoharan et al.
// 2024). Those four activations are differentiable ops (HEADLAB_SAE_OPS, gradient tests in
// tests/test_sae.cpp, which fails for an op without them).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "lib/ops.h"
#include "lib/optim.h"
#include "models/hooks.h"

namespace hl {

#define HEADLAB_SAE_OPS(X) X(topk_relu) X(topk) X(batch_topk_relu) X(jumprelu) X(jumprelu_step)

// pre (N, d_sae) -> per row the k largest values kept where positive, zeros elsewhere. The
// gradient passes to the kept positive entries.
Tensor topk_relu(const Tensor& pre, int64_t k);
// pre (N, d_sae) -> per row the k largest values kept as they are (negative ones too), zeros
// elsewhere; the gradient passes to the kept entries. AuxK's dead-feature activations: a dead
// feature's pre-activation is often negative everywhere, and relu would leave it no gradient.
Tensor topk(const Tensor& pre, int64_t k);
// pre (N, d_sae) -> relu(pre) with only the k_total largest entries of the whole batch kept.
Tensor batch_topk_relu(const Tensor& pre, int64_t k_total);
// pre (N, d_sae), threshold (d_sae) -> pre * H(pre - threshold). dL/dpre = H(pre - threshold) g;
// dL/dthreshold = -(threshold / bandwidth) K((pre - threshold) / bandwidth) g summed over rows,
// K the rectangle 1{|u| < 1/2}: the straight-through estimator of Rajamanoharan et al. 2024.
Tensor jumprelu(const Tensor& pre, const Tensor& threshold, float bandwidth);
// H(pre - threshold) (the L0 of a JumpReLU SAE): no gradient to pre; dL/dthreshold =
// -(1 / bandwidth) K((pre - threshold) / bandwidth) g summed over rows.
Tensor jumprelu_step(const Tensor& pre, const Tensor& threshold, float bandwidth);

enum class SaeArch { Standard, TopK, BatchTopK, JumpReLU };
SaeArch parse_sae_arch(const std::string& name);  // "standard", "topk", "batchtopk", "jumprelu"
std::string sae_arch_name(SaeArch a);

struct SaeConfig {
  int64_t d_in = 0, d_sae = 0;
  SaeArch arch = SaeArch::TopK;
  int64_t k = 32;            // TopK, BatchTopK: active features per row (on average for BatchTopK)
  float bandwidth = 0.001f;  // JumpReLU: width of the rectangle kernel of the threshold gradient
  float initial_threshold = 0.001f;  // JumpReLU
  bool apply_b_dec_to_input = true;
  // "none", or "layer_norm": each row centred and divided by its standard deviation before the
  // encoder, the reconstruction scaled back (SAELens's normalize_activations "layer_norm", the
  // BatchTopK paper's input_unit_norm). BatchTopK needs it where rows' norms vary: the
  // interference of a row's inactive features grows with its norm, and without it the batch's
  // cut goes to the rows of large norm (tests/test_sae.cpp's planted BatchTopK case).
  std::string normalize_activations = "none";
  std::string hook_name;     // where the activations come from
  // A transcoder (Dunefsky et al. 2024) reads hook_name (an MLP's input) and reconstructs
  // hook_name_out (its output, d_out wide): W_dec (d_sae, d_out), b_dec (d_out), and b_dec is
  // never subtracted from the input. Empty: an autoencoder (d_out = d_in).
  std::string hook_name_out;
  int64_t d_out = 0;
  bool transcoder() const { return !hook_name_out.empty(); }
  int64_t out_width() const { return transcoder() ? d_out : d_in; }
};

// The parameters (leaves requiring grad) and the forward (x_hat: (N, out_width())). JumpReLU trains log_threshold
// (threshold = exp(log_threshold) stays positive), as SAELens does.
struct Sae {
  SaeConfig cfg;
  Tensor W_enc, b_enc, W_dec, b_dec;
  Tensor log_threshold;       // (d_sae), JumpReLU trained here
  Tensor file_threshold;      // (d_sae), JumpReLU read from a file: its thresholds exactly
  Tensor batch_threshold;     // (d_sae) BatchTopK's inference threshold (not trained), else undefined

  // W_dec rows random unit vectors, W_enc = W_dec^T, biases zero (SAELens's initialisation).
  static Sae init(const SaeConfig& cfg, Rng& rng);

  Tensor threshold() const;                 // exp(log_threshold) on the graph, or file_threshold
  bool layer_norm() const { return cfg.normalize_activations == "layer_norm"; }
  // x (N, d_in) as the encoder sees it: itself, or with layer_norm each row (x - mean) / std
  // (std over the row, n - 1 in the denominator, + 1e-5), its std (N, 1) in *scale and its
  // mean (N, 1) in *shift when given (undefined without layer_norm).
  Tensor normalize_input(const Tensor& x, Tensor* scale = nullptr, Tensor* shift = nullptr) const;
  Tensor pre_acts(const Tensor& x) const { return encoder_pre(normalize_input(x)); }  // (N, d_in) -> (N, d_sae)
  // The pre-activations of rows already through normalize_input (what the trainer steps on).
  Tensor encoder_pre(const Tensor& x_normalized) const;
  // f for a training batch (BatchTopK selects over the batch) or, with training false, for
  // inference (BatchTopK applies its threshold, so a row's features do not depend on the others).
  Tensor activate(const Tensor& pre, bool training) const;
  Tensor encode(const Tensor& x) const { return activate(pre_acts(x), false); }
  // (N, d_sae) -> (N, d_in): f W_dec + b_dec, in the normalised units with layer_norm.
  Tensor decode(const Tensor& f) const;
  // The reconstruction of rows x from their features f: decode(f), with layer_norm scaled back
  // by x's std and mean.
  Tensor reconstruct(const Tensor& x, const Tensor& f) const;
  Tensor forward(const Tensor& x) const { return reconstruct(x, encode(x)); }

  std::vector<NamedParam> params() const;
  // Unit-norm decoder rows: the gradient component along each row removed before the step,
  // the rows renormalised after it (SAELens's projected gradient).
  void remove_decoder_parallel_grad() const;
  void normalize_decoder_rows() const;
  Tensor decoder_row_norms() const;  // (d_sae), no graph
};

// A hook point's activation (B, T, ...) as SAE rows (B*T, d_in): the dimensions after (B, T)
// flattened, so blocks.L.attn.hook_z (B, T, H, d_head) gives TransformerLens's hook_z
// concatenated over heads, (B*T, H*d_head). A width other than d_in is an error naming the hook.
Tensor sae_rows(const Tensor& activation, int64_t d_in, const std::string& hook);
// The splice: a forward hook that replaces the activation by the SAE's reconstruction (same
// shape), so every analysis that takes Hooks runs on the model with the SAE in place.
ForwardHook sae_splice(const Sae& sae);
// The splice as hooks: for an autoencoder sae_splice at its hook_name; for a transcoder, its
// output from hook_name's activation replaces hook_name_out's (the MLP's output).
void add_sae_splice(Hooks& hooks, const Sae& sae);
// Where the splice replaces an activation: hook_name_out for a transcoder, else hook_name.
const std::string& sae_output_hook(const Sae& sae);

// An SAE attached to a model (TransformerLM::add_sae), SAELens's HookedSAETransformer: at its
// hook point x, the splice runs the SAE through hook points of its own, named after the hook
// (hook_z's: "blocks.1.attn.hook_z.hook_sae_input" ...), each (B, T, width):
//   hook_sae_input (d_in)        x, rows flattened (hook_z: heads concatenated)
//   hook_sae_acts_pre (d_sae)    the encoder's pre-activations
//   hook_sae_acts_post (d_sae)   the features f: patching or ablating one makes it a node
//   hook_sae_recons (d_in)       x_hat = f W_dec + b_dec (scaled back with layer_norm)
//   hook_sae_error (d_in)        x - x_hat of the unedited features (use_error_term only)
//   hook_sae_output (d_in)       what the model goes on with: x_hat + error, or x_hat alone
// With the error term and nothing replaced, the output is x itself (bit for bit); an edit of
// feature i by delta adds delta W_dec[i] (times the row's std with layer_norm) to it.
Hooks::Splice attached_sae_splice(std::shared_ptr<const Sae> sae, bool use_error_term);
std::vector<HookPointInfo> sae_hook_points(const Sae& sae, bool use_error_term = true);

// SAELens's files: DIR/cfg.json (architecture, d_in, d_sae, apply_b_dec_to_input,
// normalize_activations ("none" or "layer_norm"), hook_name, k; a transcoder's d_out and hook_name_out, its architecture
// transcoder or jumprelu_transcoder as SAELens names them, topk_transcoder for TopK, which
// SAELens's layout has no name for) and DIR/sae_weights.safetensors (W_enc, b_enc, W_dec,
// b_dec, and threshold for JumpReLU; float32). A BatchTopK SAE is written as the JumpReLU
// SAE it is at inference, as SAELens does. Files go through write_file_atomic; the caller
// makes DIR. The reader refuses what it cannot reproduce (another architecture, another
// normalize_activations, shapes that disagree with cfg.json) with one line naming the file and field.
void save_saelens(const Sae& sae, const std::string& dir);
Sae load_saelens(const std::string& dir);

// Weiszfeld's iteration for the point minimising the sum of Euclidean distances to the rows of
// x (N, d): b_dec's initialisation in SAELens. Returns (d).
Tensor geometric_median(const Tensor& x, int max_iters = 100, float tol = 1e-5f);

}  // namespace hl
