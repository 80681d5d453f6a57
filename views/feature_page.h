// The feature view: a self-contained page (like the head view, no network) of an SAE's
// features (analysis/feature_study.h): per feature its top-activating examples with tokens
// coloured by its activation, the source-position attribution of each example's largest
// activation, the split of its decoder over the heads, the tokens its direct logit effect
// promotes and suppresses, and its ablation effect on the loss. `headlab features` writes it;
// Python shows it inline.
#pragma once
#include <functional>
#include <string>

#include "analysis/feature_study.h"

namespace hl::views {

// The page; token_text writes a token (the task's or tokenizer's text). compact: sized for a notebook cell.
std::string feature_page(const FeatureStudy& s, const std::string& title, const std::function<std::string(int32_t)>& token_text,
                         bool compact = false);

}  // namespace hl::views
