#include "fileutil.h"
#include "file_ranges.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <fstream>
#include <sstream>

#include "core.h"

namespace hl {

namespace {
// What a non-regular file is, in the words of the messages ("" for a regular file).
const char* kind_of(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "";
  return S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a pipe (FIFO)"
         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : S_ISSOCK(st.st_mode) ? "a socket"
         : S_ISLNK(st.st_mode) ? "a symbolic link" : "not a file";
}
}  // namespace

std::string non_regular_kind(const std::string& path, bool follow_links) {
  struct stat st;
  if ((follow_links ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) return "";
  return kind_of(st);
}

void refuse_replacing_non_regular(const std::string& what, const std::string& path) {
  const std::string kind = non_regular_kind(path, false);
  if (!kind.empty())
    fail(what, path, ": exists and is ", kind, ", not a regular file: headlab replaces only regular files; "
         "give a path of its own");
}

std::FILE* open_log(const std::string& path, bool append) {
  refuse_replacing_non_regular("", path);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) fail(path, ": cannot open for writing: ", std::strerror(errno));
  std::FILE* f = ::fdopen(fd, append ? "a" : "w");
  if (!f) {
    ::close(fd);
    fail(path, ": cannot open for writing: ", std::strerror(errno));
  }
  return f;
}

namespace {
// Opens a regular file for reading, or fails naming it. The type is checked before opening
// (opening a device can act on it), and again on what was opened (O_NONBLOCK: a FIFO swapped in
// meanwhile does not wait for a writer). Returns the descriptor; `st` is the opened file's.
int open_regular_file(const std::string& path, struct stat& st) {
  if (::stat(path.c_str(), &st) != 0) fail(path, ": cannot open: ", std::strerror(errno));
  auto refuse_special = [&](const struct stat& st) {
    if (S_ISREG(st.st_mode)) return;
    fail(path, ": is ", kind_of(st), ", not a regular file: give a file");
  };
  refuse_special(st);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  try {
    if (::fstat(fd, &st) != 0) fail(path, ": cannot read: ", std::strerror(errno));
    refuse_special(st);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}
struct Closer {
  int fd;
  ~Closer() { ::close(fd); }
};
// Reads up to n bytes at p; fewer only at the end of the file (it may shrink while we read it).
size_t read_fully(int fd, const std::string& path, char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(fd, p + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) fail(path, ": read error: ", std::strerror(errno));
    if (k == 0) break;
    got += static_cast<size_t>(k);
  }
  return got;
}
}  // namespace

std::string read_file(const std::string& path) {
  struct stat st;
  const Closer closer{open_regular_file(path, st)};
  const double size = static_cast<double>(st.st_size);
  check_fits_in_memory(size, path + " (" + format_bytes(size) + ")");
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  bytes.resize(read_fully(closer.fd, path, bytes.data(), bytes.size()));
  return bytes;
}

void read_file_ranges(const std::string& path, const std::function<void(uint64_t size, const ReadRange& read)>& use) {
  struct stat st;
  const Closer closer{open_regular_file(path, st)};
  use(static_cast<uint64_t>(st.st_size), [&](uint64_t offset, uint64_t length, char* to) {
    for (uint64_t got = 0; got < length;) {
      const ssize_t k = ::pread(closer.fd, to + got, length - got, static_cast<off_t>(offset + got));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) fail(path, ": read error: ", std::strerror(errno));
      if (k == 0) fail(path, ": ends before byte ", offset + length, " (it changed while read)");
      got += static_cast<uint64_t>(k);
    }
  });
}

void read_file_blocks(const std::string& path, const std::function<void(const char*, size_t)>& block) {
  struct stat st;
  const Closer closer{open_regular_file(path, st)};
  std::vector<char> buf(size_t{1} << 20);  // 1 MiB at a time, whatever the file's size
  for (size_t n; (n = read_fully(closer.fd, path, buf.data(), buf.size())) > 0;) block(buf.data(), n);
}

// Well-formed UTF-8 as the Unicode standard defines it (its Table 3-7): no overlong forms, no
// surrogates, nothing above U+10FFFF; what JSON writers accept.
bool is_valid_utf8(const std::string& text) {
  const size_t n = text.size();
  auto at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  for (size_t i = 0; i < n;) {
    const unsigned c = at(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t extra;
    unsigned lo = 0x80, hi = 0xbf;  // the second byte's range
    if (c >= 0xc2 && c <= 0xdf) extra = 1;
    else if (c == 0xe0) extra = 2, lo = 0xa0;
    else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) extra = 2;
    else if (c == 0xed) extra = 2, hi = 0x9f;
    else if (c == 0xf0) extra = 3, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3) extra = 3;
    else if (c == 0xf4) extra = 3, hi = 0x8f;
    else return false;
    if (i + extra >= n) return false;
    if (at(i + 1) < lo || at(i + 1) > hi) return false;
    for (size_t k = 2; k <= extra; ++k)
      if ((at(i + k) & 0xc0) != 0x80) return false;
    i += extra + 1;
  }
  return true;
}

