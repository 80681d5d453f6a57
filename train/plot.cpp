#include "train/plot.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace hl {

namespace fs = std::filesystem;

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '_') out += "\\\\";  // gnuplot enhanced text: literal underscore
    out += c;
  }
  return out + "\"";
}

// Runs a gnuplot script that writes `tmp_png`, then renames it to `path`.
bool run_gnuplot(const std::string& script, const std::string& path, const fs::path& dir) {
  const fs::path script_path = dir / "plot.gp";
  std::ofstream(script_path) << script;
  const std::string cmd = "gnuplot " + script_path.string() + " > " + (dir / "gnuplot.log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const fs::path tmp_png = dir / "out.png";
  if (rc != 0 || !fs::exists(tmp_png)) {
    std::ifstream log(dir / "gnuplot.log");
    std::stringstream ss;
    ss << log.rdbuf();
    std::fprintf(stderr, "warning: could not draw %s (gnuplot %s): %s\n", path.c_str(),
                 rc == 127 || rc == 32512 ? "not installed" : "failed", ss.str().substr(0, 300).c_str());
    fs::remove_all(dir);
    return false;
  }
  std::error_code ec;
  fs::rename(tmp_png, path, ec);
  if (ec) {  // across filesystems: copy next to the target, then rename
    const std::string near = path + ".tmp";
    fs::copy_file(tmp_png, near, fs::copy_options::overwrite_existing);
    fs::rename(near, path);
  }
  fs::remove_all(dir);
  return true;
}

fs::path make_tmp_dir() {
  static int counter = 0;
  fs::path d = fs::temp_directory_path() /
               ("headlab-plot-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::create_directories(d);
  return d;
}

std::string tics(const char* axis, const std::vector<std::string>& labels) {
  if (labels.empty()) return "";
  std::string s = std::string("set ") + axis + "tics (";
  for (size_t i = 0; i < labels.size(); ++i) s += (i ? ", " : "") + quote(labels[i]) + " " + std::to_string(i);
  return s + ")\n";
}

}  // namespace

bool plot_heatmap_grid(const std::string& path, const std::string& title, int grid_rows, int grid_cols,
                       const std::vector<Heatmap>& maps, const std::string& xlabel,
                       const std::string& ylabel, float vmin, float vmax) {
  const fs::path dir = make_tmp_dir();
  // Panel size: small grids (layers x heads) get ~40 px per cell, token maps ~14 px.
  const int m = maps.empty() ? 8 : std::max(maps[0].rows, maps[0].cols);
  const int cell = m <= 16 ? std::clamp(40 * m + 140, 260, 600) : std::clamp(14 * m + 120, 220, 420);
  std::ostringstream gp;
  const double aspect = maps.empty() ? 1.0 : std::min(1.0, static_cast<double>(maps[0].rows) / std::max(1, maps[0].cols));
  // Square cells, unless the map is so wide (a few heads over hundreds of steps) that square
  // cells would make a strip: then the panel keeps a height of 0.4 its width.
  const double shown = std::max(aspect, 0.4);
  const int panel_h = static_cast<int>(cell * shown) + (shown < 1.0 ? 130 : 0);
  gp << "set terminal pngcairo size " << grid_cols * cell + 80 << "," << grid_rows * panel_h + 60
     << " font 'sans,8'\nset output '" << (dir / "out.png").string() << "'\n"
     << "set palette defined (0 '#ffffff', 0.25 '#c6dbef', 0.5 '#6baed6', 0.75 '#2171b5', 1 '#08306b')\n"
     << "set multiplot layout " << grid_rows << "," << grid_cols << " title " << quote(title) << "\n"
     << (aspect < shown ? "set size ratio " + std::to_string(shown) : std::string("set size ratio -1")) << "\nset tics scale 0\n";
  for (size_t m = 0; m < maps.size(); ++m) {
    const Heatmap& h = maps[m];
    const fs::path data = dir / ("m" + std::to_string(m) + ".dat");
    std::ofstream f(data);
    for (int r = 0; r < h.rows; ++r) {
      for (int c = 0; c < h.cols; ++c) f << h.values[static_cast<size_t>(r) * h.cols + c] << (c + 1 < h.cols ? " " : "\n");
    }
    gp << "set title " << quote(h.title) << "\n"
       << "set xrange [-0.5:" << h.cols - 0.5 << "]\nset yrange [" << h.rows - 0.5 << ":-0.5]\n"
       << "set xlabel " << quote(xlabel) << "\nset ylabel " << quote(ylabel) << "\n"
       << (h.xlabels.empty() ? "set xtics autofreq\n" : tics("x", h.xlabels))
       << (h.ylabels.empty() ? "set ytics autofreq\n" : tics("y", h.ylabels)) << "set xtics rotate by 90 right\n";
    if (vmax > vmin) gp << "set cbrange [" << vmin << ":" << vmax << "]\n";
    else gp << "set autoscale cb\n";
    gp << "plot '" << data.string() << "' matrix with image notitle\n";
  }
  gp << "unset multiplot\n";
  return run_gnuplot(gp.str(), path, dir);
}

bool plot_lines(const std::string& path, const std::string& title, const std::string& xlabel,
                const std::string& ylabel, const std::vector<Series>& series, bool log_y, bool log_x) {
  const fs::path dir = make_tmp_dir();
  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,560 font 'sans,10'\nset output '" << (dir / "out.png").string() << "'\n"
     << "set title " << quote(title) << "\nset xlabel " << quote(xlabel) << "\nset ylabel " << quote(ylabel)
     << "\nset grid\nset key outside right\nset style fill transparent solid 0.2 noborder\n";
  if (log_y) gp << "set logscale y\n";
  if (log_x) gp << "set logscale x 2\n";
  std::string plots;
  for (size_t s = 0; s < series.size(); ++s) {
    const Series& S = series[s];
    const fs::path data = dir / ("s" + std::to_string(s) + ".dat");
    std::ofstream f(data);
    const bool band = S.lo.size() == S.x.size() && S.hi.size() == S.x.size();
    for (size_t i = 0; i < S.x.size(); ++i) {
      f << S.x[i] << " " << S.y[i];
      if (band) f << " " << S.lo[i] << " " << S.hi[i];
      f << "\n";
    }
    const std::string color = "lc " + std::to_string(s + 1);
    if (band) plots += (plots.empty() ? "" : ", ") + std::string("'") + data.string() + "' using 1:3:4 with filledcurves " + color + " notitle";
    plots += (plots.empty() ? "" : ", ") + std::string("'") + data.string() + "' using 1:2 with linespoints " + color +
             " pt 7 ps 0.5 title " + quote(S.name);
  }
  gp << "plot " << (plots.empty() ? "NaN notitle" : plots) << "\n";
  return run_gnuplot(gp.str(), path, dir);
}

}  // namespace hl
