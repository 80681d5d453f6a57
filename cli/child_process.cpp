#include "cli/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "lib/core.h"
#include "lib/stop.h"

namespace hl {

namespace {

constexpr double kGraceSeconds = 2;  // from SIGTERM to SIGKILL when a child is ended

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int run_child_process(const std::vector<std::string>& argv, const ChildOptions& opt, std::string* captured) {
  HL_CHECK(!argv.empty(), "run_child_process: no program");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const bool capture = opt.output_file.empty();
  int pipe_fd[2] = {-1, -1};
  if (capture && ::pipe2(pipe_fd, O_CLOEXEC) != 0) fail(argv[0], ": cannot make a pipe: ", std::strerror(errno));
  int out_fd = -1;
  if (!capture) {
    out_fd = ::open(opt.output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out_fd < 0) fail(opt.output_file, ": cannot open: ", std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    if (capture) ::close(pipe_fd[0]), ::close(pipe_fd[1]);
    if (out_fd >= 0) ::close(out_fd);
    fail(argv[0], ": cannot start: ", std::strerror(e));
  }
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    ::setpgid(0, 0);  // a group of its own: a terminal's Ctrl-C is not sent to it
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    if (!opt.cwd.empty() && ::chdir(opt.cwd.c_str()) != 0) ::_exit(127);
    if (capture) {
      ::dup2(pipe_fd[1], STDOUT_FILENO);
    } else {
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(out_fd, STDERR_FILENO);
    }
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we may signal it
  if (out_fd >= 0) ::close(out_fd);
  if (capture) ::close(pipe_fd[1]);

  const auto started = std::chrono::steady_clock::now();
  // only a stop asked for while the child runs ends it: one started after a stop (the plots of
  // an interrupted training run) is part of finishing up, and runs to its end
  const bool stop_before = stop_requested();
  std::chrono::steady_clock::time_point term_sent;
  bool ending = false, killed = false, timed_out = false;
  // Called between waits: decides whether to end the child, and escalates to SIGKILL when it
  // outlives the grace. The group is signalled, so whatever the child started ends too; the
  // child is not reaped yet, so its pid (the group's id) cannot have been reused.
  const auto watch = [&] {
    if (!ending && opt.time_limit_s > 0 && seconds_since(started) > opt.time_limit_s) timed_out = true;
    if (!ending && (timed_out || (opt.forward_stop && !stop_before && stop_requested()))) {
      ::kill(-pid, SIGTERM);
      term_sent = std::chrono::steady_clock::now();
      ending = true;
    } else if (ending && !killed && seconds_since(term_sent) > kGraceSeconds) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
  };

  bool reading = capture;
  int status = 0;
  char buf[4096];
  for (;;) {
    watch();
    if (reading) {  // until the child's stdout closes
      pollfd p{pipe_fd[0], POLLIN, 0};
      const int ready = ::poll(&p, 1, 50);
      if (ready <= 0) continue;  // a timeout or EINTR: watch again
      const ssize_t n = ::read(pipe_fd[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        if (captured) captured->append(buf, static_cast<size_t>(n));
        continue;
      }
      ::close(pipe_fd[0]);
      reading = false;
    }
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return 127;
    ::usleep(5000);
  }
  if (timed_out) {
    std::ostringstream what;
    what << argv[0] << " was still running after " << opt.time_limit_s << " s and was ended (" << (killed ? "SIGKILL" : "SIGTERM") << ")";
    throw ChildTimedOut(what.str());
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 127;
}

}  // namespace hl
