// A live progress line on a terminal (step, loss, accuracy, tokens/s, ETA); nothing when
// stderr is not a terminal (then callers print plain periodic log lines instead).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace hl {

bool stderr_is_terminal();
std::string format_duration(double seconds);  // "1:05", "1:02:03"

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool enabled);
  ~ProgressBar();
  void update(int64_t done, const std::string& status);  // redraws at most 10 times a second
  void finish();  // ends the line
  bool enabled() const { return enabled_; }

 private:
  std::string label_;
  int64_t total_;
  bool enabled_, drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace hl
