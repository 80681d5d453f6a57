// Head analyses: importance vs finite differences, ablation invariants, attention statistics,
// pruning, gradient atlas norms, and the ablate command's table and resume.
#define BOOST_TEST_MODULE heads
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/atlas.h"
#include "train/prune_study.h"
#include "train/sweep.h"
#include "datasets/copy_task.h"
#include "analysis/heads.h"
#include "analysis/intervals.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;
namespace tt = boost::test_tools;
namespace fs = std::filesystem;

namespace {
TaskConfig tiny_task() {
  TaskConfig c = TaskConfig::preset("copy");
  c.alphabet = 5;
  c.min_len = 2;
  c.max_len = 4;  // variable length: padding and masks are exercised
  return c;
}
ModelConfig tiny_model(int heads = 4) {
  return test_model({.vocab = 8, .heads = heads, .d_ff = 16, .max_seq_len = 9, .attn_bias = false});
}
// A model with weights large enough that every head matters.
std::unique_ptr<TransformerLM> make_model(uint64_t seed, int heads = 4) {
  auto m = std::make_unique<TransformerLM>(tiny_model(heads), seed);
  Rng r(seed + 1);
  for (auto& [name, p] : m->named_parameters())
    if (name.find("ln") == std::string::npos) init_normal(p, r, 0.3f);
  return m;
}
double summed_loss(TransformerLM& m, const std::vector<Batch>& data) {
  NoGradGuard ng;
  double s = 0;
  for (const Batch& b : data) {
    ForwardOptions o;
    o.key_padding = b.key_padding;
    int64_t n = 0;
    for (int32_t t : b.targets.data) n += t >= 0;
    s += static_cast<double>(cross_entropy(m.forward(b.inputs, o), b.targets).item()) * n;
  }
  return s;
}
std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  BOOST_REQUIRE(::pclose(p) == 0);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(gate_gradient_equals_finite_difference) {
  auto m = make_model(1);
  CopyTask task(tiny_task());
  const auto data = task.held_out(6, 3, 3);
  const HeadGrid g = gate_gradients(*m, data);
  // Central differences at two steps, Richardson-extrapolated (truncation error O(eps^4));
  // what remains is float32 round-off of the summed loss, hence the absolute part of the bound.
  auto central = [&](int l, int h, float eps) {
    m->gates(l).data()[h] = 1.f + eps;
    const double lp = summed_loss(*m, data);
    m->gates(l).data()[h] = 1.f - eps;
    const double lm = summed_loss(*m, data);
    m->gates(l).data()[h] = 1.f;
    return (lp - lm) / (2.0 * eps);
  };
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) {
      const double d1 = central(l, h, 1e-2f), d2 = central(l, h, 5e-3f);
      const double fd = (4 * d2 - d1) / 3;
      BOOST_TEST_CONTEXT("layer " << l << " head " << h) {
        BOOST_TEST(std::fabs(g[l][h] - fd) <= 5e-4 + 2e-3 * std::fabs(fd), g[l][h] << " vs " << fd);
      }
    }
}

