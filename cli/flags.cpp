#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <ctime>

#include <type_traits>
#include <variant>

#include "cli/commands.h"
#include "cli/threads_option.h"
#include "lib/fileutil.h"
#include "lib/threads.h"
#include "train/distributed.h"

namespace hl {

namespace {
// The busy-machine rule from `most` threads, said on stderr when it lowers the count.
int threads_for_this_machine(int most) {
  const ThreadChoice c = choose_threads(most);
  say_thread_choice(c.notice, most);
  return c.threads;
}
}  // namespace

void say_thread_choice(const std::string& notice, int wanted) {
  if (!notice.empty()) std::fprintf(stderr, "headlab: %s (--threads %d to use them anyway)\n", notice.c_str(), wanted);
}

CLI::Option* add_setting(CLI::App* app, const std::string& flag, const std::string& help, FieldRef field, double lo, double hi,
                         const std::vector<std::string>& choices, bool is_switch) {
  return std::visit(
      [&](auto* value) {
        CLI::Option* opt;
        if constexpr (std::is_same_v<decltype(value), bool*>) {
          opt = is_switch ? app->add_flag(flag, *value, help) : app->add_option(flag, *value, help);
        } else {
          opt = app->add_option(flag, *value, help);
        }
        if (is_switch) return opt;
        if constexpr (std::is_same_v<decltype(value), std::string*>) {
          if (!value->empty()) opt->capture_default_str();  // no "[]" for a file that is not given
        } else {
          opt->capture_default_str();
        }
        if (!std::isnan(lo)) opt->check(in_range(lo, hi));
        if (!choices.empty()) opt->check(CLI::IsMember(choices));
        return opt;
      },
      field);
}

void TrainFlags::add(CLI::App* app, bool with_run_flags, bool with_heads) {
  app_ = app;
  for (const TrainSetting& s : train_settings()) {
    if ((s.train_only && !with_run_flags) || (s.flag == "--heads" && !with_heads)) continue;
    add_setting(app, s.flag, s.help, s.field(values), s.lo, s.hi, s.choices, s.is_switch);
  }
}

TrainArgs TrainFlags::resolve() const {
  TrainArgs a = resolve_train_flags(values, [this](const std::string& flag) { return given(flag); }, task_training_defaults);
  if (machine_threads && !given("--threads")) {
    a.threads = default_threads(a.threads);  // under mpirun: this rank's share of the cores
    // the busy-machine rule, as for every command (a run's thread count is in its summary)
    if (!in_multi_rank_job()) a.threads = threads_for_this_machine(a.threads);
  }
  a.task.make_paths_absolute();
  return a;
}


CLI::Option* add_threads_option(CLI::App* sub, int& threads) {
  threads = 0;
  return sub
      ->add_option("--threads", threads,
                   "Threads (default " + std::to_string(TrainArgs{}.threads) + ", fewer when other processes keep cores busy)")
      ->check(in_range(1, 1024));
}

int command_threads(int threads) {
  return threads > 0 ? threads : threads_for_this_machine(TrainArgs{}.threads);
}

int64_t parse_int(const std::string& text, int64_t lo, int64_t hi, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long long v = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    fail(what, ": '", text, "' is not a whole number");
  if (v < lo || v > hi) fail(what, ": ", v, " is outside ", lo, "..", hi);
  return v;
}

CLI::Validator in_range(double lo, double hi) {
  return CLI::Validator([lo, hi](std::string& s) -> std::string { return range_problem(s, lo, hi); },
                        range_text(lo, hi));
}

namespace {
extern "C" void on_stop_signal(int sig) {
  request_stop(sig);
  // A second signal of either kind (Ctrl-C then SIGTERM too) ends the process at once.
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}
}  // namespace

void install_stop_handler() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

std::vector<int32_t> parse_token_ids(const std::string& text, int64_t vocab_size, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t at = 0;
  while (true) {
    at = text.find_first_not_of(", \t\n", at);
    if (at == std::string::npos) break;
    const size_t end = std::min(text.find_first_of(", \t\n", at), text.size());
    ids.push_back(static_cast<int32_t>(parse_int(text.substr(at, end - at), 0, vocab_size - 1, flag + " (ids of the vocabulary)")));
    at = end;
  }
  if (ids.empty()) fail(flag, ": no token ids given");
  return ids;
}

std::string default_out_dir(const std::string& command) {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  std::string dir = std::string("runs/") + command + "-" + buf;
  if (in_multi_rank_job()) job()->broadcast(dir);  // the ranks' clocks may read different seconds
  return dir;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

void announce_memory(const std::string& command, double need, const std::string& work, const std::string& lower) {
  const double have = available_memory_bytes();
  if (need > have)
    fail(command, ": ", work, " needs about ", format_bytes(need), " of memory, more than the ", format_bytes(have),
         " available; lower ", lower);
  std::fprintf(stderr, "headlab %s: about %s of memory for %s, beyond the loaded model (%s available)\n", command.c_str(), format_bytes(need).c_str(),
               work.c_str(), format_bytes(have).c_str());
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * v);
  return buf;
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  if (rows.empty()) return;
  std::vector<size_t> w(rows[0].size(), 0);
  for (auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string line;
    for (size_t c = 0; c < rows[i].size(); ++c) {
      const std::string& s = rows[i][c];
      const bool numeric = !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-');
      const bool left = c == 0 || !numeric;
      const std::string padding(w[c] - s.size(), ' ');
      line += (c ? "  " : "") + (left ? s + padding : padding + s);
    }
    std::printf("%s\n", line.c_str());
    if (i == 0) {
      std::string rule;
      for (size_t c = 0; c < w.size(); ++c) rule += (c ? "  " : "") + std::string(w[c], '-');
      std::printf("%s\n", rule.c_str());
    }
  }
}

}  // namespace hl
