// Pages to look at heads: self-contained HTML (all code and data inlined, no network), made from
// data by both doors: `headlab view` writes the head view to a file, and Python shows it (and
// the small views) inline in a notebook cell.
//   head view   views/head_view.html: attention patterns of a few examples (head view, model
//               view), with the run's curves, gradient atlas, pruning and roles when given
//   small views views/small_view.html: tokens coloured by a per-token value, or a
//               layers x heads grid of any score, with the value on hover
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "models/transformer.h"

namespace hl::views {

// One sequence of the head view: its ids and how each token is written.
struct ViewExample {
  std::string name;
  std::vector<int32_t> ids;
  std::vector<std::string> tokens;  // one text per id
};

// Keeps the page under ~20 MB: shortens the first example when it alone would be larger, then
// keeps as many examples as fit. Returns one line per cut, to tell the user.
std::vector<std::string> fit_examples_to_page(std::vector<ViewExample>& examples, int layers, int heads);

// The examples with their attention patterns, as the page reads them: every head's weights of
// the causal lower triangle quantised to uint16, base64 (an eval-mode forward without a graph).
nlohmann::json head_view_examples(TransformerLM& model, const std::vector<ViewExample>& examples);

// The head view page for `data`: {title, subtitle, layers, heads, examples (head_view_examples)}
// and optional panels (metrics, atlas, entropy, prune_*, roles_*; see views/head_view.html).
// compact: only the head view and the model view, sized for a notebook cell.
std::string head_view_page(nlohmann::json data, bool compact = false);

// Tokens coloured by a value each (loss, direct logit attribution, a patching effect...):
// tokens (T) and values (T) of one sequence; NaN = no value (drawn plain).
// The colour scale of a small view: NaN = the data's own (white at 0, red above, blue below,
// scaled by the largest |value|). Given: values are clamped to [vmin, vmax]; a range of one sign
// runs from white at its end nearer 0, one across 0 is diverging around 0. The same bounds give
// several views one scale.
struct ColourScale {
  double vmin = std::numeric_limits<double>::quiet_NaN(), vmax = std::numeric_limits<double>::quiet_NaN();
};

std::string token_values_page(const std::string& title, const std::vector<std::string>& tokens,
                              const std::vector<double>& values, const std::string& value_name,
                              const ColourScale& scale = {});

// A grid of scores, rows x columns (e.g. layers x heads), values row-major; labels of both axes.
std::string grid_page(const std::string& title, int rows, int cols, const std::vector<double>& values,
                      const std::vector<std::string>& row_labels, const std::vector<std::string>& col_labels,
                      const std::string& value_name, const ColourScale& scale = {});

// The QK attribution panel of the head view from `headlab qk`'s qk.json (`source` names it in
// messages): the head, its components, the pair matrix [query side][key side], each side's
// totals, the score, and how the sites were chosen. Fails naming the file and field when the JSON
// is not of that form or its head is not in a model of cfg's shape.
nlohmann::json qk_panel(const nlohmann::json& qk, const std::string& source, const ModelConfig& cfg);
// A page template (views/*.html or a page of its own, e.g. views/feature_page.cpp) with the
// helpers of every page spliced in at /*HEADLAB_PAGE_HELPERS*/ and `data` (NaN as null, safe
// inside <script>) at /*HEADLAB_DATA*/.
std::string fill_page(std::string_view page_template, const nlohmann::json& data);

}  // namespace hl::views