BOOST_AUTO_TEST_CASE(importance_on_one_token_is_the_absolute_gate_derivative) {
  // With a single position, I_h = |sum_d z_h dL/dz_h| = |dL/dg_h| exactly (gate 1), per example
  // and per token alike.
  auto m = make_model(2);
  Batch b;
  b.inputs = Ids(Shape{1, 1}, {6});
  b.targets = Ids(Shape{1, 1}, {3});
  const std::vector<Batch> one = {b};
  const HeadGrid imp = head_importance(*m, one, false), per_token = head_importance_per_token(*m, one, false);
  const HeadGrid g = gate_gradients(*m, one);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) {
      BOOST_TEST(imp[l][h] == std::fabs(g[l][h]), tt::tolerance(1e-4));
      BOOST_TEST(per_token[l][h] == std::fabs(g[l][h]), tt::tolerance(1e-4));
    }
  // Over many tokens the per-token absolute values make I_h >= |dL/dg_h| / n.
  CopyTask task(tiny_task());
  const auto data = task.held_out(8, 5, 8);
  const HeadGrid imp2 = head_importance_per_token(*m, data, false), g2 = gate_gradients(*m, data);
  int64_t n = 0;
  for (int32_t t : data[0].targets.data) n += t >= 0;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) BOOST_TEST(imp2[l][h] * n >= std::fabs(g2[l][h]) * (1 - 1e-5));
  // normalised per layer: unit l2 norm
  for (const HeadGrid& nrm : {head_importance(*m, data, true), head_importance_per_token(*m, data, true)})
    for (int l = 0; l < 2; ++l) {
      double s = 0;
      for (double v : nrm[l]) s += v * v;
      BOOST_TEST(s == 1.0, tt::tolerance(1e-9));
    }
}

BOOST_AUTO_TEST_CASE(importance_is_the_mean_over_examples_of_the_absolute_per_example_gate_gradient) {
  // Michel et al.: I_h = (1/N) sum_x |dL(x)/dxi_h|, L(x) the example's mean loss. Each example
  // alone as a batch of one: gate_gradients gives d(n_x L(x))/dxi_h.
  auto m = make_model(3);
  CopyTask task(tiny_task());  // variable lengths: examples count different numbers of targets
  const auto data = task.held_out(10, 7, 4);  // batches of 4, 4 and 2 rows
  const HeadGrid imp = head_importance(*m, data, false);
  HeadGrid expect(2, std::vector<double>(4, 0.0));
  int examples = 0;
  for (const Batch& b : data)
    for (int64_t r = 0; r < b.size(); ++r) {
      Batch row;
      b.rows_into(r, r + 1, row);
      const double n = static_cast<double>(row.counted_targets());
      const HeadGrid g = gate_gradients(*m, {row});
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < 4; ++h) expect[l][h] += std::fabs(g[l][h]) / n;
      ++examples;
    }
  BOOST_TEST(examples == 10);
  // per example, as returned for intervals: 10 of them, and their mean is the importance
  std::vector<HeadGrid> each;
  head_importance(*m, data, false, &each);
  BOOST_TEST_REQUIRE(each.size() == 10u);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) {
      double sum = 0;
      for (const HeadGrid& g : each) sum += g[l][h];
      BOOST_TEST(sum / 10 == imp[l][h], tt::tolerance(1e-12));
    }
  // a row without a counted target in the middle of a batch: the per-example values are those of
  // the other rows, each as a batch of its own
  {
    Batch mid = data[0];  // 4 rows; row 1 loses its targets
    for (int64_t t = 0; t < mid.targets.shape[1]; ++t) mid.targets.at(1, t) = -1;
    std::vector<HeadGrid> per;
    head_importance(*m, {mid}, false, &per);
    BOOST_TEST_REQUIRE(per.size() == 3u);
    const int64_t rows[3] = {0, 2, 3};
    for (int i = 0; i < 3; ++i) {
      Batch alone;
      mid.rows_into(rows[i], rows[i] + 1, alone);
      const HeadGrid one = head_importance(*m, {alone}, false);
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < 4; ++h) BOOST_TEST(per[i][l][h] == one[l][h], tt::tolerance(1e-4));
    }
  }
  // rows with no counted target are no examples: adding some changes nothing
  Batch with_empty = data[2];  // 2 rows, neither counted now
  for (int32_t& t : with_empty.targets.data) t = -1;
  std::vector<Batch> data_empty = {data[0], data[1], with_empty, data[2]};
  const HeadGrid imp_empty = head_importance(*m, data_empty, false);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) BOOST_TEST(imp_empty[l][h] == imp[l][h], tt::tolerance(1e-12));
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) {
      BOOST_TEST_CONTEXT("layer " << l << " head " << h) {
        // float32 gradients summed in different orders; the importances are O(0.1)
        BOOST_TEST(imp[l][h] == expect[l][h] / examples, tt::tolerance(1e-4));
      }
    }
  // and it is not the token-level variant
  const HeadGrid per_token = head_importance_per_token(*m, data, false);
  double most = 0;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) most = std::max(most, std::fabs(per_token[l][h] - imp[l][h]) / imp[l][h]);
  BOOST_TEST(most > 0.01);
}

