#include "views/pages.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "lib/core.h"
#include "models/hooks.h"

namespace hl::views {

extern const std::string_view kHeadViewPage, kSmallViewPage;  // views/*.html, embedded by CMake

namespace {

using json = nlohmann::json;

// Patterns above this many bytes (uint16, before base64) take fewer examples: the page of a
// 12-layer x 12-head x 128-token model stays under 20 MB.
constexpr double kMaxPatternBytes = 12e6;

std::string base64(const std::string& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = static_cast<uint8_t>(bytes[i]) << 16 | (i + 1 < bytes.size() ? static_cast<uint8_t>(bytes[i + 1]) << 8 : 0) |
                       (i + 2 < bytes.size() ? static_cast<uint8_t>(bytes[i + 2]) : 0);
    out += abc[n >> 18 & 63];
    out += abc[n >> 12 & 63];
    out += i + 1 < bytes.size() ? abc[n >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? abc[n & 63] : '=';
  }
  return out;
}

// JSON that is safe inside <script>: '<', '>' and '&' only occur in strings, where \u escapes
// mean the same characters, so "</script>" in a token cannot end the element.
std::string script_safe(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else out += c;
  }
  return out;
}

// What both pages' scripts use: $(id), el(tag, attrs, text) (an element with attributes and
// text), and fit_frame(), called once the page is built: inline in a notebook
// (python/headlab/views.py's iframe) the host page learns the page's height, so that the frame
// fits its content instead of clipping it; standalone (no parent) it does nothing.
constexpr std::string_view kPageHelpers = R"JS(const $ = id => document.getElementById(id);
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in (attrs || {})) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function post_height() {
  // a frame the browser has not laid out yet (Chromium skips offscreen cross-origin frames) measures
  // 0: keep the frame's first height until the page is laid out (the observer posts again then)
  const bottom = Math.ceil(document.body.getBoundingClientRect().bottom);
  if (window.parent !== window && bottom > 0) window.parent.postMessage({ headlab_height: bottom + 16 }, "*");
}
function fit_frame() {
  post_height();
  if (window.ResizeObserver) new ResizeObserver(post_height).observe(document.body);
})JS";

// Replaces the page's one `marker` with `text`.
void splice(std::string& page, const std::string& marker, const std::string& text) {
  const size_t at = page.find(marker);
  if (at == std::string::npos) fail("views: the page template has no ", marker, " marker (a build problem)");
  page.replace(at, marker.size(), text);
}

// The page with its helpers and its data in the script element "headlab-data".
std::string fill(std::string_view page_template, const json& data) {
  std::string page(page_template);
  splice(page, "/*HEADLAB_PAGE_HELPERS*/", std::string(kPageHelpers));
  // NaN and infinities are not JSON: the pages read null as "no value"
  splice(page, "/*HEADLAB_DATA*/", script_safe(data.dump(-1, ' ', false, json::error_handler_t::replace)));
  return page;
}

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

std::string fill_page(std::string_view page_template, const json& data) { return fill(page_template, data); }

std::vector<std::string> fit_examples_to_page(std::vector<ViewExample>& examples, int layers, int heads) {
  std::vector<std::string> cuts;
  const double per_pair = 2.0 * layers * heads;  // bytes per (query, key) pair of the causal triangle
  auto bytes_of = [&](size_t T) { return per_pair * static_cast<double>(T) * static_cast<double>(T + 1) / 2; };
  if (!examples.empty()) {
    ViewExample& first = examples[0];
    const size_t T0 = first.ids.size();
    size_t fit = T0;
    while (fit > 1 && bytes_of(fit) > kMaxPatternBytes) --fit;
    if (fit < T0) {
      cuts.push_back("showing the first " + std::to_string(fit) + " of the " + std::to_string(T0) + " tokens of " + first.name +
                     " (the page stays under 20 MB)");
      first.ids.resize(fit);
      first.tokens.resize(fit);
    }
  }
  double bytes = 0;
  size_t keep = 0;
  for (; keep < examples.size(); ++keep) {
    const double b = bytes_of(examples[keep].ids.size());
    if (keep > 0 && bytes + b > kMaxPatternBytes) break;
    bytes += b;
  }
  if (keep < examples.size()) {
    cuts.push_back("showing " + std::to_string(keep) + " of " + std::to_string(examples.size()) +
                   " examples (the page stays under 20 MB)");
    examples.resize(keep);
  }
  return cuts;
}

json head_view_examples(TransformerLM& model, const std::vector<ViewExample>& examples) {
  const ModelConfig& cfg = model.cfg;
  const int L = cfg.n_layers, H = cfg.n_heads;
  json out = json::array();
  EvalScope mode(model);
  NoGradGuard no_grad;
  for (const ViewExample& e : examples) {
    const int64_t T = static_cast<int64_t>(e.ids.size());
    if (T < 1) fail(e.name, ": no tokens to show");
    if (T > cfg.max_seq_len) fail(e.name, ": ", T, " tokens exceed the model's max_seq_len ", cfg.max_seq_len);
    if (e.tokens.size() != e.ids.size()) fail(e.name, ": ", e.tokens.size(), " token texts for ", T, " ids");
    for (int32_t id : e.ids)
      if (id < 0 || id >= cfg.vocab_size) fail(e.name, ": token id ", id, " is outside the vocabulary 0..", cfg.vocab_size - 1);
    // the patterns only: the forward stops after the last block, before the (1, T, vocab) logits
    ActivationCache cache;
    Hooks hooks;
    hooks.cache(cache, names_ending_with("attn.hook_pattern"));
    ForwardOptions opt;
    opt.hooks = &hooks;
    opt.stop_at_layer = L;
    (void)model.forward(Ids(Shape{1, T}, e.ids), opt);
    // uint16 of each weight of the causal lower triangle: (l, h, i, j <= i), little-endian
    std::string q;
    q.reserve(static_cast<size_t>(2 * L * H * T * (T + 1) / 2));
    for (int l = 0; l < L; ++l) {
      const Tensor& p = cache[attn_hook(l, "pattern")];  // (1, H, T, T)
      for (int h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            const float w = p.data()[(h * T + i) * T + j];
            const auto v = static_cast<uint16_t>(std::lround(std::clamp(w, 0.f, 1.f) * 65535.f));
            q += static_cast<char>(v & 0xff);
            q += static_cast<char>(v >> 8);
          }
    }
    out.push_back({{"name", e.name}, {"T", T}, {"tokens", e.tokens}, {"patterns", base64(q)}});
  }
  return out;
}

