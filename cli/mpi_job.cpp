// ProcessGroup over MPI (MPI_COMM_WORLD). Linked only into the headlab executable.
#include "cli/mpi_job.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <mutex>
#include <thread>

#include "train/trainer.h"  // Interrupted

namespace hl {

namespace {

enum Tag : int { kAskForWork = 1, kWorkItem = 2, kWorkResult = 3 };

class MpiJob : public ProcessGroup {
 public:
  MpiJob() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &ranks_on_node_);
    MPI_Comm_free(&node);
  }
  ~MpiJob() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int ranks_on_node() const override { return ranks_on_node_; }

  void sum_in_rank_order(float* data, int64_t n) override {
    if (size_ == 1) return;
    // Gather each rank's values and add them locally in rank order (the same on every rank), a
    // chunk at a time so the buffer stays bounded: for small models this costs about what an
    // allreduce does, and unlike an allreduce its result never depends on the algorithm chosen.
    const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 22) / size_);  // 16 MiB gathered per round
    const int64_t c_max = std::min(chunk, n);
    if (static_cast<int64_t>(gathered_.size()) < c_max * size_) gathered_.resize(static_cast<size_t>(c_max * size_));
    for (int64_t off = 0; off < n; off += chunk) {
      const int c = static_cast<int>(std::min(chunk, n - off));
      MPI_Allgather(data + off, c, MPI_FLOAT, gathered_.data(), c, MPI_FLOAT, MPI_COMM_WORLD);
      float* out = data + off;
      for (int i = 0; i < c; ++i) {
        float s = gathered_[static_cast<size_t>(i)];
        for (int r = 1; r < size_; ++r) s += gathered_[static_cast<size_t>(r) * c + i];
        out[i] = s;
      }
    }
  }

  void broadcast(std::string& text) override {
    long long len = static_cast<long long>(text.size());
    MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    text.resize(static_cast<size_t>(len));
    if (len > 0) MPI_Bcast(text.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
  }

  std::vector<std::string> share_work(int n, const std::function<std::string(int)>& work) override {
    if (rank_ != 0) {
      for (;;) {
        int item = -1;
        MPI_Send(nullptr, 0, MPI_INT, 0, kAskForWork, MPI_COMM_WORLD);
        MPI_Recv(&item, 1, MPI_INT, 0, kWorkItem, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (item < 0) return {};
        run_or_abort([&] {
          // the item's index, then its text, in one message
          const std::string text = work(item);
          std::string msg(sizeof(int), '\0');
          std::copy_n(reinterpret_cast<const char*>(&item), sizeof(int), msg.data());
          msg += text;
          MPI_Send(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, 0, kWorkResult, MPI_COMM_WORLD);
        });
      }
    }
    // Rank 0 works too: a thread of its own answers the other ranks and sleeps between polls, so it
    // costs no core. It alone calls MPI while it runs, except MPI_Abort after an error in rank 0's
    // own work (hence MPI_THREAD_MULTIPLE).
    std::vector<std::string> results(static_cast<size_t>(n));
    std::mutex m;
    int next = 0;
    auto take = [&] {
      std::lock_guard<std::mutex> lock(m);
      return next < n ? next++ : -1;
    };
    std::thread server([&] {
      int told_done = 0;
      std::string buf;
      while (told_done < size_ - 1) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
        if (!flag) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          continue;
        }
        if (st.MPI_TAG == kAskForWork) {
          MPI_Recv(nullptr, 0, MPI_INT, st.MPI_SOURCE, kAskForWork, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          const int item = take();
          if (item < 0) ++told_done;
          MPI_Send(&item, 1, MPI_INT, st.MPI_SOURCE, kWorkItem, MPI_COMM_WORLD);
        } else {  // a result: a rank sends it before asking again, so all are in when all are done
          int count = 0;
          MPI_Get_count(&st, MPI_CHAR, &count);
          buf.resize(static_cast<size_t>(count));
          MPI_Recv(buf.data(), count, MPI_CHAR, st.MPI_SOURCE, kWorkResult, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          int item = 0;
          std::copy_n(buf.data(), sizeof(int), reinterpret_cast<char*>(&item));
          std::lock_guard<std::mutex> lock(m);
          results[static_cast<size_t>(item)] = buf.substr(sizeof(int));
        }
      }
    });
    // an error here must not unwind past the running thread: it ends the job instead
    run_or_abort([&] {
      for (int item; (item = take()) >= 0;) {
        std::string text = work(item);
        std::lock_guard<std::mutex> lock(m);
        results[static_cast<size_t>(item)] = std::move(text);
      }
    });
    server.join();
    return results;
  }

  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // not reached
  }

 private:
  template <typename F>
  void run_or_abort(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "headlab: rank %d: error: %s\n", rank_, e.what());
      abort(dynamic_cast<const Stopped*>(&e) ? stop_exit_code() : 1);
    }
  }

  int rank_ = 0, size_ = 1, ranks_on_node_ = 1;
  std::vector<float> gathered_;
};

}  // namespace

