#include "train/atlas.h"

#include "analysis/circuits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "analysis/heads.h"
#include "lib/fileutil.h"
#include "lib/safetensors.h"

namespace hl {

GradAtlas::GradAtlas(std::string out, int64_t every, std::vector<int64_t> dump_at, bool resume)
    : out_(std::move(out)), every_(every), dump_at_(std::move(dump_at)) {
  if (!resume) return;
  // Rows of an earlier part of the run, checked: step, layer and head (the first `wholes`
  // columns) whole numbers, then the table's other columns (a file edited by hand is refused,
  // naming the line).
  auto load = [&](const std::string& name, std::vector<std::string>& rows, size_t columns, int number_column, size_t wholes = 3) {
    const std::string path = out_ + "/" + name;
    if (!file_exists(path)) return;
    std::stringstream in(read_file(path));
    std::string line;
    std::getline(in, line);  // header
    for (int n = 2; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      std::vector<std::string> f;
      std::stringstream ss(line);
      for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
      auto whole = [](const std::string& x) {
        char* end = nullptr;
        std::strtoll(x.c_str(), &end, 10);
        return !x.empty() && *end == '\0';
      };
      auto number = [](const std::string& x) {
        char* end = nullptr;
        std::strtod(x.c_str(), &end);
        return !x.empty() && *end == '\0';
      };
      const bool wholes_ok = f.size() >= wholes && std::all_of(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(wholes), whole);
      if (f.size() < columns || !wholes_ok || !number(f[number_column]))
        fail(path, ": line ", n, " is not a row of this table ('", line.substr(0, 60), "'); remove the file to start it again");
      rows.push_back(line);
    }
  };
  load("grad_atlas.csv", norm_rows_, 6, 4);
  load("attn_entropy.csv", entropy_rows_, 5, 4);
  load("circuits.csv", circuit_rows_, 6, 4);
  load("mlp_grad_atlas.csv", mlp_norm_rows_, 5, 3, 2);
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
  if (!mlp_norm_rows_.empty()) write("mlp_grad_atlas.csv", "step,layer,matrix,grad_norm,weight_norm", mlp_norm_rows_);
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
    drop_from(mlp_norm_rows_);
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
    for (const HeadNormRow& r : mlp_gradient_norms(model, step)) {
      std::snprintf(buf, sizeof buf, "%lld,%d,%s,%.8g,%.8g", static_cast<long long>(r.step), r.layer, r.matrix.c_str(),
                    r.grad_norm, r.weight_norm);
      mlp_norm_rows_.push_back(buf);
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

}  // namespace hl