std::string head_view_page(json data, bool compact) {
  data["compact"] = compact;
  return fill(kHeadViewPage, data);
}

namespace {
void check_scale(const ColourScale& s, const char* what) {
  for (double x : {s.vmin, s.vmax})
    if (std::isinf(x)) fail(what, ": vmin and vmax must be finite numbers, got ", x);
  if (std::isnan(s.vmin) != std::isnan(s.vmax)) fail(what, ": give both vmin and vmax, or neither");
  if (!std::isnan(s.vmin) && !(s.vmin < s.vmax)) fail(what, ": vmin ", s.vmin, " must be below vmax ", s.vmax);
}
}  // namespace

std::string token_values_page(const std::string& title, const std::vector<std::string>& tokens,
                              const std::vector<double>& values, const std::string& value_name,
                              const ColourScale& scale) {
  check_scale(scale, "token view");
  if (tokens.size() != values.size())
    fail("token view: ", tokens.size(), " tokens but ", values.size(), " values (one value per token)");
  json v = json::array();
  for (double x : values) v.push_back(finite_or_null(x));
  return fill(kSmallViewPage, {{"kind", "tokens"}, {"title", title}, {"value_name", value_name}, {"tokens", tokens}, {"values", v},
                               {"vmin", finite_or_null(scale.vmin)}, {"vmax", finite_or_null(scale.vmax)}});
}

std::string grid_page(const std::string& title, int rows, int cols, const std::vector<double>& values,
                      const std::vector<std::string>& row_labels, const std::vector<std::string>& col_labels,
                      const std::string& value_name, const ColourScale& scale) {
  check_scale(scale, "grid view");
  if (rows < 1 || cols < 1) fail("grid view: ", rows, " x ", cols, " has no cells");
  if (values.size() != static_cast<size_t>(rows) * static_cast<size_t>(cols))
    fail("grid view: ", values.size(), " values for ", rows, " x ", cols, " cells");
  if (row_labels.size() != static_cast<size_t>(rows) || col_labels.size() != static_cast<size_t>(cols))
    fail("grid view: ", row_labels.size(), " row and ", col_labels.size(), " column labels for ", rows, " x ", cols, " cells");
  json v = json::array();
  for (double x : values) v.push_back(finite_or_null(x));
  return fill(kSmallViewPage, {{"kind", "grid"}, {"title", title}, {"value_name", value_name}, {"rows", rows}, {"cols", cols},
                               {"row_labels", row_labels}, {"col_labels", col_labels}, {"values", v},
                               {"vmin", finite_or_null(scale.vmin)}, {"vmax", finite_or_null(scale.vmax)}});
}

// ---- the QK attribution panel ----------------------------------------------------------------
json qk_panel(const json& qk, const std::string& source, const ModelConfig& cfg) {
  auto need = [&](const char* field, bool ok) {
    if (!ok) fail(source, ": field '", field, "' is missing or not of headlab qk's form");
  };
  need("layer", qk.is_object() && qk.contains("layer") && qk["layer"].is_number_integer());
  need("head", qk.contains("head") && qk["head"].is_number_integer());
  need("components", qk.contains("components") && qk["components"].is_array() && !qk["components"].empty());
  const size_t C = qk["components"].size();
  bool square = qk.contains("pairs") && qk["pairs"].is_array() && qk["pairs"].size() == C;
  for (size_t i = 0; square && i < C; ++i) {
    const json& row = qk["pairs"][i];
    square = row.is_array() && row.size() == C;
    for (size_t j = 0; square && j < C; ++j) square = row[j].is_number();
  }
  need("pairs", square);
  need("score", qk.contains("score") && qk["score"].is_number());
  need("sites", qk.contains("sites") && qk["sites"].is_array());
  const int layer = qk["layer"], head = qk["head"];
  if (layer < 0 || layer >= cfg.n_layers || head < 0 || head >= cfg.n_heads)
    fail(source, ": head L", layer, "H", head, " is not in the model's ", cfg.n_layers, " layers x ", cfg.n_heads, " heads");
  return {{"layer", layer},
          {"head", head},
          {"components", qk["components"]},
          {"pairs", qk["pairs"]},
          {"score", qk["score"]},
          {"sites", qk["sites"].size()},
          {"key_rule", qk.value("key_rule", std::string("?"))},
          {"aggregate", qk.value("aggregate", std::string("?"))},
          {"data", qk.value("data", std::string("?"))}};
}

}  // namespace hl::views
