// What kind of results an output directory holds. Each command that writes a directory of
// results marks it (DIR/.headlab-kind: "train", "ablate", "prune", "detect", "patch", "compose",
// "attn", "study"), and refuses a directory that holds another command's results, so that one model is
// never paired with another model's tables. Directories written before the mark existed are
// recognised by their files.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "lib/fileutil.h"

namespace hl {

std::string output_dir_kind(const std::string& dir);  // "" for none (or no directory)
// Makes `dir` (mkdir -p) and marks it as `kind`; fails naming `flag` when it holds another kind.
// Fails too when `dir` is inside a run's snapshots (RUN/snapshots): they are the run's own.
void claim_output_dir(const std::string& dir, const std::string& kind, const std::string& flag = "--out");
// What claim_output_dir refuses, refused now, making nothing (for a check before long work).
void check_output_dir(const std::string& dir, const std::string& kind, const std::string& flag = "--out");
// The same for a directory written all or nothing: checks `dir` as above before anything is
// made, then returns its StagedDir with the mark among the staged files (it appears with them).
std::unique_ptr<StagedDir> claim_staged_output_dir(const std::string& dir, const std::string& kind,
                                                   const std::string& flag = "--out");
// Fails naming `flag` when `path` is an existing result file of a run (a checkpoint, summary,
// metrics, table or JSON in a train, ablate or prune directory, or a snapshot), or lies inside a
// run's snapshots directory: no command replaces a run's files unless the user removes them first.
void refuse_replacing_run_file(const std::string& flag, const std::string& path);

// The first setting that differs between the settings stored with earlier results and today's
// ("lr is 0.01 in the existing run but 0.05 now"), skipping the JSON pointers in `ignored`;
// "" when they agree. An ignored pointer covers what lies below it. The two sides are named by
// `stored_side` and `now_side`.
std::string first_json_difference(const nlohmann::json& stored, const nlohmann::json& now,
                                  const std::set<std::string>& ignored = {},
                                  const std::string& stored_side = "in the existing run", const std::string& now_side = "now");
// Results already in `dir` are reused only if they were made with the same settings: with a
// `difference` (as above), refuses naming it, or with `force` calls `discard` to remove the old
// results. `what` says what dir holds ("a run", "pruning results").
void reuse_only_if_same(const std::string& dir, const std::string& what, const std::string& difference, bool force,
                        const std::string& force_flag, const std::function<void()>& discard);

// "N bytes, fnv1a H" of a file's bytes: the same text for the same contents, another for a file
// that was changed or replaced.
std::string fingerprint(const std::string& bytes);
// fingerprint() of a file's bytes, read in blocks (a data file larger than memory is hashed too).
std::string file_fingerprint(const std::string& path);

}  // namespace hl
