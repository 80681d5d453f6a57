#include "stop.h"

#include <atomic>
#include <csignal>

namespace hl {
namespace {
std::atomic<int> g_stop{0};  // 0: none; else the signal + 1 (lock-free: safe in a signal handler)
static_assert(std::atomic<int>::is_always_lock_free);
thread_local std::function<bool()> t_poll;
thread_local bool t_polled_stop = false;  // this thread was asked to stop (other threads go on)
}  // namespace

void request_stop(int signal) { g_stop.store(signal + 1, std::memory_order_relaxed); }
void request_stop_on_this_thread() { t_polled_stop = true; }
void clear_stop_request() {
  g_stop.store(0, std::memory_order_relaxed);
  t_polled_stop = false;
}
void clear_stop_on_this_thread() { t_polled_stop = false; }
int stop_signal() {
  const int s = g_stop.load(std::memory_order_relaxed);
  return s > 0 ? s - 1 : 0;
}

bool stop_requested() {
  if (g_stop.load(std::memory_order_relaxed) != 0 || t_polled_stop) return true;
  if (t_poll && t_poll()) t_polled_stop = true;
  return t_polled_stop;
}

int stop_exit_code() { return 128 + (stop_signal() > 0 ? stop_signal() : SIGINT); }
std::string stop_signal_name() {
  switch (stop_signal()) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "an interrupt";
  }
}

void throw_if_stopped() {
  if (stop_requested()) throw Stopped("stopped by " + stop_signal_name(), stop_signal());
}

StopPoll::StopPoll(std::function<bool()> poll) : previous_(std::move(t_poll)) { t_poll = std::move(poll); }
StopPoll::~StopPoll() { t_poll = std::move(previous_); }

}  // namespace hl