void check_fits_in_memory(double need, const std::string& what) {
  const double have = available_memory_bytes();
  if (need > have)
    fail(what, ": needs about ", format_bytes(need), " of memory, more than the ", format_bytes(have), " available");
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp." +
                                  std::to_string(::getpid()))).string();
  refuse_replacing_non_regular("", path);  // a rename over a device or a FIFO would replace it
  // O_EXCL | O_NOFOLLOW: a link planted at the temporary name is never followed; a leftover of an
  // earlier process with our pid (or such a link) is removed, itself, and the name made anew once
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0)
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
  if (fd < 0) fail(StagedDir::shown_path(path), ": cannot write: ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(StagedDir::shown_path(path), ": write failed: ", std::strerror(e));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(StagedDir::shown_path(path), ": fsync failed: ", std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(StagedDir::shown_path(path), ": rename failed: ", std::strerror(e));
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {  // make the rename itself durable
    ::fsync(dfd);
    ::close(dfd);
  }
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) fail(path, ": cannot create directory: ", ec.message());
}

void check_can_write(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (path.empty() || fs::is_directory(target, ec)) fail(path, ": cannot write: is a directory");
  refuse_replacing_non_regular("", path);
  if (!fs::is_directory(dir, ec)) fail(path, ": cannot write: no directory ", dir.string());
  if (::access(dir.c_str(), W_OK) != 0) fail(path, ": cannot write: ", dir.string(), ": ", std::strerror(errno));
}

bool file_exists(const std::string& path) { return std::filesystem::exists(path); }

DirLock::DirLock(const std::string& dir) {
  const std::string path = dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot open the lock file: ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char buf[32] = {0};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (e != EWOULDBLOCK) fail(path, ": cannot lock: ", std::strerror(e));
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    pid = pid.substr(0, pid.find('\n'));
    if (pid == std::to_string(::getpid()))
      fail(dir, " is in use by another trainer of this process: let its run end (or delete it) first");
    fail(dir, " is in use by another headlab process (pid ", pid.substr(0, pid.find('\n')),
         "): wait for it to finish or choose another --out");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // the lock holds without the pid; only the message of a second process is poorer
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

namespace {
// The pid in a temporary name ("...tmp.PID", "...partial.PID") still runs.
bool pid_runs(const std::string& id) {  // id: "PID" or "PID.N"
  const std::string pid = id.substr(0, id.find('.'));
  if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) return true;  // not ours: keep
  const long p = std::strtol(pid.c_str(), nullptr, 10);
  return p <= 0 || ::kill(static_cast<pid_t>(p), 0) == 0 || errno != ESRCH;
}
}  // namespace

void remove_stale_temp_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (name.empty() || name[0] != '.' || at == std::string::npos) continue;
    if (pid_runs(name.substr(at + 5))) continue;  // its writer still runs
    fs::remove(entry.path(), ec);
  }
}

namespace {
// The live staging directories (staging -> final), for messages that name a file being written.
std::mutex staged_mutex;
std::vector<std::pair<std::string, std::string>>& live_stagings() {
  static std::vector<std::pair<std::string, std::string>> live;
  return live;
}
void forget_staging(const std::string& stage) {
  std::lock_guard<std::mutex> lock(staged_mutex);
  auto& live = live_stagings();
  std::erase_if(live, [&](const auto& p) { return p.first == stage; });
}
}  // namespace

std::string StagedDir::shown_path(const std::string& path) {
  std::lock_guard<std::mutex> lock(staged_mutex);
  for (const auto& [stage, dir] : live_stagings())
    if (path.size() > stage.size() && path.compare(0, stage.size(), stage) == 0 && path[stage.size()] == '/')
      return (std::filesystem::path(dir) / path.substr(stage.size() + 1)).string();
  return path;
}

StagedDir::StagedDir(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/" names out
  if (fs::exists(target, ec) && !fs::is_directory(target, ec)) fail(dir, ": exists and is not a directory");
  // an existing directory (a rerun, a link to one, a mount point) stages inside itself, so that
  // the renames stay on its file system; a new one beside itself, to appear by one rename
  in_place_ = fs::is_directory(target, ec);
  const fs::path home = in_place_ ? target : target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!in_place_) make_dirs(home.string());
  const std::string prefix = in_place_ ? ".headlab.partial." : "." + target.filename().string() + ".partial.";
  for (const auto& entry : fs::directory_iterator(home, ec)) {  // a killed writer's leftovers
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && !pid_runs(name.substr(prefix.size()))) fs::remove_all(entry.path(), ec);
  }
  // pid and a count: two StagedDirs of one DIR in one process (Python threads) never share one
  static std::atomic<int> count{0};
  stage_ = (home / (prefix + std::to_string(::getpid()) + "." + std::to_string(count++))).string();
  fs::remove_all(stage_, ec);
  if (!fs::create_directory(stage_, ec)) fail(dir, ": cannot create a directory to write in: ", ec.message());
  std::lock_guard<std::mutex> lock(staged_mutex);
  live_stagings().emplace_back(stage_, dir_);
}

