// Reading a large file a range at a time (lib/fileutil.cpp): the safetensors reader takes each
// tensor's bytes where they lie, never the whole file at once.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace hl {

// A regular file opened as read_file opens it, handed to `use` with its size and a reader of any
// byte range of it (read(offset, length, to); fails naming the path when the range is not there,
// e.g. the file shrank): a reader of a large file takes the pieces it needs, one at a time.
using ReadRange = std::function<void(uint64_t offset, uint64_t length, char* to)>;
void read_file_ranges(const std::string& path, const std::function<void(uint64_t size, const ReadRange& read)>& use);

}  // namespace hl
