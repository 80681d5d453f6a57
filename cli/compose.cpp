// headlab compose: Q-, K- and V-composition scores between heads of consecutive layers:
// flags -> composition_scores -> table, CSV and heatmaps in --out.
#include <cstdio>
#include <memory>

#include "analysis/circuits.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "train/run_dir.h"

namespace hl {

namespace {

int run_compose(const RoleOpts& o) {
  const std::string out = o.out.empty() ? default_out_dir("compose") : o.out;
  RoleModel m = load_role_model(o);
  const int L = m.model->cfg.n_layers, H = m.model->cfg.n_heads;
  if (L < 2) fail(o.checkpoint, ": composition needs at least 2 layers, the model has ", L);
  claim_output_dir(out, "compose");
  std::string csv = "layer_a,head_a,layer_b,head_b,q,k,v\n";
  std::vector<std::vector<std::string>> table = {{"from", "to", "Q-comp", "K-comp", "V-comp"}};
  std::vector<Heatmap> maps;
  for (int l = 0; l + 1 < L; ++l) {
    const CompositionScores c = composition_scores(*m.model, l, l + 1);
    for (int a = 0; a < H; ++a)
      for (int b = 0; b < H; ++b) {
        csv += std::to_string(l) + "," + std::to_string(a) + "," + std::to_string(l + 1) + "," + std::to_string(b) + "," +
               fixed(c.q[a][b], 6) + "," + fixed(c.k[a][b], 6) + "," + fixed(c.v[a][b], 6) + "\n";
        table.push_back({"L" + std::to_string(l) + "H" + std::to_string(a), "L" + std::to_string(l + 1) + "H" + std::to_string(b),
                         fixed(c.q[a][b], 3), fixed(c.k[a][b], 3), fixed(c.v[a][b], 3)});
      }
    const std::string pre = "L" + std::to_string(l) + "->L" + std::to_string(l + 1) + " ";
    maps.push_back(head_heatmap(pre + "Q", c.q, "H", "H"));
    maps.push_back(head_heatmap(pre + "K", c.k, "H", "H"));
    maps.push_back(head_heatmap(pre + "V", c.v, "H", "H"));
  }
  // beside the scores: what random weights of the same shapes score
  const CompositionBaseline base = composition_baseline(m.model->cfg);
  std::vector<std::string> random_row = {"random", "weights"};
  std::string base_csv = "kind,mean,p2_5,p97_5\n";
  for (int k = 0; k < 3; ++k) {
    random_row.push_back(fixed(base.mean[k], 3) + " [" + fixed(base.lo[k], 3) + "-" + fixed(base.hi[k], 3) + "]");
    base_csv += std::string(1, "qkv"[k]) + "," + fixed(base.mean[k], 6) + "," + fixed(base.lo[k], 6) + "," + fixed(base.hi[k], 6) + "\n";
  }
  table.insert(table.begin() + 1, random_row);
  std::printf("composition scores ||W_B W_A||_F / (||W_B||_F ||W_A||_F) between heads of consecutive layers; first row:\n"
              "the same scores of random weights of the same shapes (mean [95%% of them], 20 models), the level of no\n"
              "composition:\n\n");
  print_table(table);
  write_file_atomic(out + "/compose.csv", csv);
  write_file_atomic(out + "/compose_baseline.csv", base_csv);
  plot_heatmap_grid(out + "/compose.png", "Composition (rows: earlier head, columns: later head)", L - 1, 3, maps,
                    "head of the later layer", "head of the earlier layer");
  std::printf("\nwrote %s/compose.csv, compose_baseline.csv, compose.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_compose_command(CLI::App& app, CommandRunner& runner) {
  add_role_command(app, runner, "compose", "Q-, K- and V-composition scores between heads of consecutive layers", run_compose);
}

}  // namespace hl
