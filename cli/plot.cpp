#include "cli/plot.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/child_process.h"
#include "lib/core.h"
#include "lib/fileutil.h"
#include "lib/stop.h"

namespace hl {

namespace fs = std::filesystem;

namespace {

// Text as a gnuplot single-quoted string: inside one, gnuplot substitutes nothing (no
// backquote commands, no @macros) and '' is the only escape. Control characters (a newline
// would end the command) become '?'. The terminal is `noenhanced`, so _ ^ { } print as they are.
std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) out += '?';
    else out += c;
  }
  return out + "'";
}

// A private temporary directory (mkdtemp: mode 0700, a fresh name), removed on every path.
class PlotDir {
 public:
  PlotDir() {
    std::error_code ec;
    fs::path base = fs::temp_directory_path(ec);
    if (ec || !fs::is_directory(base, ec)) base = "/tmp";
    std::string templ = (base / "headlab-plot-XXXXXX").string();
    if (!::mkdtemp(templ.data())) fail("plot: cannot make a temporary directory in ", base.string(), ": ", std::strerror(errno));
    path_ = templ;
  }
  ~PlotDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  PlotDir(const PlotDir&) = delete;
  PlotDir& operator=(const PlotDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// How long gnuplot may draw one plot (seconds): HEADLAB_PLOT_TIMEOUT, else 120.
double plot_time_limit() {
  const char* v = std::getenv("HEADLAB_PLOT_TIMEOUT");
  if (!v || !*v) return 120;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (*end != '\0' || !(s > 0) || s > 1e6) fail("HEADLAB_PLOT_TIMEOUT: '", v, "' is not a number of seconds in (0, 1e6]");
  return s;
}

// The last non-empty line of gnuplot's log: its error, in one line.
std::string last_line(const std::string& log) {
  const size_t end = log.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t newline = log.find_last_of('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return log.substr(begin, std::min<size_t>(end + 1 - begin, 300));
}

// Runs a gnuplot script in `dir` (it names only files there, by relative names: no path of
// ours is ever inside the script), then writes its out.png to `path` through the atomic writer.
// A plot is part of the command's result: one that cannot be drawn fails the command, naming
// the PNG; a stop request ends gnuplot and stops the command.
void run_gnuplot(const std::string& script, const std::string& path, const PlotDir& dir) {
  write_file_atomic((dir.path() / "plot.gp").string(), script);
  const std::string log_path = (dir.path() / "gnuplot.log").string();
  const double limit = plot_time_limit();
  const bool stop_before = stop_requested();  // drawing what an interrupted run leaves: to the end
  int rc = 0;
  try {
    rc = run_child_process({"gnuplot", "plot.gp"}, {.cwd = dir.path().string(), .output_file = log_path, .forward_stop = true, .time_limit_s = limit});
  } catch (const ChildTimedOut& e) {
    fail("could not draw ", StagedDir::shown_path(path), ": ", e.what(), " (HEADLAB_PLOT_TIMEOUT=SECONDS allows longer)");
  }
  if (!stop_before) throw_if_stopped();  // a stop request ended gnuplot
  const fs::path png = dir.path() / "out.png";
  if (rc != 0 || !fs::exists(png)) {
    std::string log;
    try {
      log = read_file(log_path);
    } catch (const Error&) {
    }
    if (rc == 127) fail("could not draw ", StagedDir::shown_path(path), ": gnuplot is not installed (Debian: apt install gnuplot-nox)");
    const std::string why = last_line(log);
    fail("could not draw ", StagedDir::shown_path(path), ": gnuplot ", rc == 0 ? "wrote no PNG" : "failed (exit " + std::to_string(rc) + ")",
         why.empty() ? "" : ": " + why);
  }
  write_file_atomic(path, read_file(png.string()));
}

std::string tics(const char* axis, const std::vector<std::string>& labels) {
  if (labels.empty()) return "";
  std::string s = std::string("set ") + axis + "tics (";
  for (size_t i = 0; i < labels.size(); ++i) s += (i ? ", " : "") + quote(labels[i]) + " " + std::to_string(i);
  return s + ")\n";
}

}  // namespace

void plot_heatmap_grid(const std::string& path, const std::string& title, int grid_rows, int grid_cols,
                       const std::vector<Heatmap>& maps, const std::string& xlabel,
                       const std::string& ylabel, float vmin, float vmax) {
  const PlotDir dir;
  // Panel size: small grids (layers x heads) get ~40 px per cell, token maps ~14 px.
  const int m = maps.empty() ? 8 : std::max(maps[0].rows, maps[0].cols);
  const int cell = m <= 16 ? std::clamp(40 * m + 140, 260, 600) : std::clamp(14 * m + 120, 220, 420);
  std::ostringstream gp;
  const double aspect = maps.empty() ? 1.0 : std::min(1.0, static_cast<double>(maps[0].rows) / std::max(1, maps[0].cols));
  // Square cells, unless the map is so wide (a few heads over hundreds of steps) that square
  // cells would make a strip: then the panel keeps a height of 0.4 its width.
  const double shown = std::max(aspect, 0.4);
  const int panel_h = static_cast<int>(cell * shown) + (shown < 1.0 ? 130 : 0);
  gp << "set terminal pngcairo noenhanced size " << grid_cols * cell + 80 << "," << grid_rows * panel_h + 60
     << " font 'sans,8'\nset output 'out.png'\n"
     << "set palette defined (0 '#ffffff', 0.25 '#c6dbef', 0.5 '#6baed6', 0.75 '#2171b5', 1 '#08306b')\n"
     << "set multiplot layout " << grid_rows << "," << grid_cols << " title " << quote(title) << "\n"
     << (aspect < shown ? "set size ratio " + std::to_string(shown) : std::string("set size ratio -1")) << "\nset tics scale 0\n";
  for (size_t m = 0; m < maps.size(); ++m) {
    const Heatmap& h = maps[m];
    const std::string data = "m" + std::to_string(m) + ".dat";
    std::ofstream f(dir.path() / data);
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
    gp << "plot '" << data << "' matrix with image notitle\n";
  }
  gp << "unset multiplot\n";
  run_gnuplot(gp.str(), path, dir);
}

void plot_lines(const std::string& path, const std::string& title, const std::string& xlabel,
                const std::string& ylabel, const std::vector<Series>& series, bool log_y, bool log_x) {
  const PlotDir dir;
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 900,560 font 'sans,10'\nset output 'out.png'\n"
     << "set title " << quote(title) << "\nset xlabel " << quote(xlabel) << "\nset ylabel " << quote(ylabel)
     << "\nset grid\nset key outside right\nset style fill transparent solid 0.2 noborder\n";
  bool any_finite = false;  // gnuplot refuses a plot with no point at all: an empty frame says so
  for (const Series& S : series)
    for (size_t i = 0; i < S.x.size() && i < S.y.size(); ++i) any_finite = any_finite || (std::isfinite(S.x[i]) && std::isfinite(S.y[i]));
  if (!any_finite) {
    gp << "set xrange [0:1]\nset yrange [0:1]\nset label 'no finite values to draw' at graph 0.5,0.5 center\nplot 2 notitle\n";
    run_gnuplot(gp.str(), path, dir);
    return;
  }
  if (log_y) gp << "set logscale y\n";
  if (log_x) gp << "set logscale x 2\n";
  std::string plots;
  for (size_t s = 0; s < series.size(); ++s) {
    const Series& S = series[s];
    const std::string data = "s" + std::to_string(s) + ".dat";
    std::ofstream f(dir.path() / data);
    const bool band = S.lo.size() == S.x.size() && S.hi.size() == S.x.size();
    for (size_t i = 0; i < S.x.size(); ++i) {
      f << S.x[i] << " " << S.y[i];
      if (band) f << " " << S.lo[i] << " " << S.hi[i];
      f << "\n";
    }
    const std::string color = "lc " + std::to_string(s + 1);
    if (band) plots += (plots.empty() ? "" : ", ") + std::string("'") + data + "' using 1:3:4 with filledcurves " + color + " notitle";
    plots += (plots.empty() ? "" : ", ") + std::string("'") + data + "' using 1:2 with linespoints " + color +
             " pt 7 ps 0.5 title " + quote(S.name);
  }
  gp << "plot " << plots << "\n";
  run_gnuplot(gp.str(), path, dir);
}

void plot_graph(const std::string& path, const std::string& title, const std::vector<GraphNode>& nodes,
                const std::vector<GraphArrow>& arrows, const std::vector<std::string>& legend, int width, int height) {
  const PlotDir dir;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (!nodes.empty()) {
    x0 = x1 = nodes[0].x, y0 = y1 = nodes[0].y;
    for (const GraphNode& n : nodes) x0 = std::min(x0, n.x), x1 = std::max(x1, n.x), y0 = std::min(y0, n.y), y1 = std::max(y1, n.y);
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size " << width << "," << height << " font 'sans,9'\nset output 'out.png'\n"
     << "set title " << quote(title) << "\nunset border\nunset tics\nunset key\n"
     << "set xrange [" << x0 - 0.7 << ":" << x1 + 0.7 << "]\nset yrange [" << y0 - 0.5 << ":" << y1 + 0.5 << "]\n"
     << "set lmargin 1\nset rmargin 1\nset bmargin " << 1 + legend.size() << "\n";
  for (size_t i = 0; i < legend.size(); ++i)
    gp << "set label " << i + 1 << " " << quote(legend[i]) << " at screen 0.01, screen " << 0.012 + 0.022 * (legend.size() - 1 - i) << " left\n";
  for (size_t i = 0; i < arrows.size(); ++i) {
    const GraphArrow& a = arrows[i];
    gp << "set arrow " << i + 1 << " from " << a.x0 << "," << a.y0 << " to " << a.x1 << "," << a.y1
       << " head filled size screen 0.012,20 lw " << a.width << " lc rgb " << quote(a.color) << " dt " << a.dash << " back\n";
  }
  {
    std::ofstream f(dir.path() / "nodes.dat");
    // labels as gnuplot strings in a data file: double-quoted, without quotes of their own
    for (const GraphNode& n : nodes) {
      std::string label = n.label;
      std::replace(label.begin(), label.end(), '"', '\'');
      f << n.x << " " << n.y << " \"" << label << "\"\n";
    }
  }
  gp << "plot 'nodes.dat' using 1:2 with points pt 7 ps 5.5 lc rgb '#e8e8e8', "
        "'' using 1:2 with points pt 6 ps 5.5 lc rgb '#606060', "
        "'' using 1:2:3 with labels font 'sans,8' tc rgb '#000000'\n";
  run_gnuplot(gp.str(), path, dir);
}

}  // namespace hl
