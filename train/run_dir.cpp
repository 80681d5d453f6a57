#include "train/run_dir.h"

#include <cstdio>
#include <filesystem>

#include "lib/core.h"
#include "lib/fileutil.h"

namespace hl {

namespace fs = std::filesystem;

namespace {
constexpr const char* kMark = ".headlab-kind";

// A directory from before the mark: its kind from the files only that kind writes.
std::string kind_from_files(const fs::path& d) {
  std::error_code ec;
  auto has = [&](const char* name) { return fs::exists(d / name, ec); };
  if (has("prune_settings.json") || has("prune.json") || has("l0.csv")) return "prune";
  if (has("ablation.json") || has("ablation.csv")) return "ablate";
  if (has("checkpoint.safetensors") || has("summary.json") || has("metrics.jsonl")) return "train";
  if (has("detect.csv")) return "detect";
  if (has("patch_heads.csv")) return "patch";
  if (has("compose.csv")) return "compose";
  if (has("attn.safetensors")) return "attn";
  return "";
}
}  // namespace

std::string output_dir_kind(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  const fs::path mark = fs::path(dir) / kMark;
  if (fs::exists(mark, ec)) {
    std::string k = read_file(mark.string());
    while (!k.empty() && (k.back() == '\n' || k.back() == ' ')) k.pop_back();
    return k;
  }
  return kind_from_files(dir);
}

namespace {
// Fails when `path` is, or is inside, the snapshots directory of a train run (RUN/snapshots).
void refuse_inside_snapshots(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const fs::path full = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) return;
  for (fs::path p = full; p.has_relative_path(); p = p.parent_path())
    if (p.filename() == "snapshots" && output_dir_kind(p.parent_path().string()) == "train")
      fail(flag, " ", path, ": inside the snapshots of the run in ", p.parent_path().string(),
           "; headlab does not write among a run's snapshots: choose another ", flag);
}
}  // namespace

void check_output_dir(const std::string& dir, const std::string& kind, const std::string& flag) {
  refuse_inside_snapshots(flag, dir);
  const std::string held = output_dir_kind(dir);
  if (!held.empty() && held != kind)
    fail(flag, " ", dir, ": the directory holds the results of headlab ", held, "; headlab ", kind,
         " writes to a directory of its own: choose another ", flag);
}

void claim_output_dir(const std::string& dir, const std::string& kind, const std::string& flag) {
  check_output_dir(dir, kind, flag);
  make_dirs(dir);
  const std::string mark = (fs::path(dir) / kMark).string();
  if (!file_exists(mark)) write_file_atomic(mark, kind + "\n");
}

std::unique_ptr<StagedDir> claim_staged_output_dir(const std::string& dir, const std::string& kind,
                                                   const std::string& flag) {
  check_output_dir(dir, kind, flag);
  auto staged = std::make_unique<StagedDir>(dir);
  if (!file_exists((fs::path(dir) / kMark).string())) write_file_atomic(staged->file(kMark), kind + "\n");
  return staged;
}

void refuse_replacing_run_file(const std::string& flag, const std::string& path) {
  refuse_inside_snapshots(flag, path);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return;
  const fs::path p(path);
  const std::string kind = output_dir_kind(p.has_parent_path() ? p.parent_path().string() : ".");
  if (kind != "train" && kind != "ablate" && kind != "prune") return;
  const std::string ext = p.extension().string();
  if (ext == ".safetensors" || ext == ".json" || ext == ".jsonl" || ext == ".csv")
    fail(flag, " ", path, ": the file belongs to the ", kind, " run in ", p.parent_path().string(),
         "; headlab does not replace a run's files: remove it first or choose another ", flag);
}

std::string first_json_difference(const nlohmann::json& stored, const nlohmann::json& now,
                                  const std::set<std::string>& ignored, const std::string& stored_side,
                                  const std::string& now_side) {
  using json = nlohmann::json;
  if (!stored.is_object() || !now.is_object()) return stored == now ? "" : "the stored settings are not a JSON object";
  for (const json& op : json::diff(stored, now)) {
    const std::string path = op.at("path");
    bool skip = false;  // the pointer itself or one above it (an element of an ignored list)
    for (std::string p = path; !p.empty() && !skip; p = p.substr(0, p.rfind('/'))) skip = ignored.count(p) > 0;
    if (skip) continue;
    const json::json_pointer ptr(path);
    auto show = [&](const json& j) {  // float settings as the user typed them (0.01, not 0.009999999776)
      const json v = j.value(ptr, json());
      if (!v.is_number_float()) return v.dump();
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.7g", v.get<double>());
      return std::string(buf);
    };
    return path.substr(1) + " is " + show(stored) + " " + stored_side + " but " + show(now) + " " + now_side;
  }
  return "";
}

void reuse_only_if_same(const std::string& dir, const std::string& what, const std::string& difference, bool force,
                        const std::string& force_flag, const std::function<void()>& discard) {
  if (difference.empty()) return;
  if (force) return discard();
  fail(dir, " holds ", what, " made with other settings (", difference,
       "): rerun with the same flags, choose another --out, or pass ", force_flag, " to discard it and recompute");
}

namespace {
// FNV-1a over bytes given in pieces: the hash of their concatenation.
struct Fnv1a {
  uint64_t h = 1469598103934665603ull;
  size_t n = 0;
  void add(const char* p, size_t k) {
    for (size_t i = 0; i < k; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
    n += k;
  }
  std::string text() const {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%zu bytes, fnv1a %016llx", n, static_cast<unsigned long long>(h));
    return buf;
  }
};
}  // namespace

std::string fingerprint(const std::string& bytes) {
  Fnv1a f;
  f.add(bytes.data(), bytes.size());
  return f.text();
}

std::string file_fingerprint(const std::string& path) {
  Fnv1a f;
  read_file_blocks(path, [&](const char* p, size_t k) { f.add(p, k); });
  return f.text();
}

}  // namespace hl
