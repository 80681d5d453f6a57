#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace hl {

bool stderr_is_terminal() { return ::isatty(2) == 1; }

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(int64_t done, const std::string& status) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double frac = total_ > 0 ? static_cast<double>(done) / total_ : 1.0;
  const int width = 24, filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar += std::string(width - filled, '.');
  const double eta = done > 0 ? elapsed * (total_ - done) / done : -1;
  std::fprintf(stderr, "\r\033[K%s [%s] %lld/%lld %s ETA %s", label_.c_str(), bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total_), status.c_str(),
               format_duration(eta).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (enabled_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace hl