BOOST_AUTO_TEST_CASE(ablating_a_head_with_zero_wo_changes_nothing) {
  auto m = make_model(3);
  Tensor wo = m->blocks[1]->attn.W_O.weight;  // (8, 8): head 2 owns columns 4..5
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t c = 4; c < 6; ++c) wo.at({r, c}) = 0.f;
  CopyTask task(tiny_task());
  const auto data = task.held_out(10, 4, 5);
  const AblationResult a = single_head_ablation(*m, task, data);
  BOOST_TEST(a.d_loss[1][2] == 0.0);
  BOOST_TEST(a.d_acc[1][2] == 0.0);
  BOOST_TEST(a.d_loss_mean[1][2] == 0.0);
  BOOST_TEST(a.d_loss[0][0] != 0.0);  // and a live head does change it
}

BOOST_AUTO_TEST_CASE(pruning_through_gates_equals_zeroed_wo_columns) {
  CopyTask task(tiny_task());
  const auto data = task.held_out(10, 4, 5);
  auto m = make_model(4);
  PruneOptions o;
  o.step_fraction = 0.25;  // 2 of 8 heads per step
  o.min_per_layer = 1;
  const auto curve = prune_curve(*m, task, data, [](TransformerLM& mm) { return gate_gradients(mm, {}); }, o);
  BOOST_TEST(curve.size() == 4u);  // 0, 2, 4, 6 removed: one head must stay in each layer
  BOOST_TEST(curve.back().pruned == 6);
  for (int l = 0; l < 2; ++l) {
    int alive = 0;
    for (int h = 0; h < 4; ++h) alive += m->gates(l).data()[h] != 0.f;
    BOOST_TEST(alive == 1);
  }
  // the same model with gates back at 1 but W_O columns of the pruned heads zeroed
  auto z = make_model(4);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h)
      if (m->gates(l).data()[h] == 0.f)
        for (int64_t r = 0; r < 8; ++r)
          for (int64_t c = 2 * h; c < 2 * h + 2; ++c) z->blocks[l]->attn.W_O.weight.at({r, c}) = 0.f;
  const EvalResult a = evaluate(*m, task, data, false), b = evaluate(*z, task, data, false);
  BOOST_TEST(a.loss == b.loss);
  BOOST_TEST(curve.back().eval.loss == a.loss);
}

BOOST_AUTO_TEST_CASE(uniform_attention_statistics_are_exact) {
  auto m = make_model(5);
  for (auto& blk : m->blocks) blk->attn.W_Q.weight.fill_(0.f);  // q = 0: every visible key equal
  CopyTask task(tiny_task());
  TaskConfig fixed = tiny_task();
  fixed.min_len = fixed.max_len = 4;  // no padding: query i sees i+1 keys
  CopyTask ftask(fixed);
  const auto data = ftask.held_out(4, 1, 4);
  const HeadStats s = attention_statistics(*m, data);
  const int T = ftask.seq_len();
  double conf = 0, dist = 0, ent = 0;
  for (int i = 0; i < T; ++i) {
    conf += 1.0 / (i + 1);
    dist += i;  // the first of equal weights is the argmax: key 0
    ent += std::log(i + 1.0);
  }
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) {
      BOOST_TEST(s.entropy_norm[l][h] == (T - 1.0) / T, tt::tolerance(1e-5));
      BOOST_TEST(s.entropy[l][h] == ent / T, tt::tolerance(1e-5));
      BOOST_TEST(s.confidence[l][h] == conf / T, tt::tolerance(1e-5));
      BOOST_TEST(s.argmax_distance[l][h] == dist / T, tt::tolerance(1e-9));
    }
}

