// Whole-file reads and atomic writes. Every file headlab writes goes through
// write_file_atomic: temp file in the same directory, fsync, rename over the target, fsync
// the directory. A crash (even kill -9) leaves either the old file or the new one, never a
// half-written one.
#pragma once
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hl {

// A regular file's bytes; throws hl::Error naming the path when it cannot be read, is not a
// regular file (a directory, a FIFO, a device: never read until memory runs out or a writer
// comes), or does not fit in the memory available.
std::string read_file(const std::string& path);
// The same file's bytes handed to `block` in pieces of at most 1 MiB, in order: memory stays
// small whatever the file's size.
void read_file_blocks(const std::string& path, const std::function<void(const char*, size_t)>& block);
// Refuses (as check_can_write does) a path that exists and is not a regular file: a device, a
// FIFO, a socket, a directory or a symbolic link is never replaced (a rename would replace the
// node itself, e.g. /dev/null, or the user's link).
void write_file_atomic(const std::string& path, const std::string& bytes);
// "" when `path` is missing or a regular file, else what it is ("a pipe (FIFO)", "a device", "a
// symbolic link" when not following links, ...).
std::string non_regular_kind(const std::string& path, bool follow_links);
// Fails "WHAT PATH: exists and is a device, not a regular file ..." unless `path` is missing or a
// regular file (a symbolic link is refused too): what every writer checks before writing.
void refuse_replacing_non_regular(const std::string& what, const std::string& path);
// A log written line by line (metrics.jsonl): opened for appending or anew, never through a
// link and never onto a device or a FIFO (refused like write_file_atomic's targets).
std::FILE* open_log(const std::string& path, bool append);
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

// A directory of results written all or nothing. A new DIR is written in a hidden sibling,
// DIR/../.NAME.partial.PID.N, renamed to DIR at publish() (DIR made meanwhile by another
// writer: the files are moved into it instead): it appears whole. An existing DIR (a
// rerun) is written in a hidden DIR/.headlab.partial.PID.N whose files are renamed in at publish(),
// once every one is complete. Destroyed before publish() (an error, a full disk, a signal), it
// removes what it wrote, so DIR is as it was; what a killed process left is removed by the next
// StagedDir of the same DIR.
class StagedDir {
 public:
  explicit StagedDir(const std::string& dir);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;
  const std::string& dir() const { return dir_; }      // where the files will be
  const std::string& staging() const { return stage_; }  // where they are written now
  std::string file(const std::string& name) const { return stage_ + "/" + name; }
  void publish();
  // `path` as the user will find it: a file inside a live StagedDir's staging directory named
  // at its place in DIR (for messages: "could not draw out/detect.png", not the hidden path).
  static std::string shown_path(const std::string& path);

 private:
  std::string dir_, stage_;
  bool in_place_ = false, published_ = false;
};

// Whether `path`, an entry of directory `dir`, is dir's own file: not a symbolic link, or a link to
// a file in dir itself, or, when dir is a Hugging Face hub-cache snapshot (.../models--NAME/
// snapshots/REV, whose files are links to ../../blobs/HASH), a link into that same cache
// repository's blobs directory (.../models--NAME/blobs). Any other link leads out of dir.
bool is_own_file_of(const std::string& dir, const std::string& path);

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
