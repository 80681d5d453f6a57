#include "train/atlas.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "lib/fileutil.h"
#include "lib/safetensors.h"
#include "train/heads.h"
#include "train/plot.h"

namespace hl {

namespace {

double frob(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(t.data()[i]) * t.data()[i];
  return std::sqrt(s);
}

// Columns of a (rows x k) matrix orthonormalised (modified Gram-Schmidt); returns R (k x k),
// with A = Q R. Used to shrink a D x D low-rank product to a k x k core.
std::vector<double> qr_r(const std::vector<double>& a, int rows, int k) {
  std::vector<double> q = a, r(static_cast<size_t>(k) * k, 0.0);
  for (int j = 0; j < k; ++j) {
    for (int i = 0; i < j; ++i) {
      double dot = 0;
      for (int t = 0; t < rows; ++t) dot += q[t * k + i] * q[t * k + j];
      r[i * k + j] = dot;
      for (int t = 0; t < rows; ++t) q[t * k + j] -= dot * q[t * k + i];
    }
    double n = 0;
    for (int t = 0; t < rows; ++t) n += q[t * k + j] * q[t * k + j];
    n = std::sqrt(n);
    r[j * k + j] = n;
    if (n > 0)
      for (int t = 0; t < rows; ++t) q[t * k + j] /= n;
  }
  return r;
}

// Singular values of X Y where X (D x k) and Y (k x D): R_x R_y'^T with Y^T = Q_y R_y'.
std::vector<double> low_rank_product_svals(const std::vector<double>& X, const std::vector<double>& YT, int D, int k) {
  const std::vector<double> rx = qr_r(X, D, k), ry = qr_r(YT, D, k);
  std::vector<double> core(static_cast<size_t>(k) * k, 0.0);
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j)
      for (int t = 0; t < k; ++t) core[i * k + j] += rx[i * k + t] * ry[j * k + t];
  return singular_values(core, k, k);
}

std::vector<double> to_double(const Tensor& t) { return std::vector<double>(t.data(), t.data() + t.numel()); }

std::vector<double> transpose(const std::vector<double>& a, int rows, int cols) {
  std::vector<double> t(a.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

double stable_rank(const std::vector<double>& sv) {
  if (sv.empty() || sv[0] == 0) return 0;
  double s = 0;
  for (double v : sv) s += v * v;
  return s / (sv[0] * sv[0]);
}

}  // namespace

std::vector<double> singular_values(std::vector<double> m, int rows, int cols) {
  // One-sided Jacobi: rotate column pairs until orthogonal; the column norms are the values.
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0;
    for (int p = 0; p < cols; ++p)
      for (int q = p + 1; q < cols; ++q) {
        double a = 0, b = 0, c = 0;
        for (int i = 0; i < rows; ++i) {
          a += m[i * cols + p] * m[i * cols + p];
          b += m[i * cols + q] * m[i * cols + q];
          c += m[i * cols + p] * m[i * cols + q];
        }
        if (std::fabs(c) <= 1e-15 * std::sqrt(a * b)) continue;
        off = std::max(off, std::fabs(c) / std::sqrt(a * b));
        const double zeta = (b - a) / (2 * c);
        const double t = (zeta >= 0 ? 1 : -1) / (std::fabs(zeta) + std::sqrt(1 + zeta * zeta));
        const double cs = 1 / std::sqrt(1 + t * t), sn = cs * t;
        for (int i = 0; i < rows; ++i) {
          const double x = m[i * cols + p], y = m[i * cols + q];
          m[i * cols + p] = cs * x - sn * y;
          m[i * cols + q] = sn * x + cs * y;
        }
      }
    if (off < 1e-12) break;
  }
  std::vector<double> sv(cols);
  for (int j = 0; j < cols; ++j) {
    double n = 0;
    for (int i = 0; i < rows; ++i) n += m[i * cols + j] * m[i * cols + j];
    sv[j] = std::sqrt(n);
  }
  std::sort(sv.rbegin(), sv.rend());
  return sv;
}

std::vector<double> qk_circuit_singular_values(const TransformerLM& model, int layer, int head) {
  const auto& attn = model.blocks.at(layer)->attn;
  const int64_t dh = attn.cfg.head_dim(), D = attn.cfg.d_model;
  const int kv = head / (attn.cfg.n_heads / attn.cfg.kv_heads());
  // W_QK = W_Q^h^T W_K^h  (D x D) = X Y with X = W_Q^h^T (D x dh), Y = W_K^h (dh x D)
  const std::vector<double> X = transpose(to_double(head_rows(attn.W_Q.weight, head, dh)), dh, D);
  const std::vector<double> YT = transpose(to_double(head_rows(attn.W_K.weight, kv, dh)), dh, D);
  return low_rank_product_svals(X, YT, static_cast<int>(D), static_cast<int>(dh));
}

std::vector<double> ov_circuit_singular_values(const TransformerLM& model, int layer, int head) {
  const auto& attn = model.blocks.at(layer)->attn;
  const int64_t dh = attn.cfg.head_dim(), D = attn.cfg.d_model;
  const int kv = head / (attn.cfg.n_heads / attn.cfg.kv_heads());
  // W_OV = W_O^h W_V^h (D x D) = X Y with X = W_O^h (D x dh), Y = W_V^h (dh x D)
  const std::vector<double> X = to_double(head_cols(attn.W_O.weight, head, dh));
  const std::vector<double> YT = transpose(to_double(head_rows(attn.W_V.weight, kv, dh)), dh, D);
  return low_rank_product_svals(X, YT, static_cast<int>(D), static_cast<int>(dh));
}

std::vector<HeadNormRow> head_gradient_norms(const TransformerLM& model, int64_t step) {
  std::vector<HeadNormRow> rows;
  for (int l = 0; l < static_cast<int>(model.blocks.size()); ++l) {
    const auto& attn = model.blocks[l]->attn;
    const int64_t dh = attn.cfg.head_dim();
    auto add = [&](const char* name, const Tensor& w, int heads, bool cols) {
      const Tensor g = w.grad();
      for (int h = 0; h < heads; ++h) {
        const Tensor wb = cols ? head_cols(w, h, dh) : head_rows(w, h, dh);
        const double gn = g.defined() ? frob(cols ? head_cols(g, h, dh) : head_rows(g, h, dh)) : 0.0;
        rows.push_back({step, l, h, name, gn, frob(wb)});
      }
    };
    add("W_Q", attn.W_Q.weight, attn.cfg.n_heads, false);
    add("W_K", attn.W_K.weight, attn.cfg.kv_heads(), false);
    add("W_V", attn.W_V.weight, attn.cfg.kv_heads(), false);
    add("W_O", attn.W_O.weight, attn.cfg.n_heads, true);
  }
  return rows;
}

GradAtlas::GradAtlas(std::string out, int64_t every, std::vector<int64_t> dump_at, bool resume)
    : out_(std::move(out)), every_(every), dump_at_(std::move(dump_at)) {
  if (!resume) return;
  auto load = [&](const std::string& name, std::vector<std::string>& rows) {
    std::ifstream in(out_ + "/" + name);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line))
      if (!line.empty()) rows.push_back(line);
  };
  load("grad_atlas.csv", norm_rows_);
  load("attn_entropy.csv", entropy_rows_);
  load("circuits.csv", circuit_rows_);
}

