#include "cli/edge_graph.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "cli/plot.h"
#include "lib/core.h"

namespace hl {

using json = nlohmann::json;

namespace {

// A node name parsed: kind 'e' embed, 'h' head (with component 'q', 'k', 'v' for a receiver's
// input, 0 for a sender), 'm' MLP, 'l' logits. layer: the position in the forward pass of what
// it reads (the logits read after the last layer).
struct Node {
  char kind = 0, component = 0;
  int layer = 0, head = 0;
};

// Integer at s[pos..] (digits only); advances pos; -1 when there is none.
int read_int(const std::string& s, size_t& pos) {
  size_t start = pos;
  while (pos < s.size() && pos - start < 6 && std::isdigit(static_cast<unsigned char>(s[pos]))) ++pos;
  return pos == start || (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) ? -1 : std::stoi(s.substr(start, pos - start));
}

bool parse_node(const std::string& s, bool receiver, const EdgeGraphData& g, Node& n) {
  if (s == "embed" && !receiver) return n.kind = 'e', n.layer = -1, true;
  if (s == "logits" && receiver) return n.kind = 'l', n.layer = g.n_layers, true;
  size_t pos = 0;
  if (s.rfind("mlp", 0) == 0 && receiver && g.has_mlp) {
    pos = 3;
    n.kind = 'm', n.layer = read_int(s, pos);
    return n.layer >= 0 && n.layer < g.n_layers && pos == s.size();
  }
  if (s.empty() || s[0] != 'L') return false;
  pos = 1;
  n.kind = 'h', n.layer = read_int(s, pos);
  if (n.layer < 0 || n.layer >= g.n_layers || pos >= s.size() || s[pos] != 'H') return false;
  ++pos;
  n.head = read_int(s, pos);
  if (n.head < 0 || n.head >= g.n_heads) return false;
  if (!receiver) return pos == s.size();
  if (pos + 2 != s.size() || s[pos] != '.' || std::string("qkv").find(s[pos + 1]) == std::string::npos) return false;
  n.component = s[pos + 1];
  return true;
}

double finite_number(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number()) fail(where, ": \"", key, "\" is missing or not a number");
  const double v = j[key].get<double>();
  if (!std::isfinite(v)) fail(where, ": \"", key, "\" is not finite");
  return v;
}

}  // namespace

EdgeGraphData read_edges_json(const json& j, const std::string& source) {
  EdgeGraphData g;
  if (!j.is_object()) fail(source, ": not an edges.json of headlab edges (expected a JSON object)");
  for (const char* key : {"n_layers", "n_heads"}) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 1 || j[key].get<int64_t>() > 4096)
      fail(source, ": \"", key, "\" is missing or not a positive integer");
  }
  if (!j.contains("has_mlp") || !j["has_mlp"].is_boolean()) fail(source, ": \"has_mlp\" is missing or not true/false");
  if (!j.contains("edges") || !j["edges"].is_array()) fail(source, ": \"edges\" is missing or not a list");
  g.n_layers = j["n_layers"].get<int>(), g.n_heads = j["n_heads"].get<int>(), g.has_mlp = j["has_mlp"].get<bool>();
  g.clean_metric = finite_number(j, "clean_metric", source);
  g.corrupted_metric = finite_number(j, "corrupted_metric", source);
  for (size_t i = 0; i < j["edges"].size(); ++i) {
    const json& e = j["edges"][i];
    const std::string where = source + ": edge " + std::to_string(i);
    if (!e.is_object() || !e.contains("sender") || !e["sender"].is_string() || !e.contains("receiver") || !e["receiver"].is_string())
      fail(where, ": needs \"sender\" and \"receiver\" names");
    EdgeEntry entry{e["sender"].get<std::string>(), e["receiver"].get<std::string>(), finite_number(e, "exact", where),
                    finite_number(e, "attribution", where)};
    Node s, r;
    if (!parse_node(entry.sender, false, g, s))
      fail(where, ": sender '", entry.sender, "' is not embed or L{layer}H{head} of ", g.n_layers, " layers x ", g.n_heads, " heads");
    if (!parse_node(entry.receiver, true, g, r))
      fail(where, ": receiver '", entry.receiver, "' is not L{layer}H{head}.q/.k/.v", g.has_mlp ? ", mlp{layer}" : "",
           " or logits of ", g.n_layers, " layers x ", g.n_heads, " heads");
    // a head writes after its layer's attention: read by later layers' heads, its own layer's MLP on
    const bool written_before = s.kind == 'e' || s.layer < r.layer || (r.kind == 'm' && s.layer == r.layer);
    if (!written_before) fail(where, ": ", entry.sender, " is not written before ", entry.receiver, " reads");
    g.edges.push_back(std::move(entry));
  }
  return g;
}