BOOST_AUTO_TEST_CASE(atlas_norms_equal_slices_of_the_full_gradient) {
  ModelConfig c = tiny_model();
  c.n_kv_heads = 2;
  TransformerLM m(c, 6);
  CopyTask task(tiny_task());
  const auto data = task.held_out(4, 2, 4);
  ForwardOptions o;
  o.key_padding = data[0].key_padding;
  cross_entropy(m.forward(data[0].inputs, o), data[0].targets).backward();
  const auto rows = head_gradient_norms(m, 7);
  BOOST_TEST(rows.size() == 2u * (4 + 2 + 2 + 4));
  for (const HeadNormRow& r : rows) {
    const auto& attn = m.blocks[r.layer]->attn;
    const Tensor& w = r.matrix == "W_Q" ? attn.W_Q.weight : r.matrix == "W_K" ? attn.W_K.weight
                    : r.matrix == "W_V" ? attn.W_V.weight : attn.W_O.weight;
    const Tensor g = w.grad();
    double s = 0, sw = 0;
    for (int64_t i = 0; i < w.size(0); ++i)
      for (int64_t j = 0; j < w.size(1); ++j) {
        const bool mine = r.matrix == "W_O" ? j / 2 == r.head : i / 2 == r.head;  // d_head 2
        if (!mine) continue;
        s += double(g.at({i, j})) * g.at({i, j});
        sw += double(w.at({i, j})) * w.at({i, j});
      }
    BOOST_TEST(r.grad_norm == std::sqrt(s), tt::tolerance(1e-9));
    BOOST_TEST(r.weight_norm == std::sqrt(sw), tt::tolerance(1e-9));
    BOOST_TEST(r.step == 7);
  }
}

BOOST_AUTO_TEST_CASE(atlas_mlp_norms_are_the_gate_up_and_down_gradients_and_are_written_and_resumed) {
  CopyTask task(tiny_task());
  const auto data = task.held_out(4, 2, 4);
  for (Mlp kind : {Mlp::SwiGLU, Mlp::Plain}) {
    ModelConfig c = tiny_model();
    c.mlp = kind;
    TransformerLM m(c, 6);
    ForwardOptions o;
    o.key_padding = data[0].key_padding;
    cross_entropy(m.forward(data[0].inputs, o), data[0].targets).backward();
    const auto rows = mlp_gradient_norms(m, 7);
    const bool gated = kind == Mlp::SwiGLU;
    BOOST_TEST_REQUIRE(rows.size() == 2u * (gated ? 3 : 2));
    for (const HeadNormRow& r : rows) {
      const FeedForward& f = *m.blocks[r.layer]->ffn;
      const Tensor& w = r.matrix == "W_gate" ? f.gate->weight : r.matrix == "W_in" ? f.fc1.weight : f.fc2.weight;
      BOOST_TEST((r.matrix != "W_gate" || gated));
      double s = 0, sw = 0;
      for (int64_t i = 0; i < w.numel(); ++i)
        s += double(w.grad().data()[i]) * w.grad().data()[i], sw += double(w.data()[i]) * w.data()[i];
      BOOST_TEST(s > 0);
      BOOST_TEST(r.grad_norm == std::sqrt(s), tt::tolerance(1e-9));
      BOOST_TEST(r.weight_norm == std::sqrt(sw), tt::tolerance(1e-9));
      BOOST_TEST((r.step == 7 && r.head == -1));
    }
    // the atlas writes them (step,layer,matrix,...) and a resumed atlas keeps those before its step
    const std::string dir = fresh_dir(gated ? "atlas_mlp_gated" : "atlas_mlp_plain");
    std::filesystem::create_directories(dir);
    {
      GradAtlas a(dir, 1, {}, false);
      a.observe(1, m);
      a.observe(2, m);
    }
    const std::string csv = read_file(dir + "/mlp_grad_atlas.csv");
    BOOST_TEST(csv.starts_with("step,layer,matrix,grad_norm,weight_norm\n1,0," + std::string(gated ? "W_gate" : "W_in") + ","));
    GradAtlas resumed(dir, 1, {}, true);
    BOOST_TEST(resumed.mlp_norm_rows().size() == 2 * rows.size());
    resumed.observe(2, m);  // step 2 again: its old rows dropped, new ones logged
    BOOST_TEST(resumed.mlp_norm_rows().size() == 2 * rows.size());
  }
  ModelConfig attention_only = tiny_model();
  attention_only.d_ff = 0;
  BOOST_TEST(mlp_gradient_norms(TransformerLM(attention_only, 1), 0).empty());
}

