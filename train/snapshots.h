// Snapshots of a run: the full resume state (weights, optimizer moments, step, RNGs and data
// position, the run's settings: what checkpoint.safetensors holds) kept at chosen steps as
// RUN/snapshots/step_00000100.safetensors, so that studies can follow the heads over training
// and a run can be continued from any of them exactly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hl {

struct TrainArgs;

// RUN/snapshots
std::string snapshot_dir(const std::string& run);
// RUN/snapshots/step_00000100.safetensors (the step in 8 digits, more when it needs more)
std::string snapshot_path(const std::string& run, int64_t step);
// The steps of the snapshots RUN holds, ascending (empty when it holds none).
std::vector<int64_t> snapshot_steps(const std::string& run);
// A directory of a model's revisions as they are downloaded (Pythia's step0, step1000, ...: one
// subdirectory stepN per step, each a Hugging Face model directory with a config.json): their
// steps, ascending, read from the names; empty when `dir` holds none. Such a directory is a run
// for the analyses over training (train/over_training.h).
std::vector<int64_t> revision_steps(const std::string& dir);
// DIR/stepN
std::string revision_path(const std::string& dir, int64_t step);
// snapshot_path(run, step) when that file exists; otherwise fails with
// "RUN has no snapshot at step 150; it has 0, 100, 200" (or how to make snapshots, when it has none).
std::string require_snapshot(const std::string& run, int64_t step);
// The hint for a run without snapshots: the flags that keep them.
std::string how_to_make_snapshots();

// Whether a run with these settings keeps a snapshot after `step` steps (step 0 = the initial
// weights): a multiple of snapshot_every (0 included), or one of snapshot_at.
bool snapshot_due(const TrainArgs& a, int64_t step);
// Every step in [0, a.steps] that snapshot_due keeps.
std::vector<int64_t> planned_snapshot_steps(const TrainArgs& a);

// Bytes free to an unprivileged writer on the file system that holds `path` (or its nearest
// existing parent directory), from statvfs.
double free_disk_bytes(const std::string& path);
// What the snapshots still to be written cost: `count` files of `bytes_each`; fails with one
// message when the file system under `run` has less room than that.
void check_snapshots_fit_on_disk(const std::string& run, int64_t count, double bytes_each);

}  // namespace hl
