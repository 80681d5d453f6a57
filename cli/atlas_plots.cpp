// The gradient atlas's pictures: heatmaps of per-head gradient norms over training and the
// attention entropy curves, drawn from the rows train/atlas.h collected.
#include "cli/atlas_plots.h"

#include <cmath>
#include <map>
#include <sstream>

#include "cli/plot.h"

namespace hl {

void draw_gradient_atlas(const GradAtlas& atlas) {
  const std::string& dir = atlas.out();
  const std::vector<std::string>& norm_rows = atlas.norm_rows();
  const std::vector<std::string>& entropy_rows = atlas.entropy_rows();
  if (norm_rows.empty()) return;
  // Heatmaps of gradient norm: rows = layer.head, columns = logged steps, one per matrix.
  std::map<std::string, std::map<std::pair<int, int>, std::vector<double>>> by_matrix;
  std::vector<int64_t> steps;
  for (const std::string& line : norm_rows) {
    std::stringstream ss(line);
    std::string f[6];
    for (auto& x : f) std::getline(ss, x, ',');
    const int64_t step = std::stoll(f[0]);
    if (steps.empty() || steps.back() != step) steps.push_back(step);
    by_matrix[f[3]][{std::stoi(f[1]), std::stoi(f[2])}].push_back(std::stod(f[4]));
  }
  std::vector<Heatmap> maps;
  for (const char* m : {"W_Q", "W_K", "W_V", "W_O"}) {
    Heatmap hm;
    hm.title = std::string(m) + " gradient norm (log10)";
    for (auto& [lh, values] : by_matrix[m]) {
      hm.ylabels.push_back(std::to_string(lh.first) + "." + std::to_string(lh.second));
      for (double v : values) hm.values.push_back(static_cast<float>(std::log10(v + 1e-12)));
      hm.cols = static_cast<int>(values.size());
      ++hm.rows;
    }
    const size_t stride = std::max<size_t>(1, steps.size() / 8);
    for (size_t i = 0; i < steps.size(); ++i) hm.xlabels.push_back(i % stride == 0 ? std::to_string(steps[i]) : "");
    maps.push_back(hm);
  }
  plot_heatmap_grid(dir + "/grad_atlas.png", "Per-head gradient norms over training", 2, 2, maps, "step",
                    "layer.head");
  if (!entropy_rows.empty()) {
    std::map<std::pair<int, int>, Series> series;
    for (const std::string& line : entropy_rows) {
      std::stringstream ss(line);
      std::string f[5];
      for (auto& x : f) std::getline(ss, x, ',');
      Series& s = series[{std::stoi(f[1]), std::stoi(f[2])}];
      s.name = "L" + f[1] + "H" + f[2];
      s.x.push_back(std::stod(f[0]));
      s.y.push_back(std::stod(f[4]));
    }
    std::vector<Series> all;
    for (auto& [k, s] : series) all.push_back(s);
    plot_lines(dir + "/attn_entropy.png", "Attention entropy per head (normalised)", "step",
               "entropy / log(visible keys)", all);
  }
}

}  // namespace hl
