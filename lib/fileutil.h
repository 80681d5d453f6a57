// Whole-file reads and atomic writes. Every file headlab writes goes through
// write_file_atomic: temp file in the same directory, fsync, rename over the target, fsync
// the directory. A crash (even kill -9) leaves either the old file or the new one, never a
// half-written one.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace hl {

// A regular file's bytes; throws hl::Error naming the path when it cannot be read, is not a
// regular file (a directory, a FIFO, a device: never read until memory runs out or a writer
// comes), or does not fit in the memory available.
std::string read_file(const std::string& path);
void write_file_atomic(const std::string& path, const std::string& bytes);
void make_dirs(const std::string& path);  // mkdir -p
// Fails, naming the path and why, unless write_file_atomic(path, ...) could write it now (its
// directory exists and is writable, and path is not a directory): a command checks its
// output paths before hours of work rather than after.
void check_can_write(const std::string& path);
bool file_exists(const std::string& path);
bool is_valid_utf8(const std::string& text);

// Exclusive ownership of a directory for one process: an advisory lock (flock) on DIR/.lock,
// released when the object is destroyed or the process dies (even by kill -9). A second
// process gets one clear error naming the directory and the owner's pid.
class DirLock {
 public:
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// Removes the temporary files (".NAME.tmp.PID") that write_file_atomic leaves when its process
// is killed mid-write, for PIDs that no longer run. Call with the directory's lock held.
void remove_stale_temp_files(const std::string& dir);

// Fails when `output` names the same file as one of `inputs` (so writing it would destroy an
// input), e.g. `grads --checkpoint m.safetensors --out m.safetensors`.
void refuse_output_over_input(const std::string& flag, const std::string& output,
                              const std::vector<std::pair<std::string, std::string>>& inputs);

// Bytes of memory this process can still use: the smaller of the system's MemAvailable and
// what the cgroup's memory.max leaves (a container or a memory-limited group).
double available_memory_bytes();
std::string format_bytes(double bytes);  // "1.5 GiB"
// Fails with "WHAT: needs about X of memory, more than the Y available" when need > available.
void check_fits_in_memory(double need, const std::string& what);

}  // namespace hl
