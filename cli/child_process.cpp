#include "cli/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lib/core.h"
#include "lib/stop.h"

namespace hl {

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
  if (out_fd >= 0) ::close(out_fd);
  bool stopped = false;
  if (capture) {
    ::close(pipe_fd[1]);
    char buf[4096];
    for (;;) {
      if (opt.forward_stop && !stopped && stop_requested()) {
        ::kill(pid, SIGTERM);
        stopped = true;
      }
      pollfd p{pipe_fd[0], POLLIN, 0};
      const int ready = ::poll(&p, 1, 200);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) continue;
      const ssize_t n = ::read(pipe_fd[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (captured) captured->append(buf, static_cast<size_t>(n));
    }
    ::close(pipe_fd[0]);
  }
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, capture ? 0 : WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return 127;
    if (r == 0) {  // still running (output to a file): poll for a stop request
      if (opt.forward_stop && !stopped && stop_requested()) {
        ::kill(pid, SIGTERM);
        stopped = true;
      }
      ::usleep(5000);
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 127;
}

}  // namespace hl
