// The edges of a circuit (edges.json of `headlab edges`) as a picture: the top edges by |exact|
// between nodes laid out by layer (embed at the bottom, each layer's heads in a row with its MLP
// beside them, logits at the top). The view page draws the same graph in its "Edges" panel.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hl {

struct EdgeEntry {
  std::string sender, receiver;  // "embed" / "L0H3"; "L1H2.k" / "mlp1" / "logits"
  double exact = 0, attribution = 0;
};

struct EdgeGraphData {
  int n_layers = 0, n_heads = 0;
  bool has_mlp = false;
  double clean_metric = 0, corrupted_metric = 0;
  std::vector<EdgeEntry> edges;
};

// edges.json checked (node names within the model's layers and heads, each edge from a sender
// written before its receiver reads, finite numbers); fails naming `source` and what is wrong.
EdgeGraphData read_edges_json(const nlohmann::json& edges_json, const std::string& source);

// Indices of the `top` edges with the largest |exact|, largest first (ties: file order).
std::vector<size_t> top_edges(const EdgeGraphData& graph, int top);

// What the view page's Edges panel draws: the graph's sizes and metrics, "total" (edges in the
// file), "top" (how many the panel draws first) and the `keep` largest edges by |exact|, largest
// first (the page offers up to those: a page of a large model's every edge would be too big).
nlohmann::json edges_for_page(const EdgeGraphData& graph, int top, int keep = 500);

// The top edges as a PNG (gnuplot, cli/plot.h): width by |exact|, colour by its sign, the q / k / v
// input told apart by the arrow's end and dash. Bad JSON or top < 1 fails (hl::Error); a
// missing gnuplot is a warning, as for every plot.
void write_edge_graph_png(const nlohmann::json& edges_json, int top, const std::string& png_path);

}  // namespace hl
