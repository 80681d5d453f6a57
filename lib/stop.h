// Stopping long work at a safe point. A signal handler (the command line's SIGINT/SIGTERM) or
// a front end (Python's Ctrl-C) asks for a stop; loops that may run long (training steps,
// an analysis's examples) ask stop_requested() between units of work and end cleanly:
// training writes its checkpoint, an analysis throws Stopped and writes nothing.
#pragma once
#include <functional>
#include <string>

#include "core.h"

namespace hl {

// Raised by throw_if_stopped(): the work was interrupted at a safe point.
struct Stopped : Error {
  Stopped(const std::string& what, int signal) : Error(what), signal(signal) {}
  int signal;  // SIGINT, SIGTERM, or 0 when a front end asked
};

// Process-wide, async-signal-safe: a signal handler may call it. `signal` is remembered for the
// exit code.
void request_stop(int signal = 0);
// For the calling thread only (a front end's Ctrl-C noticed on the thread that runs the work):
// other threads' work goes on.
void request_stop_on_this_thread();
void clear_stop_request();         // both kinds
void clear_stop_on_this_thread();  // this thread's only
// True once a stop was asked for, or when this thread's poll (below) reports one.
bool stop_requested();
int stop_signal();  // the signal of the request (0: none or a front end's)
// A command's exit status after a stop: 128 + the signal (130 for Ctrl-C, 143 for SIGTERM).
int stop_exit_code();
std::string stop_signal_name();  // "SIGINT", "SIGTERM" or "an interrupt"
void throw_if_stopped();  // throws Stopped when stop_requested()

// A front end whose interrupts arrive some other way (Python notes Ctrl-C and lets C++ ask)
// installs a poll for the calling thread while it runs long work. A stop the poll reports
// stops only this thread's work.
class StopPoll {
 public:
  explicit StopPoll(std::function<bool()> poll);
  ~StopPoll();
  StopPoll(const StopPoll&) = delete;
  StopPoll& operator=(const StopPoll&) = delete;

 private:
  std::function<bool()> previous_;
};

}  // namespace hl
