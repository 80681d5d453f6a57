#include "tensor.h"

#include <omp.h>
#include <sched.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cblas.h>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>
#include <vector>

#include "autograd.h"
#include "profile.h"
#include "threads.h"

extern "C" void openblas_set_num_threads(int);

namespace hl {

namespace {
thread_local bool g_grad_enabled = true;

Ref<TensorImpl> new_impl(const Shape& shape) {
  for (int i = 0; i < shape.ndim; ++i)
    HL_CHECK(shape[i] >= 0, "tensor: negative dimension in shape ", shape.str());
  Ref<TensorImpl> t(new TensorImpl());
  t->storage = Ref<Storage>(new Storage(static_cast<size_t>(shape.numel())));
  t->shape = shape;
  return t;
}

int64_t flat_index(const Shape& s, std::initializer_list<int64_t> index) {
  HL_CHECK(static_cast<int>(index.size()) == s.ndim, "at: ", index.size(),
           " indices for a tensor of shape ", s.str());
  int64_t flat = 0;
  int d = 0;
  for (int64_t i : index) {
    HL_CHECK(i >= 0 && i < s[d], "at: index ", i, " out of range for dimension ", d,
             " of shape ", s.str());
    flat = flat * s[d] + i;
    ++d;
  }
  return flat;
}
}  // namespace

void TensorImpl::release_graph() {
  // The list lives behind plain thread-locals (no destructor of their own): a graph dropped by a
  // static destructor after this thread's thread-locals are gone drains a list of its own.
  using List = std::vector<Ref<TensorImpl>>;
  thread_local List* pending_list = nullptr;
  thread_local bool ended = false;
  thread_local bool draining = false;
  struct Reaper {
    ~Reaper() {
      delete pending_list;
      pending_list = nullptr;
      ended = true;
    }
  };
  std::unique_ptr<List> own;  // after the reaper: a list for this drain only
  if (!pending_list) {
    if (!ended) {
      static thread_local Reaper reaper;
      (void)reaper;
      pending_list = new List();
    } else {
      own = std::make_unique<List>();
      pending_list = own.get();
    }
  }
  List& pending = *pending_list;
  for (int i = 0; i < n_parents; ++i) pending.push_back(std::move(parents[i]));
  n_parents = 0;
  backward.reset();  // its captured inputs are also in `pending`, so nothing dies here
  if (draining) return;  // an outer call drains the list
  draining = true;
  struct Done {  // however the drain ends
    std::unique_ptr<List>& own;
    ~Done() {
      draining = false;
      if (own) pending_list = nullptr;
    }
  } done{own};
  while (!pending.empty()) {
    Ref<TensorImpl> t = std::move(pending.back());
    pending.pop_back();
    if (t->refs.load(std::memory_order_acquire) == 1) {  // about to die: hand its graph to the list first
      for (int i = 0; i < t->n_parents; ++i) pending.push_back(std::move(t->parents[i]));
      t->n_parents = 0;
      t->backward.reset();
    }
  }
}

// ---- factories --------------------------------------------------------------------------------
Tensor Tensor::empty(const Shape& shape) { return Tensor(new_impl(shape)); }
Tensor Tensor::zeros(const Shape& shape) { return full(shape, 0.f); }
Tensor Tensor::ones(const Shape& shape) { return full(shape, 1.f); }
Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape);
  t.fill_(value);
  return t;
}
Tensor Tensor::scalar(float value) { return full(Shape{}, value); }
Tensor Tensor::arange(int64_t n) {
  Tensor t = empty({n});
  for (int64_t i = 0; i < n; ++i) t.data()[i] = static_cast<float>(i);
  return t;
}
Tensor Tensor::from(const Shape& shape, const std::vector<float>& values) {
  HL_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from: ", values.size(),
           " values for shape ", shape.str());
  Tensor t = empty(shape);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}
Tensor Tensor::randn(const Shape& shape, Rng& rng, float mean, float std) {
  Tensor t = empty(shape);
  float* p = t.data();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = mean + std * rng.normal();
  return t;
}
Tensor Tensor::uniform(const Shape& shape, Rng& rng, float lo, float hi) {
  Tensor t = empty(shape);
  float* p = t.data();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = rng.uniform(lo, hi);
  return t;
}

