// Whole-file reads and atomic writes. Every file headlab writes goes through
// write_file_atomic: temp file in the same directory, fsync, rename over the target, fsync
// the directory. A crash (even kill -9) leaves either the old file or the new one, never a
// half-written one.
#pragma once
#include <string>

namespace hl {

std::string read_file(const std::string& path);  // throws hl::Error naming the path
void write_file_atomic(const std::string& path, const std::string& bytes);
void make_dirs(const std::string& path);  // mkdir -p
bool file_exists(const std::string& path);

}  // namespace hl