void GradAtlas::write_csvs() const {
  auto write = [&](const std::string& name, const std::string& header, const std::vector<std::string>& rows) {
    std::string s = header + "\n";
    for (auto& r : rows) s += r + "\n";
    write_file_atomic(out_ + "/" + name, s);
  };
  write("grad_atlas.csv", "step,layer,head,matrix,grad_norm,weight_norm", norm_rows_);
  write("attn_entropy.csv", "step,layer,head,entropy,entropy_norm", entropy_rows_);
  write("circuits.csv", "step,layer,head,circuit,stable_rank,singular_values", circuit_rows_);
}

void GradAtlas::observe(int64_t step, TransformerLM& model) {
  if (first_) {  // rows logged after the checkpoint we resumed from are stale
    auto drop_from = [&](std::vector<std::string>& rows) {
      rows.erase(std::remove_if(rows.begin(), rows.end(),
                                [&](const std::string& r) { return std::stoll(r.substr(0, r.find(','))) >= step; }),
                 rows.end());
    };
    drop_from(norm_rows_);
    drop_from(entropy_rows_);
    drop_from(circuit_rows_);
    first_ = false;
  }
  const bool log = every_ > 0 && step % every_ == 0;
  const bool dump = std::find(dump_at_.begin(), dump_at_.end(), step) != dump_at_.end();
  if (!log && !dump) return;
  char buf[256];
  if (log) {
    for (const HeadNormRow& r : head_gradient_norms(model, step)) {
      std::snprintf(buf, sizeof buf, "%lld,%d,%d,%s,%.8g,%.8g", static_cast<long long>(r.step), r.layer, r.head,
                    r.matrix.c_str(), r.grad_norm, r.weight_norm);
      norm_rows_.push_back(buf);
    }
    if (has_probe_) {
      const HeadStats st = attention_statistics(model, {probe_});
      for (int l = 0; l < model.cfg.n_layers; ++l)
        for (int h = 0; h < model.cfg.n_heads; ++h) {
          std::snprintf(buf, sizeof buf, "%lld,%d,%d,%.8g,%.8g", static_cast<long long>(step), l, h, st.entropy[l][h],
                        st.entropy_norm[l][h]);
          entropy_rows_.push_back(buf);
        }
    }
  }
  if (dump) {
    make_dirs(out_ + "/grads");
    SafetensorsWriter w;
    for (auto& [name, t] : model.named_parameters())
      w.add("grad." + name, t.grad().defined() ? t.grad() : Tensor::zeros(t.shape()));
    w.set_meta("step", std::to_string(step));
    w.write(out_ + "/grads/step_" + std::to_string(step) + ".safetensors");
    for (int l = 0; l < model.cfg.n_layers; ++l)
      for (int h = 0; h < model.cfg.n_heads; ++h)
        for (const char* circuit : {"QK", "OV"}) {
          const auto sv = circuit[0] == 'Q' ? qk_circuit_singular_values(model, l, h)
                                            : ov_circuit_singular_values(model, l, h);
          std::ostringstream os;
          os << step << "," << l << "," << h << "," << circuit << "," << stable_rank(sv) << ",";
          for (size_t i = 0; i < sv.size(); ++i) os << (i ? ";" : "") << sv[i];
          circuit_rows_.push_back(os.str());
        }
  }
  write_csvs();
}

void GradAtlas::finish() {
  if (norm_rows_.empty()) return;
  // Heatmaps of gradient norm: rows = layer.head, columns = logged steps, one per matrix.
  std::map<std::string, std::map<std::pair<int, int>, std::vector<double>>> by_matrix;
  std::vector<int64_t> steps;
  for (const std::string& line : norm_rows_) {
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
  plot_heatmap_grid(out_ + "/grad_atlas.png", "Per-head gradient norms over training", 2, 2, maps, "step",
                    "layer.head");
  if (!entropy_rows_.empty()) {
    std::map<std::pair<int, int>, Series> series;
    for (const std::string& line : entropy_rows_) {
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
    plot_lines(out_ + "/attn_entropy.png", "Attention entropy per head (normalised)", "step",
               "entropy / log(visible keys)", all);
  }
}

}  // namespace hl
