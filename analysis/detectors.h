// Head detectors, computed as TransformerLens's head_detector does: for a head's attention
// pattern A (T x T, rows = queries) and a 0/1 detection pattern D of the same tokens,
//   score = sum(A * D) / sum(A),
// after zeroing A's first column (exclude_bos) and its diagonal (exclude_current_token);
// averaged over sequences. With no exclusion every row of A sums to 1, so the score is the
// average share of each query's attention on the pattern's cells: 1 = all of it.
#pragma once
#include <string>
#include <vector>

#include "analysis/heads.h"

namespace hl {

enum class Detector {
  PreviousToken,   // D[i][i-1] = 1
  DuplicateToken,  // D[i][j] = 1 for j < i with token j == token i
  Induction,       // D[i][j] = 1 for 1 <= j <= i with token j-1 == token i and j-1 < i
};
std::string to_string(Detector d);                // "previous_token", "duplicate_token", "induction"
Detector parse_detector(const std::string& name);  // fails listing the names

struct DetectorOptions {
  bool exclude_bos = false;            // zero attention to position 0 before scoring
  bool exclude_current_token = false;  // zero attention of each token to itself
};

// D (T x T, row-major) of `kind` for one sequence.
std::vector<float> detection_pattern(Detector kind, const std::vector<int32_t>& tokens);
// The score of one head's pattern A (T x T) against D (T x T); 0 when no attention is left.
double detection_score(const float* A, const float* D, int64_t T, const DetectorOptions& opt);

// Scores (layers x heads) over every sequence of `data` (padding excluded). `pattern`, when given,
// is a user's D for every sequence (T_max x T_max, cut to each row's length) instead of `kind`'s.
// With per_sequence, each sequence's own scores too (their mean is the result), e.g. for intervals.
HeadGrid detect_heads(TransformerLM& model, const std::vector<Batch>& data, Detector kind, const DetectorOptions& opt,
                      const std::vector<float>& pattern = {}, int64_t pattern_T = 0,
                      std::vector<HeadGrid>* per_sequence = nullptr);
// Several detectors from one forward per batch: result[k] (and (*per_sequence)[k]) for kinds[k]
// (with `pattern`, one result, the pattern's).
std::vector<HeadGrid> detect_heads(TransformerLM& model, const std::vector<Batch>& data, const std::vector<Detector>& kinds,
                                   const DetectorOptions& opt, const std::vector<float>& pattern = {}, int64_t pattern_T = 0,
                                   std::vector<std::vector<HeadGrid>>* per_sequence = nullptr);

// The fixed probe: n sequences [r_1..r_k, r_1..r_k] of tokens uniform in [0, vocab), in
// batches of up to 64, from `seed`. Every repeat is k back: a head that always attends k - 1
// back scores as an induction head on it.
std::vector<Batch> repeated_random_tokens(int n, int k, int vocab, uint64_t seed);

// The probe position cannot fool (detect's default): n rows of 2 k_max random tokens in which a
// block of k random tokens, k uniform in [max(2, k_max / 2), k_max], is repeated right after
// itself at a random start, so the distance back to the earlier copy changes from row to row.
// With bos >= 0 every row starts with that token (T = 2 k_max + 1). Next-token targets on the
// second copy. Batches of up to 64, from `seed`.
std::vector<Batch> varied_repeat_probe(int n, int k_max, int vocab, uint64_t seed, int32_t bos = -1);

}  // namespace hl
