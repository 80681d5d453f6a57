#define BOOST_TEST_MODULE optim
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/nn.h"
#include "lib/optim.h"

using namespace hl;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_CASE(adamw_one_step_by_hand) {
  // p = [1, -2], g = [0.5, 0.1], lr 0.1, wd 0.01, betas (0.9, 0.999), eps 1e-8.
  // Step 1: p *= (1 - lr*wd) = 0.999; m = 0.1 g; v = 0.001 g^2; m_hat = g, v_hat = g^2,
  // p -= lr * g / (|g| + eps) = lr * sign(g) (to 1e-7).
  Tensor p = Tensor::from({2}, {1.f, -2.f}).requires_grad_();
  p.impl()->grad = Tensor::from({2}, {0.5f, 0.1f}).ref();
  Adam opt({{"p", p, true}}, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, /*decoupled=*/true);
  opt.step();
  BOOST_TEST(p.at({0}) == 1.f * 0.999f - 0.1f, tt::tolerance(1e-6f));
  BOOST_TEST(p.at({1}) == -2.f * 0.999f - 0.1f, tt::tolerance(1e-6f));
  // Step 2 with g = [0.5, -0.1]: m = 0.9*0.05 + 0.1*g, v = 0.999*v1 + 0.001 g^2.
  p.impl()->grad = Tensor::from({2}, {0.5f, -0.1f}).ref();
  const float p0 = p.at({0}), p1 = p.at({1});
  opt.step();
  const double bc1 = 1 - 0.81, bc2 = 1 - 0.999 * 0.999;
  auto expect = [&](double pv, double g1, double g2) {
    const double m = 0.9 * (0.1 * g1) + 0.1 * g2, v = 0.999 * (0.001 * g1 * g1) + 0.001 * g2 * g2;
    return pv * (1 - 0.1 * 0.01) - 0.1 * (m / bc1) / (std::sqrt(v / bc2) + 1e-8);
  };
  BOOST_TEST(p.at({0}) == expect(p0, 0.5, 0.5), tt::tolerance(1e-5));
  BOOST_TEST(p.at({1}) == expect(p1, 0.1, -0.1), tt::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(adamw_excluded_params_do_not_decay) {
  Tensor p = Tensor::from({1}, {1.f}).requires_grad_();
  p.impl()->grad = Tensor::from({1}, {0.f}).ref();
  Adam opt({{"p", p, false}}, 0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, true);
  opt.step();
  BOOST_TEST(p.item() == 1.f);
}

BOOST_AUTO_TEST_CASE(sgd_momentum_by_hand) {
  Tensor p = Tensor::from({1}, {1.f}).requires_grad_();
  SGD opt({{"p", p, true}}, 0.1f, 0.9f);
  p.impl()->grad = Tensor::from({1}, {1.f}).ref();
  opt.step();  // buf = 1, p = 0.9
  BOOST_TEST(p.item() == 0.9f, tt::tolerance(1e-6f));
  opt.step();  // buf = 1.9, p = 0.71
  BOOST_TEST(p.item() == 0.71f, tt::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(clip_by_global_norm) {
  Tensor a = Tensor::from({2}, {0.f, 0.f}).requires_grad_(), b = Tensor::from({1}, {0.f}).requires_grad_();
  a.impl()->grad = Tensor::from({2}, {3.f, 0.f}).ref();
  b.impl()->grad = Tensor::from({1}, {4.f}).ref();
  BOOST_TEST(clip_grad_norm({a, b}, 1.f) == 5.f);
  BOOST_TEST(a.grad().at({0}) == 0.6f, tt::tolerance(1e-5f));
  BOOST_TEST(b.grad().at({0}) == 0.8f, tt::tolerance(1e-5f));
  BOOST_TEST(grad_norm({a, b}) == 1.f, tt::tolerance(1e-5f));
}

// The global norm is computed on every thread (gradients shared out by size) yet must be the
// one-thread sum's bits: 8 double lanes per gradient (lane l: elements l mod 8), all lanes added
// in parameter then lane order. Gradients large enough for the threads, one without a gradient.
BOOST_AUTO_TEST_CASE(global_norm_on_two_threads_is_the_one_thread_sum) {
  set_num_threads(2);
  Rng rng(3);
  std::vector<Tensor> ps;
  for (int64_t n : {40001, 17, 0, 70000, 5}) {
    ps.push_back(Tensor::zeros({std::max<int64_t>(n, 1)}).requires_grad_());
    if (n) ps.back().impl()->grad = Tensor::randn({n}, rng).ref();
  }
  double s = 0;
  std::vector<std::vector<float>> before;
  for (const Tensor& p : ps) {
    before.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<float>());
    double lanes[8] = {};
    const std::vector<float>& g = before.back();
    for (size_t k = 0; k < g.size(); ++k) lanes[k % 8] += static_cast<double>(g[k]) * g[k];
    for (double lane : lanes) s += lane;
  }
  const float want = static_cast<float>(std::sqrt(s));
  BOOST_TEST(grad_norm(ps) == want);
  BOOST_TEST(clip_grad_norm(ps, 10.f) == want);
  const float scale = 10.f / (want + 1e-6f);
  for (size_t i = 0; i < ps.size(); ++i)
    for (size_t k = 0; k < before[i].size(); ++k) BOOST_TEST(ps[i].grad().data()[k] == before[i][k] * scale);
}

BOOST_AUTO_TEST_CASE(schedules_at_chosen_steps) {
  LrSchedule s{ScheduleKind::WarmupCosine, 1.f, 10, 110, 0.1f};
  BOOST_TEST(s.at(0) == 0.1f, tt::tolerance(1e-6f));
  BOOST_TEST(s.at(9) == 1.f, tt::tolerance(1e-6f));
  BOOST_TEST(s.at(10) == 1.f, tt::tolerance(1e-6f));
  BOOST_TEST(s.at(60) == 0.55f, tt::tolerance(1e-5f));  // half way: min + (1-min)/2
  BOOST_TEST(s.at(110) == 0.1f, tt::tolerance(1e-6f));
  BOOST_TEST(s.at(500) == 0.1f, tt::tolerance(1e-6f));
  LrSchedule l{ScheduleKind::WarmupLinear, 2.f, 0, 100, 0.f};
  BOOST_TEST(l.at(0) == 2.f);
  BOOST_TEST(l.at(25) == 1.5f, tt::tolerance(1e-6f));
  BOOST_TEST(l.at(100) == 0.f, tt::tolerance(1e-6f));
  LrSchedule c{ScheduleKind::Constant, 0.5f, 4, 100, 0.f};
  BOOST_TEST(c.at(1) == 0.25f);
  BOOST_TEST(c.at(50) == 0.5f);
  BOOST_CHECK_THROW(parse_schedule("exp"), Error);
}

BOOST_AUTO_TEST_CASE(optimizer_state_round_trip) {
  Tensor p = Tensor::from({2}, {1.f, 2.f}).requires_grad_();
  Adam a({{"p", p, true}}, 0.1f, 0.9f, 0.999f, 1e-8f, 0.f, true);
  p.impl()->grad = Tensor::from({2}, {0.3f, -0.2f}).ref();
  a.step();
  Tensor q = p.clone().requires_grad_();
  Adam b({{"p", q, true}}, 0.1f, 0.9f, 0.999f, 1e-8f, 0.f, true);
  std::vector<std::pair<std::string, Tensor>> st;
  for (auto& [n, t] : a.state()) st.push_back({n, t.clone()});
  b.load_state(st, a.steps());
  q.impl()->grad = Tensor::from({2}, {0.1f, 0.1f}).ref();
  p.impl()->grad = Tensor::from({2}, {0.1f, 0.1f}).ref();
  a.step();
  b.step();
  BOOST_TEST(p.to_vector() == q.to_vector());
}

BOOST_AUTO_TEST_CASE(modules_name_and_count_parameters) {
  Rng rng(0);
  Linear l(4, 3, true, rng);
  auto named = l.named_parameters();
  BOOST_TEST(named.size() == 2u);
  BOOST_TEST(named[0].first == "weight");
  BOOST_TEST(l.num_parameters() == 15);
  Linear nb(4, 3, false, rng);
  BOOST_TEST(nb.num_parameters() == 12);
}

BOOST_AUTO_TEST_CASE(initialisers_are_seeded_and_bounded) {
  Rng a(5), b(5);
  Tensor x = Tensor::empty({64, 32}), y = Tensor::empty({64, 32});
  init_xavier_uniform(x, a);
  init_xavier_uniform(y, b);
  BOOST_TEST(x.to_vector() == y.to_vector());
  const float bound = std::sqrt(6.f / (64 + 32));
  float lo = 1, hi = -1;
  for (float v : x.to_vector()) lo = std::min(lo, v), hi = std::max(hi, v);
  BOOST_TEST(lo >= -bound);
  BOOST_TEST(hi <= bound);
  BOOST_TEST(hi > 0.9f * bound);  // the range is actually used
  Tensor n = Tensor::empty({200, 100});
  init_normal(n, a, 0.02f);
  double s2 = 0;
  for (float v : n.to_vector()) s2 += double(v) * v;
  BOOST_TEST(std::sqrt(s2 / n.numel()) == 0.02, tt::tolerance(0.02));
}