BOOST_AUTO_TEST_CASE(circuit_singular_values) {
  // singular values of a known matrix: diag(3, 2) rotated
  const std::vector<double> m = {0, 2, 3, 0};
  auto sv = singular_values(m, 2, 2);
  BOOST_TEST(sv[0] == 3.0, tt::tolerance(1e-12));
  BOOST_TEST(sv[1] == 2.0, tt::tolerance(1e-12));
  // the QK circuit of a head equals the svd of W_Q^h^T W_K^h computed densely
  TransformerLM lm(tiny_model(2), 9);
  const auto qk = qk_circuit_singular_values(lm, 0, 1);
  const Tensor wq = head_rows(lm.blocks[0]->attn.W_Q.weight, 1, 4), wk = head_rows(lm.blocks[0]->attn.W_K.weight, 1, 4);
  std::vector<double> dense(64, 0.0);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j)
      for (int t = 0; t < 4; ++t) dense[i * 8 + j] += double(wq.at({t, i})) * wk.at({t, j});
  const auto ref = singular_values(dense, 8, 8);
  BOOST_TEST(qk.size() == 4u);
  for (size_t i = 0; i < 4; ++i) BOOST_TEST(qk[i] == ref[i], tt::tolerance(1e-5));
  BOOST_TEST(ref[4] < 1e-6);  // rank <= d_head
}

BOOST_AUTO_TEST_CASE(rotary_qk_singular_values_are_the_rotated_circuits_and_the_atlas_writes_their_mean) {
  for (const std::string style : {"half", "interleaved"}) {
    ModelConfig c = tiny_model(2);
    c.positions = Positions::Rotary;
    c.rotary_style = style;
    if (style == "interleaved") c.rotary_dim = 2;  // partial: one of each head's two pairs turns
    TransformerLM lm(c, 9);
    BOOST_TEST_CONTEXT(style) {
      // at an offset: the singular values of the dense W_QK(offset); without one, their mean over 0..max_seq_len-1
      std::vector<double> mean(4, 0.0);
      bool moved = false;
      for (int64_t o = 0; o < c.max_seq_len; ++o) {
        const auto ref = singular_values(qk_circuit(lm, 0, 1, o), 8, 8), got = qk_circuit_singular_values(lm, 0, 1, o);
        BOOST_TEST_REQUIRE(got.size() == 4u);
        for (size_t i = 0; i < 4; ++i) {
          BOOST_TEST(got[i] == ref[i], tt::tolerance(1e-9));
          mean[i] += ref[i] / double(c.max_seq_len);
        }
        moved = moved || std::fabs(ref[0] - qk_circuit_singular_values(lm, 0, 1, 0)[0]) > 1e-3;
      }
      BOOST_TEST(moved);  // the rotation changes the spectrum: offset 0 alone would fail below
      const auto avg = qk_circuit_singular_values(lm, 0, 1);
      for (size_t i = 0; i < 4; ++i) BOOST_TEST(avg[i] == mean[i], tt::tolerance(1e-9));
      // circuits.csv's QK rows are that mean (stable rank of the values it lists)
      const std::string dir = fresh_dir("atlas_rotary_" + style);
      std::filesystem::create_directories(dir);
      GradAtlas(dir, 0, {3}, false).observe(3, lm);
      std::istringstream csv(read_file(dir + "/circuits.csv"));
      std::string line;
      int rows = 0;
      while (std::getline(csv, line))
        if (line.starts_with("3,0,1,QK,")) {
          ++rows;
          std::vector<double> sv;
          std::istringstream cells(line.substr(line.find(',', std::string("3,0,1,QK,").size()) + 1));
          for (std::string v; std::getline(cells, v, ';');) sv.push_back(std::stod(v));
          BOOST_TEST_REQUIRE(sv.size() == 4u);
          for (size_t i = 0; i < 4; ++i) BOOST_TEST(sv[i] == mean[i], tt::tolerance(1e-5));  // written with 6 digits
        }
      BOOST_TEST(rows == 1);
    }
  }
  BOOST_CHECK_THROW(qk_circuit_singular_values(TransformerLM(tiny_model(2), 9), 0, 1, 9), Error);  // max_seq_len 9
}

