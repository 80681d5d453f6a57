// Child processes (gnuplot, bench's own measurements, the nanoGPT converter) started from an
// argument vector, never through a shell: no text of ours or of the user's is ever parsed as a
// command line.
#pragma once
#include <string>
#include <vector>

#include "lib/core.h"

namespace hl {

// A child that outlived its time limit (it has been ended).
struct ChildTimedOut : Error {
  using Error::Error;
};

struct ChildOptions {
  std::string cwd;           // directory the child starts in (empty: ours)
  std::string output_file;   // its stdout and stderr go here (empty: stdout captured, stderr ours)
  bool forward_stop = false; // a stop asked for while it runs ends it (SIGTERM, then SIGKILL)
  double time_limit_s = 0;   // > 0: a child still running after this long is ended and reported
};

// Runs argv[0] (searched in PATH) with argv. Returns its exit status (128 + signal when a signal
// ended it, 127 when it could not be started); stdout in *captured when output_file is empty.
// The child runs in a process group of its own, so a terminal's Ctrl-C (sent to the whole
// foreground group) reaches this process alone, which decides: with forward_stop, a stop
// request (SIGINT/SIGTERM to us) made while the child runs ends it; without it, or when the stop
// came before the child started (finishing up after a stop), the child runs to its end. Ending a
// child is SIGTERM to its group, then SIGKILL after a short grace, so a child that ignores or
// cannot answer SIGTERM (deadlocked) is never waited for forever. A child that outlives
// time_limit_s is ended the same way and reported by throwing ChildTimedOut. The child dies with this
// process (PR_SET_PDEATHSIG).
int run_child_process(const std::vector<std::string>& argv, const ChildOptions& opt, std::string* captured = nullptr);

}  // namespace hl
