// Child processes (gnuplot, bench's own measurements) started from an argument vector, never
// through a shell: no text of ours or of the user's is ever parsed as a command line.
#pragma once
#include <string>
#include <vector>

namespace hl {

struct ChildOptions {
  std::string cwd;           // directory the child starts in (empty: ours)
  std::string output_file;   // its stdout and stderr go here (empty: stdout captured, stderr ours)
  bool forward_stop = false; // a stop request made while it runs ends it (SIGTERM)
};

// Runs argv[0] (searched in PATH) with argv. Returns its exit status (128 + signal when a signal
// ended it, 127 when it could not be started); stdout in *captured when output_file is empty.
// The child dies with this process (PR_SET_PDEATHSIG); with forward_stop, a stop request
// (SIGINT/SIGTERM to us) is passed on to it as SIGTERM. Short children (gnuplot drawing the
// plots of a run that was just interrupted) run to their end.
int run_child_process(const std::vector<std::string>& argv, const ChildOptions& opt, std::string* captured = nullptr);

}  // namespace hl