namespace {
// Rank 0 sees every rank's arguments; any difference (another --steps, --seed, a bad flag on one
// rank) is one line from rank 0 and exit 2 on every rank, before any flag is parsed: ranks that
// ran different commands would hang in a collective or mix their results.
void check_ranks_agree(int rank, int size, int argc, char** argv) {
  std::string mine;
  for (int i = 1; i < argc; ++i) mine += std::string(argv[i]) + '\0';
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size)), at(static_cast<size_t>(size));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) at[static_cast<size_t>(r)] = total, total += lens[static_cast<size_t>(r)];
    all.resize(static_cast<size_t>(total));
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), at.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  int differ = 0;
  if (rank == 0) {
    auto split = [](const std::string& s) {
      std::vector<std::string> v;
      for (size_t i = 0; i < s.size();) {
        const size_t end = s.find('\0', i);
        v.push_back(s.substr(i, end - i));
        i = end + 1;
      }
      return v;
    };
    const std::vector<std::string> first = split(mine);
    for (int r = 1; r < size && !differ; ++r) {
      const std::vector<std::string> other =
          split(all.substr(static_cast<size_t>(at[static_cast<size_t>(r)]), static_cast<size_t>(lens[static_cast<size_t>(r)])));
      if (other == first) continue;
      differ = 1;
      size_t i = 0;
      while (i < first.size() && i < other.size() && first[i] == other[i]) ++i;
      // show the flag with its value: from the flag before a differing value
      const size_t from = i > 0 && ((i < first.size() && first[i].rfind("-", 0) != 0) ||
                                    (i < other.size() && other[i].rfind("-", 0) != 0)) ? i - 1 : i;
      auto show = [&](const std::vector<std::string>& v) {
        std::string t;
        for (size_t k = from; k < v.size() && k < from + 2; ++k) t += (t.empty() ? "" : " ") + v[k];
        return t.empty() ? std::string("nothing there") : t;
      };
      std::fprintf(stderr,
                   "headlab: error: the MPI ranks were started with different arguments: rank %d has '%s' where rank 0 "
                   "has '%s'; start every rank with the same command\n",
                   r, show(other).c_str(), show(first).c_str());
    }
  }
  MPI_Bcast(&differ, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (differ) {
    std::fflush(stderr);
    MPI_Finalize();
    std::exit(2);
  }
}
}  // namespace

std::unique_ptr<ProcessGroup> start_mpi_job(int& argc, char**& argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  auto j = std::make_unique<MpiJob>();
  check_ranks_agree(j->rank(), j->size(), argc, argv);
  if (provided < MPI_THREAD_SERIALIZED && j->size() > 1) {
    std::fprintf(stderr, "headlab: error: this MPI library does not allow calls from a second thread "
                         "(MPI_THREAD_SERIALIZED at least), which sweeps across ranks need\n");
    j->abort(1);
  }
  return j;
}

}  // namespace hl