std::vector<size_t> top_edges(const EdgeGraphData& g, int top) {
  if (top < 1) fail("top edges: ", top, " (give at least 1)");
  std::vector<size_t> order(g.edges.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return std::abs(g.edges[a].exact) > std::abs(g.edges[b].exact); });
  order.resize(std::min(order.size(), static_cast<size_t>(top)));
  return order;
}

json edges_for_page(const EdgeGraphData& g, int top, int keep) {
  json edges = json::array();
  for (size_t i : top_edges(g, std::max(keep, top))) {
    const EdgeEntry& e = g.edges[i];
    edges.push_back({{"sender", e.sender}, {"receiver", e.receiver}, {"exact", e.exact}, {"attribution", e.attribution}});
  }
  return {{"n_layers", g.n_layers}, {"n_heads", g.n_heads}, {"has_mlp", g.has_mlp}, {"clean_metric", g.clean_metric},
          {"corrupted_metric", g.corrupted_metric}, {"total", g.edges.size()}, {"top", top}, {"edges", edges}};
}

void write_edge_graph_png(const json& edges_json, int top, const std::string& png_path) {
  const EdgeGraphData g = read_edges_json(edges_json, "edges");
  const std::vector<size_t> shown = top_edges(g, top);
  const int L = g.n_layers, H = g.n_heads;
  // Layout (the view page's Edges panel uses the same): head (l, h) at (h, l + 1), the MLP of
  // block l beside the heads and a little above (it reads after them), embed and logits centred.
  const double mid = (H - 1) / 2.0;
  auto place = [&](const Node& n) -> std::pair<double, double> {
    if (n.kind == 'e') return {mid, 0};
    if (n.kind == 'l') return {mid, L + 1.0};
    if (n.kind == 'm') return {static_cast<double>(H), n.layer + 1.4};
    return {static_cast<double>(n.head), n.layer + 1.0};
  };
  std::vector<GraphNode> nodes{{mid, 0, "embed"}, {mid, L + 1.0, "logits"}};
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < H; ++h) nodes.push_back({static_cast<double>(h), l + 1.0, "L" + std::to_string(l) + "H" + std::to_string(h)});
    if (g.has_mlp) nodes.push_back({static_cast<double>(H), l + 1.4, "mlp" + std::to_string(l)});
  }
  const int width = std::max(640, 105 * (H + 1) + 60), height = std::max(480, 130 * (L + 2) + 90);
  // The nodes are drawn a fixed number of pixels wide, so the arrows' ends are placed in pixels too:
  // ~16 px below a node's centre, and ~17 px left (q) or right (v) of it.
  const double x_span = (g.has_mlp ? H : std::max(H - 1, 1)) + 1.4, y_span = L + 2.0;
  const double end_dx = 17.0 * x_span / width, end_dy = 16.0 * y_span / height;
  double largest = 0;
  for (size_t i : shown) largest = std::max(largest, std::abs(g.edges[i].exact));
  std::vector<GraphArrow> arrows;
  for (auto it = shown.rbegin(); it != shown.rend(); ++it) {  // the largest drawn last, on top
    const EdgeEntry& e = g.edges[*it];
    Node s, r;
    parse_node(e.sender, false, g, s);
    parse_node(e.receiver, true, g, r);
    auto [x0, y0] = place(s);
    auto [x1, y1] = place(r);
    // q, k and v inputs: the arrow ends at the node's lower left, middle or right, solid, dashed, dotted
    const double dx = r.component == 'q' ? -end_dx : r.component == 'v' ? end_dx : 0;
    const int dash = r.component == 'k' ? 2 : r.component == 'v' ? 3 : 1;
    arrows.push_back({x0, y0 + end_dy, x1 + dx, y1 - end_dy, 0.6 + 5.4 * (largest > 0 ? std::abs(e.exact) / largest : 0),
                      e.exact >= 0 ? "#2166ac" : "#b2182b", dash});
  }
  char line[200];
  std::snprintf(line, sizeof line, "top %zu of %zu edges by |exact|; width: |exact| (largest %.4g)", shown.size(), g.edges.size(), largest);
  const std::vector<std::string> legend{
      line, "blue: exact > 0, red: exact < 0 (the edge carries what the clean answer needs)",
      "receiver's input: q solid, to the node's left; k dashed, middle; v dotted, right"};
  std::ostringstream title;
  title << "Edges: exact edge patching, logit difference (clean " << g.clean_metric << ", corrupted " << g.corrupted_metric << ")";
  plot_graph(png_path, title.str(), nodes, arrows, legend, width, height);
}

}  // namespace hl