// ---- access -------------------------------------------------------------------------------------
int64_t Tensor::size(int axis) const {
  return impl_->shape[normalize_axis("size", axis, ndim())];
}
float Tensor::item() const {
  HL_CHECK(numel() == 1, "item: tensor of shape ", shape().str(), " has ", numel(),
           " elements, not 1");
  return data()[0];
}
float Tensor::at(std::initializer_list<int64_t> index) const {
  return data()[flat_index(shape(), index)];
}
float& Tensor::at(std::initializer_list<int64_t> index) {
  return data()[flat_index(shape(), index)];
}
std::vector<float> Tensor::to_vector() const { return std::vector<float>(data(), data() + numel()); }
void Tensor::copy_from(const Tensor& src) {
  HL_CHECK(src.numel() == numel(), "copy_from: ", src.shape().str(), " into ", shape().str(),
           ": element counts differ");
  std::memcpy(data(), src.data(), sizeof(float) * numel());
}
void Tensor::fill_(float value) { std::fill(data(), data() + numel(), value); }
Tensor Tensor::clone() const {
  Tensor t = empty(shape());
  t.copy_from(*this);
  return t;
}
std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor" << shape().str() << " [";
  int64_t n = std::min<int64_t>(numel(), 16);
  for (int64_t i = 0; i < n; ++i) os << (i ? ", " : "") << data()[i];
  if (numel() > n) os << ", ...";
  os << "]";
  return os.str();
}

// ---- autograd -----------------------------------------------------------------------------------
Tensor& Tensor::requires_grad_(bool on) {
  HL_CHECK(is_leaf(), "requires_grad_: only leaf tensors can change requires_grad (op ",
           impl_->op, ")");
  impl_->requires_grad = on;
  return *this;
}
void Tensor::zero_grad() const { impl_->grad.reset(); }
void Tensor::retain_grad() const { impl_->retains_grad = true; }
Tensor Tensor::detach() const { return storage_view(*this, 0, shape()); }

float* grad_buffer(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return nullptr;
  TensorImpl* p = t.impl();
  if (!p->grad) {
    p->grad = Tensor::zeros(p->shape).ref();
  }
  return p->grad->data();
}

float* grad_buffer_for_overwrite(const Tensor& t, bool& fresh) {
  fresh = false;
  if (!t.defined() || !t.requires_grad()) return nullptr;
  TensorImpl* p = t.impl();
  if (!p->grad) {
    p->grad = Tensor::empty(p->shape).ref();
    fresh = true;
  }
  return p->grad->data();
}

Tensor storage_view(const Tensor& base, int64_t offset, const Shape& shape) {
  HL_CHECK(offset >= 0 && offset + shape.numel() <= base.numel(), "storage_view: ", shape.str(),
           " at offset ", offset, " does not fit in ", base.shape().str());
  Ref<TensorImpl> t(new TensorImpl());
  t->storage = base.impl()->storage;
  t->offset = base.impl()->offset + offset;
  t->shape = shape;
  return Tensor(std::move(t));
}

namespace {
bool impls_back_to_back(const TensorImpl* a, const TensorImpl* b) {
  return a && b && a->storage.get() == b->storage.get() && a->offset + a->shape.numel() == b->offset;
}
}  // namespace

bool back_to_back(std::span<const Tensor> ts) {
  for (size_t i = 0; i < ts.size(); ++i)
    if (!ts[i].defined() || (i > 0 && !impls_back_to_back(ts[i - 1].impl(), ts[i].impl()))) return false;
  return !ts.empty();
}

float* grad_slab_for_overwrite(std::span<const Tensor> ts, bool& fresh) {
  fresh = false;
  if (!back_to_back(ts)) return nullptr;
  int64_t total = 0, with_grad = 0;
  for (const Tensor& t : ts) {
    if (!t.requires_grad()) return nullptr;
    total += t.numel();
    with_grad += t.impl()->grad ? 1 : 0;
  }
  if (with_grad == 0) {
    Tensor slab = Tensor::empty({total});
    int64_t at = 0;
    for (const Tensor& t : ts) {
      t.impl()->grad = storage_view(slab, at, t.shape()).ref();
      at += t.numel();
    }
    fresh = true;
    return slab.data();
  }
  for (size_t i = 0; i < ts.size(); ++i)
    if (!ts[i].impl()->grad || (i > 0 && !impls_back_to_back(ts[i - 1].impl()->grad.get(), ts[i].impl()->grad.get())))
      return nullptr;
  return ts[0].impl()->grad->data();
}