BOOST_AUTO_TEST_CASE(ablate_command_table_and_resume) {
  const std::string out = temp_path("ablate");
  fs::remove_all(out);
  const std::string cmd = std::string(HEADLAB_BINARY) +
                          " ablate --head-counts 1,2 --seeds 2 --steps 12 --eval-every 6 --eval-size 16 --d-model 8"
                          " --d-ff 16 --task copy --length 3 --alphabet 4 --batch 8 --threads 1 --out " + out;
  const std::string first = run(cmd);
  std::ifstream csv(out + "/ablation.csv");
  std::string header, line;
  std::getline(csv, header);
  BOOST_TEST(header.find("heads,d_head,params,seeds,loss_mean") == 0u);
  for (const char* col : {"token_acc_mean", "exact_tf_mean", "exact_ar_mean", "first_step_99_mean", "time_rel", "memory_rel"})
    BOOST_TEST(header.find(col) != std::string::npos);
  int rows = 0;
  while (std::getline(csv, line)) rows += !line.empty();
  BOOST_TEST(rows == 2);
  BOOST_TEST(first.find("(already done)") == std::string::npos);
  // a rerun reads every finished run back instead of training it again
  fs::remove(out + "/runs/H2-seed1/summary.json");  // ... except one "interrupted" run
  const auto kept = fs::last_write_time(out + "/runs/H1-seed0/metrics.jsonl");
  const std::string second = run(cmd);
  size_t done = 0;
  for (size_t p = second.find("(already done)"); p != std::string::npos; p = second.find("(already done)", p + 1)) ++done;
  BOOST_TEST(done == 3u);
  BOOST_TEST((fs::last_write_time(out + "/runs/H1-seed0/metrics.jsonl") == kept));
  BOOST_TEST(fs::exists(out + "/runs/H2-seed1/summary.json"));
}

