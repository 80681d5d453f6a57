#include "stop.h"

#include <csignal>

namespace hl {
namespace {
volatile std::sig_atomic_t g_stop = 0;  // 0: none; else the signal + 1 (0 + 1 for a front end)
thread_local std::function<bool()> t_poll;
thread_local bool t_polled_stop = false;  // this thread's poll reported a stop (other threads go on)
}  // namespace

void request_stop(int signal) { g_stop = signal + 1; }
void clear_stop_request() {
  g_stop = 0;
  t_polled_stop = false;
}
int stop_signal() { return g_stop > 0 ? g_stop - 1 : 0; }

bool stop_requested() {
  if (g_stop != 0 || t_polled_stop) return true;
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
