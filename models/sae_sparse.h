// The sparse training loss of TopK and BatchTopK SAEs (models/sae.h): after the encoder's dense
// product and the selection, a row has k active features of d_sae, so
//
//   x_hat_r   = b_dec + sum_{j active in r} f_rj W_dec[j]        (k gathered rows, not f W_dec)
//   dW_dec[j] = sum_{r: j active} f_rj dx_hat_r                   (k rows per token, scattered)
//   dpre_rj   = dx_hat_r . W_dec[j], only at the active entries
//   dW_enc    = in^T dpre, dpre k-sparse per row: per feature, over the rows where it is active
//   db_dec   -= W_enc (sum_r dpre_r)                              (apply_b_dec_to_input)
//
// and AuxK's dead-feature reconstruction likewise over its k_aux selection. Nothing after the
// encoder's product is d_sae wide per row: O(N k d) instead of the dense O(N d_sae d) products
// (3 of the dense step's 4 big products are gone). The loss, gradients and updated weights
// equal the dense autograd step's (SaeTrainer with sparse_kernels off) within float32 rounding
// (tests/test_sae.cpp); the selections are the same sets (the same pre-activations bit for bit,
// ties broken by index). Sums run per row or per feature in row order: the result is the same
// for any thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "models/sae.h"

namespace hl {

// The k largest of row[0..D) by (value descending, index ascending), their indices ascending
// into out (k of them). `at`, if given, maps the scanned positions to the indices written (a
// row read at some columns only, AuxK's dead features; ascending, so the ordering by position is
// the ordering by index). Scratch is per thread (reused: no allocation once grown). NaN ranks below
// -inf. About 3 vectorised passes over the row: no sort (models/sae_sparse.cpp).
void select_row_topk(const float* row, int64_t D, int64_t k, int32_t* out, const int32_t* at = nullptr);

// Buffers of the sparse loss, kept across steps (the steady state allocates nothing) and read
// by its backward; one loss per workspace may wait for its backward at a time (checked).
struct SaeSparseWork;
std::shared_ptr<SaeSparseWork> make_sae_sparse_work();

// AuxK (Gao et al. 2024): the dead features' k_aux largest pre-activations per row (of any sign)
// reconstruct the detached residual target - x_hat; its loss weighted by `weight`.
struct SaeAuxK {
  const std::vector<bool>* dead = nullptr;  // (d_sae); null or none dead: no AuxK
  int64_t k_aux = 0;                        // capped at the number of dead features
  float weight = 0.f;
};

struct SaeSparseLoss {
  Tensor loss;    // () mse + aux.weight * aux: its backward fills W_enc, b_enc, W_dec, b_dec's gradients
  float mse = 0;  // mean over rows of the summed squared error
  float aux = 0;  // AuxK's mean summed squared error, unweighted (0 without AuxK)
  Tensor err;     // (N, out_width) x_hat - target
  // The active features (f > 0) row by row: row r's are index[row_start[r] .. row_start[r + 1])
  // with values value[...]; views into the workspace, valid until its next loss.
  std::span<const int64_t> row_start;
  std::span<const int32_t> index;
  std::span<const float> value;
};

// The training loss of a TopK or BatchTopK (training: k * N over the batch) SAE on rows x
// (N, d_in) reconstructing target (N, out_width), with the sparse forward and backward above.
SaeSparseLoss sae_sparse_loss(const Sae& sae, const Tensor& x, const Tensor& target, const SaeAuxK& aux,
                              const std::shared_ptr<SaeSparseWork>& work);

}  // namespace hl