BOOST_AUTO_TEST_CASE(head_count_sweep_is_callable_in_process) {
  const std::string out = temp_path("sweep");
  fs::remove_all(out);
  TrainArgs base;
  base.task = TaskConfig::preset("copy");
  base.task.max_len = base.task.min_len = 3;
  base.task.alphabet = 4;
  base.model.d_model = 8;
  base.model.d_ff = 16;
  base.batch = 8;
  base.steps = 12;
  base.eval_every = 6;
  base.eval_size = 16;
  base.threads = 1;
  SweepOptions o;
  o.head_counts = {1, 2};
  o.seeds = 2;
  int steps_seen = 0;
  SweepObserver obs;
  obs.on_step = [&](int, int total, const TrainArgs&, int64_t, float) { BOOST_TEST(total == 4); ++steps_seen; };
  const std::vector<SweepRun> runs = run_head_count_sweep(base, o, out, obs);
  BOOST_TEST_REQUIRE(runs.size() == 4u);
  BOOST_TEST(steps_seen == 4 * 12);
  const int heads[] = {1, 1, 2, 2};
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(runs[i].heads == heads[i]);
    BOOST_TEST(runs[i].seed == static_cast<uint64_t>(i % 2));
    BOOST_TEST(runs[i].d_head == 8 / heads[i]);
    BOOST_TEST(runs[i].curve.size() == 2u);  // evals at steps 6 and 12
    BOOST_TEST(!runs[i].reused);
    BOOST_TEST((runs[i].token_acc >= 0 && runs[i].token_acc <= 1));
  }
  // mechanisms: each run's detector scores are its model's (kept in roles.json), its roles read
  // from them, and the second seed's heads matched one to one to the first seed's
  for (int i = 0; i < 4; ++i) {
    const std::string dir = out + "/runs/H" + std::to_string(heads[i]) + "-seed" + std::to_string(i % 2);
    BOOST_TEST(fs::exists(dir + "/roles.json"));
    const std::unique_ptr<TransformerLM> m = load_model(dir + "/model.safetensors");
    const HeadRoleScores fresh = detector_role_scores(*m, o.role_examples);
    BOOST_TEST_REQUIRE(runs[i].roles.scores.size() == 3u);
    for (size_t d = 0; d < 3; ++d)
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < heads[i]; ++h) {
          BOOST_TEST(runs[i].roles.scores[d][l][h] == fresh.scores[d][l][h]);  // JSON keeps doubles exactly
          BOOST_TEST(runs[i].role[l][h] == head_role(fresh, l, h, o.role_threshold));
        }
    BOOST_TEST(runs[i].matched == (i % 2 == 1));
    if (i % 2 == 1) {
      BOOST_TEST(runs[i].match_pairs == 2 * heads[i]);  // every head of both layers
      BOOST_TEST((runs[i].match_similarity > 0 && runs[i].match_similarity <= 1));
    }
  }
  const std::vector<HeadCountSummary> by_heads = summarize_sweep(runs, o.head_counts);
  for (size_t k = 0; k < 2; ++k) {
    BOOST_TEST_REQUIRE(by_heads[k].detectors.size() == 3u);
    for (size_t d = 0; d < 3; ++d) {
      int with = 0, n = 0;
      for (int i = 0; i < 4; ++i)
        if (runs[i].heads == by_heads[k].heads) {
          with += runs[i].heads_with_role(by_heads[k].detectors[d]) > 0;
          n += runs[i].heads_with_role(by_heads[k].detectors[d]);
        }
      BOOST_TEST(by_heads[k].runs_with_role[d] == with);
      BOOST_TEST(by_heads[k].heads_with_role[d] == n);
    }
    BOOST_TEST(by_heads[k].match_pairs == runs[2 * k + 1].match_pairs);
  }
  // the same call again reads every run back, with the same numbers
  const std::vector<SweepRun> again = run_head_count_sweep(base, o, out);
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(again[i].reused);
    BOOST_TEST(again[i].loss == runs[i].loss);
    BOOST_TEST((again[i].role == runs[i].role));
    BOOST_TEST((again[i].roles.detectors == runs[i].roles.detectors));  // read back from roles.json in the same order
    BOOST_TEST((again[i].roles.scores == runs[i].roles.scores));
    BOOST_TEST(again[i].match_similarity == runs[i].match_similarity);
  }
  // other settings are refused, or recomputed with force
  TrainArgs other = base;
  other.lr = 0.01f;
  BOOST_CHECK_EXCEPTION(run_head_count_sweep(other, o, out), Error, [](const Error& e) {
    return std::string(e.what()).find("holds a run made with other settings (lr is 0.003 in the existing run but 0.01 now)") !=
           std::string::npos;
  });
  o.force = true;
  const std::vector<SweepRun> forced = run_head_count_sweep(other, o, out);
  BOOST_TEST(!forced[0].reused);
}

