// headlab detect: previous-token, duplicate-token and induction scores per head (or a pattern
// of your own): flags -> detect_heads -> table, CSV and heatmap PNG in --out.
#include <cstdio>
#include <memory>

#include "analysis/detectors.h"
#include "analysis/roles.h"
#include "cli/roles.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "train/run_dir.h"

namespace hl {

namespace {

int run_detect(const RoleOpts& o) {
  if (over_training_requested(o)) {
    if (!o.detect.pattern_file.empty()) fail("--pattern goes with --checkpoint: --run scores the three detectors over training");
    return write_scores_over_training(o.run, o.out, "detect", head_score_options(o));
  }
  const std::string out = o.out.empty() ? default_out_dir("detect") : o.out;
  RoleModel m = load_role_model(o);
  // the sequences --run uses at every snapshot (train/over_training.h)
  const std::vector<Batch> data =
      detector_data(m.model->cfg, head_score_options(o),
                    [&]() -> const Task& { return role_task(m, o.checkpoint, "--data probe"); });
  // one forward per batch of up to 64 sequences without a graph or logits: one block's
  // activations at a time, and every layer's (rows, H, T, T) patterns cached
  const ModelConfig& cfg = m.model->cfg;
  const int64_t rows = data[0].size(), T = data[0].inputs.shape[1];
  ModelConfig one_block = cfg;
  one_block.n_layers = 1;
  const double block_bytes = estimate_step_bytes(one_block, rows, T, false, false) - 4.0 * static_cast<double>(parameter_count(one_block));
  const double pattern_bytes = 4.0 * cfg.n_layers * static_cast<double>(rows * cfg.n_heads) * static_cast<double>(T * T);
  announce_memory("detect", block_bytes + pattern_bytes,
                  "batches of " + std::to_string(rows) + " sequences of " + std::to_string(T) + " tokens",
                  o.data == "task" ? "--examples (batches hold up to 64)"
                                   : "--length (the sequences are " + std::to_string(T) + " tokens) or --examples (batches hold up to 64)");
  DetectorOptions opt{o.detect.exclude_bos, o.detect.exclude_current};
  std::vector<std::string> names;
  std::vector<HeadGrid> grids;
  // each score beside its 95% bootstrap interval over the sequences; every detector from one forward
  if (!o.detect.pattern_file.empty()) {
    const SafetensorsFile pf = read_safetensors(o.detect.pattern_file);
    if (!pf.has("pattern")) fail(o.detect.pattern_file, ": no 'pattern' tensor (expected pattern (T, T), float32)");
    const Tensor p = pf.f32("pattern");
    if (p.ndim() != 2 || p.size(0) != p.size(1) || p.size(0) < 1)
      fail(o.detect.pattern_file, ": pattern must be (T, T) with T of 1 or more, got ", p.shape().str());
    check_finite(p, "pattern", o.detect.pattern_file);
    const DetectorIntervals r = detect_with_intervals(*m.model, data, {Detector::PreviousToken}, opt, p.to_vector(), p.size(0));
    add_detector_columns(names, grids, "custom", r.score[0], r.lo[0], r.hi[0]);
  } else {
    const std::vector<Detector> kinds = {Detector::PreviousToken, Detector::DuplicateToken, Detector::Induction};
    const DetectorIntervals r = detect_with_intervals(*m.model, data, kinds, opt);
    for (size_t k = 0; k < kinds.size(); ++k) add_detector_columns(names, grids, to_string(kinds[k]), r.score[k], r.lo[k], r.hi[k]);
  }
  // the files appear together, or none (a full disk, a signal)
  const std::unique_ptr<StagedDir> staged = claim_staged_output_dir(out, "detect");
  std::printf("head detector scores (share of attention on the pattern, 95%% bootstrap interval over the sequences; "
              "%d sequences of %s%s%s):\n\n", o.examples,
              o.data == "probe"         ? "random tokens with a block repeated at a varying distance"
              : o.data == "fixed-probe" ? "repeated random tokens [r r]"
                                        : ("task " + m.config.name).c_str(),
              o.detect.exclude_bos ? ", BOS excluded" : "", o.detect.exclude_current ? ", current token excluded" : "");
  write_detect_files(staged->staging(), names, grids);
  staged->publish();
  std::printf("\nwrote %s/detect.csv, detect.png\n", out.c_str());
  return 0;
}

}  // namespace

void add_detect_command(CLI::App& app, CommandRunner& runner) {
  auto [sub, o] = add_role_command(app, runner, "detect",
                                   "Head detectors: previous-token, duplicate-token and induction scores per head", run_detect);
  sub->add_option("--data", o->data,
                  "probe: random tokens in which a block of --length/2..--length tokens is repeated at a random place, "
                  "so a head that attends a fixed distance back is not taken for an induction head; fixed-probe: [r r] "
                  "with r of --length tokens (every repeat the same distance back); task: the task's held-out sequences")
      ->capture_default_str()->check(CLI::IsMember({"probe", "fixed-probe", "task"}));
  sub->add_option("--length", o->length, "Longest block repeated in the probe; 0 = min(16, max_seq_len / 2), one less with --bos")
      ->capture_default_str()->check(in_range(0, 1 << 19));
  sub->add_option("--bos", o->bos, "probe: start every row with this token id (e.g. the model's BOS); -1 = none")
      ->capture_default_str()->check(in_range(-1, 1 << 24));
  sub->add_flag("--exclude-bos", o->detect.exclude_bos, "Ignore attention to position 0");
  sub->add_flag("--exclude-current-token", o->detect.exclude_current, "Ignore attention of a token to itself");
  add_run_option(sub, *o);
  sub->add_option("--pattern", o->detect.pattern_file, "Score against your own pattern instead: a safetensors file with pattern (T, T)");
}

}  // namespace hl
