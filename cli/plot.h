// PNG plots through gnuplot (Debian's gnuplot-nox, pngcairo terminal). Data go to a temp
// directory, gnuplot writes a temp PNG, which is renamed into place: no half-written plots.
// A plot is part of a command's result: if gnuplot is missing, fails, writes no PNG or outlives
// its time limit (HEADLAB_PLOT_TIMEOUT seconds, default 120), Error is thrown naming the PNG;
// a stop request (Ctrl-C) ends gnuplot and throws Stopped.
#pragma once
#include <string>
#include <vector>

namespace hl {

struct Heatmap {
  std::string title;
  int rows = 0, cols = 0;
  std::vector<float> values;  // row-major
  std::vector<std::string> xlabels, ylabels;  // optional tick labels
};

// A grid of heatmaps (e.g. layers x heads). vmin == vmax: each map scales on its own.
void plot_heatmap_grid(const std::string& path, const std::string& title, int grid_rows, int grid_cols,
                       const std::vector<Heatmap>& maps, const std::string& xlabel,
                       const std::string& ylabel, float vmin = 0.f, float vmax = 0.f);

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::vector<double> lo, hi;  // optional band (min-max over seeds)
};

void plot_lines(const std::string& path, const std::string& title, const std::string& xlabel,
                const std::string& ylabel, const std::vector<Series>& series, bool log_y = false,
                bool log_x = false);

// A drawing of nodes and arrows in data coordinates (e.g. a circuit's edges between heads).
struct GraphNode {
  double x = 0, y = 0;
  std::string label;
};
struct GraphArrow {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  double width = 1;           // line width in points
  std::string color = "#000000";  // "#rrggbb"
  int dash = 1;               // gnuplot dash type: 1 solid, 2 dashed, 3 dotted, ...
};

// Nodes as labelled circles, arrows drawn first (under the nodes); a key of `legend` lines
// under the title. width x height pixels.
void plot_graph(const std::string& path, const std::string& title, const std::vector<GraphNode>& nodes,
                const std::vector<GraphArrow>& arrows, const std::vector<std::string>& legend, int width, int height);

}  // namespace hl