// The prune study checks its options with the command line's words, from the same table.
BOOST_AUTO_TEST_CASE(prune_study_options_are_checked_as_the_command_line_words_them) {
  auto message = [](const PruneStudyOptions& o) {
    try {
      o.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  PruneStudyOptions o;
  BOOST_TEST(message(o) == "");
  o.step_fraction = 2;
  BOOST_TEST(message(o) == "--step-fraction: value 2 is outside [1e-09, 1]");
  o = {};
  o.l0_steps = 0;
  BOOST_TEST(message(o) == "--l0-steps: value 0 is below 1");
  o = {};
  o.method = "magic";
  BOOST_TEST(message(o) == "--method: 'magic' is not one of michel, l0");
  o = {};
  o.method = "l0", o.target_heads = 3, o.lambda = 0;
  BOOST_TEST(message(o).find("--lambda 0 with --target-heads 3") == 0u);
}

// Intervals cover at the stated rate (simulation): the t-interval of 5 normal values, the
// bootstrap interval of the mean of 100 exponential values (skewed; the percentile bootstrap
// runs a little under 95% there, as the literature says).
BOOST_AUTO_TEST_CASE(intervals_cover_the_true_mean_at_the_stated_rate) {
  Rng rng(11);
  int t_cover = 0, b_cover = 0;
  const int trials = 2000, boot_trials = 400;
  for (int i = 0; i < trials; ++i) {
    std::vector<double> v(5);
    for (double& x : v) x = 3.0 + 2.0 * rng.normal();
    const Interval ci = t_interval95(v);
    t_cover += ci.lo <= 3.0 && 3.0 <= ci.hi;
  }
  for (int i = 0; i < boot_trials; ++i) {
    std::vector<double> v(100);
    for (double& x : v) x = -std::log(1.0 - rng.uniform() * 0.999999);  // exponential, mean 1
    const Interval ci = bootstrap_interval95(v, 1000, 7 + i);
    b_cover += ci.lo <= 1.0 && 1.0 <= ci.hi;
  }
  // binomial spread of the rate: about 0.005 (2000 trials) and 0.011 (400 trials)
  BOOST_TEST(t_cover / double(trials) > 0.935);
  BOOST_TEST(t_cover / double(trials) < 0.965);
  BOOST_TEST(b_cover / double(boot_trials) > 0.90);
  BOOST_TEST(b_cover / double(boot_trials) < 0.975);
  BOOST_TEST(t_quantile975(4) == 2.776);
  BOOST_TEST(std::fabs(t_quantile975(60) - 2.0003) < 2e-3);
  BOOST_TEST(!t_interval95({1.0}).defined());
}

// Per-example losses add up to the held-out loss, and each head's single-head-ablation change of
// the loss lies inside its bootstrap interval over the examples.
BOOST_AUTO_TEST_CASE(ablation_intervals_come_from_per_example_losses_that_add_up) {
  auto m = make_model(4);
  CopyTask task(tiny_task());
  const auto data = task.held_out(24, 9, 8);
  std::vector<double> rows;
  const EvalResult e = evaluate(*m, task, data, false, nullptr, &rows);
  BOOST_TEST_REQUIRE(rows.size() == 24u);
  double sum = 0;
  for (double v : rows) sum += v;
  BOOST_TEST(sum / static_cast<double>(e.tokens) == e.loss, tt::tolerance(1e-5));
  const AblationResult a = single_head_ablation(*m, task, data);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) {
      BOOST_TEST(a.d_loss_ci95_lo[l][h] <= a.d_loss[l][h] + 1e-5);
      BOOST_TEST(a.d_loss[l][h] <= a.d_loss_ci95_hi[l][h] + 1e-5);
      BOOST_TEST(a.d_loss_mean_ci95_lo[l][h] <= a.d_loss_mean[l][h] + 1e-5);
      BOOST_TEST(a.d_loss_mean[l][h] <= a.d_loss_mean_ci95_hi[l][h] + 1e-5);
    }
}