void Tensor::backward(const Tensor& grad_output, bool retain_graph) const {
  HL_CHECK(defined(), "backward: undefined tensor");
  HL_CHECK(requires_grad(), "backward: tensor of shape ", shape().str(),
           " does not require grad (no parameter or input in its graph requires grad)");
  // Seed dL/d(root).
  if (grad_output.defined()) {
    HL_CHECK(grad_output.shape() == shape(), "backward: grad_output ", grad_output.shape().str(),
             " does not match tensor ", shape().str());
  } else {
    HL_CHECK(numel() == 1, "backward: a tensor of shape ", shape().str(),
             " needs an explicit grad_output");
  }
  // The scratch lists of one backward pass. A pass run from inside another (a backward hook
  // that calls backward on some other graph) gets lists of its own; the outermost pass reuses
  // this thread's, so a training step allocates nothing. The lists are emptied on every exit,
  // exceptions included, so no graph node outlives the pass in a thread-local.
  struct Scratch {
    std::vector<std::pair<TensorImpl*, Ref<TensorImpl>>> earlier;  // set-aside retained grads
    std::vector<TensorImpl*> order;
    std::vector<std::pair<TensorImpl*, int>> stack;
    std::vector<Ref<TensorImpl>> keep;
    void clear() {
      earlier.clear();
      order.clear();
      stack.clear();
      keep.clear();
    }
  };
  thread_local Scratch outermost;
  thread_local int depth = 0;
  std::unique_ptr<Scratch> own = depth > 0 ? std::make_unique<Scratch>() : nullptr;
  Scratch& S = own ? *own : outermost;
  struct PassGuard {
    Scratch& s;
    TensorImpl* root;
    int exceptions = std::uncaught_exceptions();
    PassGuard(Scratch& s, TensorImpl* root) : s(s), root(root) { ++depth; }
    ~PassGuard() {
      if (std::uncaught_exceptions() > exceptions) {
        // A closure threw (a hook raised): intermediate nodes drop the gradients this pass
        // left on them, and retained ones get back what they held before it, so a later
        // backward through the same graph starts clean. Leaves keep what reached them.
        for (TensorImpl* node : s.order)
          if (!node->is_leaf() && !node->retains_grad && node != root) node->grad.reset();
        for (auto& [held, old] : s.earlier) held->grad = old;
      }
      s.clear();
      --depth;
    }
  } guard(S, impl_.get());
  auto& earlier = S.earlier;
  auto& order = S.order;
  auto& stack = S.stack;
  auto& keep = S.keep;

  // A retained gradient (retain_grad) from an earlier backward is set aside and added back
  // once the node has run: this pass propagates only its own gradient, as in PyTorch (the
  // node's gradient buffer is also what its backward reads).
  auto set_aside = [&earlier](TensorImpl* node) {
    if (!node->is_leaf() && node->retains_grad && node->grad) {
      earlier.push_back({node, node->grad});
      node->grad.reset();
    }
  };
  set_aside(impl_.get());
  float* g = grad_buffer(*this);
  if (grad_output.defined()) {
    const float* src = grad_output.data();
    for (int64_t i = 0, n = numel(); i < n; ++i) g[i] += src[i];
  } else {
    g[0] += 1.f;
  }

  // Reverse topological order by an iterative post-order DFS (no recursion depth limit).
  thread_local uint32_t epoch = 0;
  ++epoch;
  stack.push_back({impl_.get(), 0});
  impl_->visit_mark = epoch;
  while (!stack.empty()) {
    auto& [node, next_child] = stack.back();
    if (next_child < node->n_parents) {
      TensorImpl* child = node->parents[next_child++].get();
      if (child->visit_mark != epoch && !child->is_leaf()) {
        child->visit_mark = epoch;
        stack.push_back({child, 0});
      }
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }
  // `order` is post-order (parents before children); run it backwards. Keep the nodes alive
  // while we free their links: a node may be referenced only by its child's parent list.
  keep.assign(order.size(), Ref<TensorImpl>());
  for (size_t i = 0; i < order.size(); ++i) keep[i] = Ref<TensorImpl>(order[i]);
  for (TensorImpl* node : order)
    if (node != impl_.get()) set_aside(node);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    TensorImpl* node = *it;
    if (node->grad && node->backward) {
      node->backward(*node);
    } else if (!node->backward && !node->is_leaf()) {
      fail("backward: graph of op ", node->op,
           " was already freed; pass retain_graph=true to the first backward");
    }
    for (auto& [held, old] : earlier)  // add back a retained gradient of an earlier pass
      if (held == node) {
        if (!node->grad) {
          node->grad = old;
        } else {
          float* dst = node->grad->data();
          const float* src = old->data();
          for (int64_t i = 0, n = node->shape.numel(); i < n; ++i) dst[i] += src[i];
        }
      }
    if (!retain_graph) {
      node->backward.reset();
      for (int p = 0; p < node->n_parents; ++p) node->parents[p].reset();
      node->n_parents = 0;
    }
    if (!node->retains_grad && node != impl_.get()) node->grad.reset();
  }
  if (!impl_->is_leaf() && !impl_->retains_grad) impl_->grad.reset();
}

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = prev_; }

