#include "views/feature_page.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>

#include "views/pages.h"

namespace hl::views {

namespace {

using json = nlohmann::json;

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// The page: one card per feature. Every text from the data is set with textContent.
constexpr std::string_view kFeaturePage = R"HTML(<!DOCTYPE html>
<!-- The feature view (views/feature_page.cpp): self-contained, no network. -->
<html lang="en">
<head>
<meta charset="utf-8">
<link rel="icon" href="data:,">
<title>headlab features</title>
<style>
  body { font: 13px system-ui, sans-serif; margin: 4px 8px; color: #222; }
  h1 { font-size: 15px; margin: 0 0 4px; }
  h2 { font-size: 14px; margin: 14px 0 4px; border-top: 1px solid #ddd; padding-top: 8px; }
  .sub { color: #555; margin-bottom: 8px; }
  .tok { font: 12px monospace; padding: 1px 2px; margin: 1px 1px 1px 0; white-space: pre; border-radius: 2px; }
  .max { outline: 1px solid #333; }
  .ex { line-height: 22px; margin: 2px 0; }
  .lbl { display: inline-block; width: 110px; color: #666; font-size: 11px; }
  .bar { display: inline-block; height: 10px; background: #c33; vertical-align: middle; }
  .cols { display: flex; gap: 28px; flex-wrap: wrap; }
  table { border-collapse: collapse; font-size: 12px; }
  td { padding: 0 6px; }
  #info { position: sticky; bottom: 0; background: #fff; font: 12px monospace; min-height: 16px; padding: 4px 0; }
</style>
</head>
<body>
<h1 id="title"></h1>
<div class="sub" id="subtitle"></div>
<div id="cards"></div>
<div id="info">hover a token for its values</div>
<script id="headlab-data" type="application/json">/*HEADLAB_DATA*/</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("headlab-data").textContent);
/*HEADLAB_PAGE_HELPERS*/
$("title").textContent = D.title;
$("subtitle").textContent = D.subtitle;
const fmt = v => v === null ? "none" : String(+v.toPrecision(4));
function hover(node, text) {
  node.title = text;
  node.addEventListener("mouseenter", () => { $("info").textContent = text; });
}
// white at 0, red above (scaled by `top`), blue below
function colour(v, top) {
  if (v === null) return "#f4f4f4";
  const t = Math.min(1, Math.abs(v) / (top || 1)), c = Math.round(255 * (1 - 0.8 * t));
  return v >= 0 ? `rgb(255, ${c}, ${c})` : `rgb(${c}, ${c}, 255)`;
}
for (const f of D.features) {
  const card = el("div", { class: "card", id: "feature-" + f.feature });
  card.append(el("h2", {}, `feature ${f.feature}`));
  card.append(el("div", { class: "sub" }, `fires on ${fmt(100 * f.firing_frequency)}% of tokens, mean activation ${fmt(f.mean_activation)}` +
    (f.ablation === null ? "" : `; ablated, the loss changes by ${fmt(f.ablation)}`)));
  const cols = el("div", { class: "cols" });
  if (f.head_fraction.length) {
    const t = el("table", { class: "heads" });
    const head = el("tr");
    head.append(el("td", { colspan: 2 }, "decoder norm per head"));
    t.append(head);
    f.head_fraction.forEach((v, h) => {
      const r = el("tr");
      r.append(el("td", {}, `H${h}`));
      const c = el("td");
      c.append(el("span", { class: "bar", style: `width: ${Math.round(120 * v)}px` }));
      c.append(el("span", {}, " " + fmt(v)));
      r.append(c);
      t.append(r);
    });
    cols.append(t);
  }
  for (const [name, list] of [["promotes", f.promoted], ["suppresses", f.suppressed]]) {
    if (!list.length) continue;
    const t = el("table", { class: name });
    const head = el("tr");
    head.append(el("td", { colspan: 2 }, `${name} (logit per unit)`));
    t.append(head);
    for (const p of list) {
      const r = el("tr");
      r.append(el("td", { class: "tok" }, p.token));
      r.append(el("td", {}, fmt(p.logit)));
      t.append(r);
    }
    cols.append(t);
  }
  card.append(cols);
  let top = 0;
  for (const e of f.examples) for (const a of e.activations) top = Math.max(top, a);
  for (const e of f.examples) {
    const line = el("div", { class: "ex" });
    line.append(el("span", { class: "lbl" }, `row ${e.row}, max ${fmt(e.max)}`));
    e.tokens.forEach((tok, i) => {
      const s = el("span", { class: "tok" + (e.start + i === e.position ? " max" : "") }, tok);
      s.style.background = colour(e.activations[i], top);
      hover(s, `${JSON.stringify(tok)} activation ${fmt(e.activations[i])}`);
      line.append(s);
    });
    card.append(line);
    if (e.source.length) {
      const src = el("div", { class: "ex source" });
      src.append(el("span", { class: "lbl" }, "by source"));
      let m = 0;
      for (const v of e.source) if (v !== null) m = Math.max(m, Math.abs(v));
      e.tokens.forEach((tok, i) => {
        const s = el("span", { class: "tok" }, tok);
        s.style.background = colour(e.source[i], m);
        hover(s, `source ${JSON.stringify(tok)}: ${fmt(e.source[i])} of the max's pre-activation` +
          ` (heads: ${e.by_head.map((v, h) => `H${h} ${fmt(v)}`).join(", ")}; bias ${fmt(e.bias)})`);
        src.append(s);
      });
      card.append(src);
    }
  }
  $("cards").append(card);
}
document.body.setAttribute("data-ready", "1");  // for tests: the page is built
fit_frame();
</script>
</body>
</html>
)HTML";

}  // namespace

std::string feature_page(const FeatureStudy& s, const std::string& title, const std::function<std::string(int32_t)>& token_text,
                         bool compact) {
  json features = json::array();
  for (const FeatureCard& c : s.cards) {
    json promoted = json::array(), suppressed = json::array(), examples = json::array();
    for (const auto& [t, v] : c.promoted) promoted.push_back({{"token", token_text(t)}, {"id", t}, {"logit", num(v)}});
    for (const auto& [t, v] : c.suppressed) suppressed.push_back({{"token", token_text(t)}, {"id", t}, {"logit", num(v)}});
    for (const FeatureCard::Example& e : c.examples) {
      json tokens = json::array(), acts = json::array(), source = json::array(), by_head = json::array();
      for (int32_t t : e.top.tokens) tokens.push_back(token_text(t));
      for (double v : e.top.activations) acts.push_back(num(v));
      for (double v : e.source) source.push_back(num(v));
      for (double v : e.by_head) by_head.push_back(num(v));
      examples.push_back({{"row", e.top.row}, {"position", e.top.position}, {"start", e.top.window_start}, {"max", num(e.top.max_activation)},
                          {"tokens", tokens}, {"activations", acts}, {"source", source}, {"by_head", by_head}, {"bias", num(e.bias)}});
    }
    features.push_back({{"feature", c.feature}, {"firing_frequency", num(c.firing_frequency)}, {"mean_activation", num(c.mean_activation)},
                        {"head_fraction", c.head_fraction}, {"promoted", promoted}, {"suppressed", suppressed},
                        {"ablation", num(c.ablation_loss_change)}, {"examples", examples}});
  }
  std::string subtitle = "SAE on " + s.hook + ": " + std::to_string(s.d_sae) + " features, read over " + std::to_string(s.tokens) +
                         " tokens";
  if (std::isfinite(s.base_loss)) subtitle += "; loss with nothing ablated " + std::to_string(s.base_loss);
  return fill_page(kFeaturePage, {{"title", title}, {"subtitle", subtitle}, {"heads", s.heads}, {"compact", compact}, {"features", features}});
}

}  // namespace hl::views