StagedDir::~StagedDir() {
  forget_staging(stage_);
  if (published_) return;
  std::error_code ec;
  std::filesystem::remove_all(stage_, ec);
}

void StagedDir::publish() {
  namespace fs = std::filesystem;
  std::error_code ec;
  // every file is complete, and every target checked, before the first is renamed in
  const auto move_entries_in = [&] {
    std::vector<std::pair<fs::path, std::string>> moves;
    for (const auto& entry : fs::directory_iterator(stage_)) {
      const std::string to = (fs::path(dir_) / entry.path().filename()).string();
      if (entry.is_directory(ec) && fs::exists(fs::symlink_status(to, ec)))
        fail(to, ": exists: a directory of results is not written over another");
      refuse_replacing_non_regular("", to);
      moves.emplace_back(entry.path(), to);
    }
    for (const auto& [from, to] : moves)
      if (::rename(from.c_str(), to.c_str()) != 0) fail(to, ": rename failed: ", std::strerror(errno));
    fs::remove(stage_, ec);
  };
  if (!in_place_) {  // one rename: the whole directory appears at once
    if (::rename(stage_.c_str(), dir_.c_str()) != 0) {
      // DIR appeared since the start (another command named it too): move the files in instead
      if (errno != EEXIST && errno != ENOTEMPTY) fail(dir_, ": cannot create: ", std::strerror(errno));
      if (!fs::is_directory(fs::symlink_status(dir_, ec))) fail(dir_, ": exists and is not a directory");
      move_entries_in();
    }
  } else {
    move_entries_in();
  }
  published_ = true;
  const fs::path target(dir_);
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  for (const fs::path& d : {target, parent}) {  // make the renames durable
    const int dfd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) ::fsync(dfd), ::close(dfd);
  }
}

bool is_own_file_of(const std::string& dir, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return true;
  const fs::path home = fs::weakly_canonical(dir, ec), real = fs::weakly_canonical(path, ec);
  if (ec) return false;
  if (real.parent_path() == home) return true;
  const fs::path snapshots = home.parent_path(), repo = snapshots.parent_path();
  const bool hub_snapshot = snapshots.filename() == "snapshots" && repo.filename().string().starts_with("models--");
  return hub_snapshot && real.parent_path() == repo / "blobs";
}

void refuse_output_over_input(const std::string& flag, const std::string& output,
                              const std::vector<std::pair<std::string, std::string>>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(output, ec);
  for (const auto& [in_flag, in] : inputs) {
    if (in.empty()) continue;
    std::error_code ec2;
    const bool same = (!ec && out == fs::weakly_canonical(in, ec2)) || fs::equivalent(output, in, ec2);
    if (same) fail(flag, " ", output, " is the same file as ", in_flag, " ", in, ": writing it would destroy the input; choose another output");
  }
}

double available_memory_bytes() {
  double avail = INFINITY;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    unsigned long long kb;
    while (std::fscanf(f, "%63s %llu kB", key, &kb) == 2)
      if (std::string(key) == "MemAvailable:") {
        avail = static_cast<double>(kb) * 1024.0;
        break;
      }
    std::fclose(f);
  }
  auto read_number = [](const char* path) {
    double v = INFINITY;
    if (FILE* f = std::fopen(path, "r")) {
      unsigned long long n;
      if (std::fscanf(f, "%llu", &n) == 1) v = static_cast<double>(n);  // "max" reads as no limit
      std::fclose(f);
    }
    return v;
  };
  const double limit = read_number("/sys/fs/cgroup/memory.max");
  double used = read_number("/sys/fs/cgroup/memory.current");
  if (std::isfinite(limit) && std::isfinite(used)) {
    // memory.current counts the page cache, which the kernel gives back on demand
    if (FILE* f = std::fopen("/sys/fs/cgroup/memory.stat", "r")) {
      char key[64];
      unsigned long long n;
      while (std::fscanf(f, "%63s %llu", key, &n) == 2)
        if (std::string(key) == "inactive_file" || std::string(key) == "active_file") used -= static_cast<double>(n);
      std::fclose(f);
    }
    avail = std::min(avail, limit - std::max(0.0, used));
  }
  // `ulimit -v` caps this process's address space: what it has mapped already is taken
  struct rlimit as;
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    double mapped = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      unsigned long long pages;
      if (std::fscanf(f, "%llu", &pages) == 1) mapped = static_cast<double>(pages) * static_cast<double>(sysconf(_SC_PAGESIZE));
      std::fclose(f);
    }
    avail = std::min(avail, std::max(0.0, static_cast<double>(as.rlim_cur) - mapped));
  }
  return avail;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

}  // namespace hl