// The CPUs the process may use, as OpenMP counted them at start (with OMP_PROC_BIND the
// calling thread's own affinity may since have been narrowed to one place).
int usable_cores() { return std::max(1, omp_get_num_procs()); }

namespace {
// Busy and total jiffies of each CPU (index = CPU number), from /proc/stat.
std::vector<std::pair<uint64_t, uint64_t>> cpu_jiffies() {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return out;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "cpu", 3) != 0 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;  // cpuN only
    unsigned cpu;
    unsigned long long v[8] = {0};
    if (std::sscanf(line, "cpu%u %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                    &v[6], &v[7]) < 5)
      continue;
    if (cpu >= out.size()) out.resize(cpu + 1);
    const uint64_t idle = v[3] + v[4];  // idle + iowait
    uint64_t total = 0;
    for (unsigned long long x : v) total += x;
    out[cpu] = {total - idle, total};
  }
  std::fclose(f);
  return out;
}
}  // namespace

int idle_cores(double window_s) {
  // a reading the tests inject (a busy machine on demand), used instead of /proc/stat
  if (const char* fake = std::getenv("HEADLAB_TEST_IDLE_CORES"); fake && *fake) return std::clamp(std::atoi(fake), 1, usable_cores());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return usable_cores();
  if (CPU_COUNT(&set) < usable_cores()) {  // pinned by OMP_PROC_BIND: look at every CPU
    CPU_ZERO(&set);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  }
  const auto a = cpu_jiffies();
  ::usleep(static_cast<useconds_t>(window_s * 1e6));
  const auto b = cpu_jiffies();
  if (a.empty() || a.size() != b.size()) return usable_cores();
  double busy = 0;
  int cores = 0;
  for (size_t c = 0; c < a.size(); ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    ++cores;
    const double dt = static_cast<double>(b[c].second - a[c].second);
    if (dt > 0) busy += static_cast<double>(b[c].first - a[c].first) / dt;
  }
  if (cores == 0) return usable_cores();
  return std::max(1, cores - static_cast<int>(busy + 0.5));
}

ThreadChoice choose_threads(int most) {
  ThreadChoice c;
  c.threads = std::max(1, std::min(most, usable_cores()));
  const int idle = idle_cores();
  if (idle >= c.threads) return c;
  const int cores = usable_cores(), busy = cores - idle;
  c.notice = std::to_string(busy) + " of the " + std::to_string(cores) + " cores " + (busy == 1 ? "is" : "are") +
             " busy with other processes: running on " + std::to_string(idle) + " thread" + (idle == 1 ? "" : "s");
  c.threads = idle;
  return c;
}

void set_num_threads(int n) {
  HL_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got ", n);
  n = std::min(n, usable_cores());  // more threads than cores only wait for each other
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}
int num_threads() { return omp_get_max_threads(); }

namespace {
std::atomic<double> g_parallel_min_step_work{kParallelMinStepWork};
}
double parallel_min_step_work() { return g_parallel_min_step_work.load(); }
void set_parallel_min_step_work(double work) { g_parallel_min_step_work.store(work); }

bool threads_wait_passively() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return policy && strcasecmp(policy, "passive") == 0;
}

SmallStepOnOneThread::SmallStepOnOneThread(double work) {
  if (work >= parallel_min_step_work() || omp_in_parallel() || omp_get_max_threads() == 1 || threads_wait_passively()) return;
  restore_ = omp_get_max_threads();
  omp_set_num_threads(1);
  openblas_set_num_threads(1);
}
SmallStepOnOneThread::~SmallStepOnOneThread() {
  if (restore_ == 0) return;
  omp_set_num_threads(restore_);
  openblas_set_num_threads(restore_);
}

}  // namespace hl

namespace hl {
const char* prof_cat_name(ProfCat c) {
  static const char* names[] = {"matmul", "attention", "layernorm", "softmax/cross-entropy",
                                "elementwise", "embedding", "optimizer"};
  return names[static_cast<int>(c)];
}
}  // namespace hl
