#include "train/snapshots.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lib/core.h"
#include "lib/fileutil.h"
#include "train/trainer.h"

namespace hl {

namespace fs = std::filesystem;

std::string snapshot_dir(const std::string& run) { return run + "/snapshots"; }

std::string snapshot_path(const std::string& run, int64_t step) {
  if (step < 0) fail("snapshot_path: step ", step, " is negative");
  char name[48];
  std::snprintf(name, sizeof name, "step_%08lld.safetensors", static_cast<long long>(step));
  return snapshot_dir(run) + "/" + name;
}

std::vector<int64_t> snapshot_steps(const std::string& run) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(snapshot_dir(run), ec)) return steps;
  for (const fs::directory_entry& e : fs::directory_iterator(snapshot_dir(run), ec)) {
    // step_<digits>.safetensors only: write_file_atomic's temporary files start with a dot
    const std::string name = e.path().filename().string();
    const std::string prefix = "step_", suffix = ".safetensors";
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    if (!e.is_regular_file(ec)) continue;
    steps.push_back(std::stoll(digits));
  }
  if (ec) fail(snapshot_dir(run), ": cannot list the snapshots: ", ec.message());
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

std::vector<int64_t> revision_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= 4 || name.size() > 22 || name.rfind("step", 0) != 0 ||
        !std::all_of(name.begin() + 4, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    if (!e.is_directory(ec) || !file_exists((e.path() / "config.json").string())) continue;
    steps.push_back(std::stoll(name.substr(4)));
  }
  if (ec) fail(dir, ": cannot list its revisions: ", ec.message());
  std::sort(steps.begin(), steps.end());
  for (size_t i = 1; i < steps.size(); ++i)  // step1000 and step01000
    if (steps[i] == steps[i - 1]) fail(dir, ": two revision directories name step ", steps[i]);
  return steps;
}

std::string revision_path(const std::string& dir, int64_t step) { return dir + "/step" + std::to_string(step); }

std::string how_to_make_snapshots() {
  return "train with --snapshot-every N or --snapshot-at S1,S2,... (in Python snapshot_every=, snapshot_at=) to keep them";
}

namespace {
std::string step_list(const std::vector<int64_t>& steps) {
  std::string s;
  const size_t n = steps.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 24 && i == 12) {  // a long list: its ends
      s += ", ..." ;
      i = n - 6;
    }
    s += (s.empty() ? "" : ", ") + std::to_string(steps[i]);
  }
  return s;
}
}  // namespace

std::string require_snapshot(const std::string& run, int64_t step) {
  const std::string path = snapshot_path(run, step);
  if (file_exists(path)) return path;
  if (!std::filesystem::is_directory(run)) fail(run, ": no such run directory");
  const std::vector<int64_t> have = snapshot_steps(run);
  if (have.empty()) fail(run, " has no snapshots (", how_to_make_snapshots(), ")");
  fail(run, " has no snapshot at step ", step, "; it has ", step_list(have));
}

bool snapshot_due(const TrainArgs& a, int64_t step) {
  if (a.snapshot_every > 0 && step % a.snapshot_every == 0) return true;
  return std::find(a.snapshot_at.begin(), a.snapshot_at.end(), step) != a.snapshot_at.end();
}

std::vector<int64_t> planned_snapshot_steps(const TrainArgs& a) {
  std::vector<int64_t> steps;
  if (a.snapshot_every > 0)
    for (int64_t s = 0; s <= a.steps; s += a.snapshot_every) steps.push_back(s);
  for (int64_t s : a.snapshot_at)
    if (s >= 0 && s <= a.steps) steps.push_back(s);
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

double free_disk_bytes(const std::string& path) {
  fs::path p = path.empty() ? fs::path(".") : fs::path(path);
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  if (p.empty()) p = ".";
  struct statvfs st;
  if (::statvfs(p.c_str(), &st) != 0) fail(p.string(), ": cannot read the free disk space: ", std::strerror(errno));
  return static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
}

void check_snapshots_fit_on_disk(const std::string& run, int64_t count, double bytes_each) {
  if (count <= 0) return;
  const double need = static_cast<double>(count) * bytes_each, have = free_disk_bytes(run);
  if (need > have)
    fail("snapshots: ", count, " snapshots of ", format_bytes(bytes_each), " each need ", format_bytes(need),
         " of disk, more than the ", format_bytes(have), " free under ", run,
         "; keep fewer (a larger --snapshot-every, fewer --snapshot-at steps) or choose another --out");
}

}  // namespace hl
