// What kind of results an output directory holds. Each command that writes a directory of
// results marks it (DIR/.headlab-kind: "train", "ablate", "prune", "detect", "patch", "compose",
// "attn"), and refuses a directory that holds another command's results, so that one model is
// never paired with another model's tables. Directories written before the mark existed are
// recognised by their files.
#pragma once
#include <string>

namespace hl {

std::string output_dir_kind(const std::string& dir);  // "" for none (or no directory)
// Makes `dir` (mkdir -p) and marks it as `kind`; fails naming `flag` when it holds another kind.
void claim_output_dir(const std::string& dir, const std::string& kind, const std::string& flag = "--out");
// Fails naming `flag` when `path` is an existing result file of a run (a checkpoint, summary,
// metrics, table or JSON in a train, ablate or prune directory): no command replaces a run's
// files unless the user removes them first.
void refuse_replacing_run_file(const std::string& flag, const std::string& path);

}  // namespace hl
