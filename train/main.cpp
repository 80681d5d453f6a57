// headlab: train small transformers on the copy task and study their attention heads.
#include <cstdio>

#include "train/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"headlab: train small transformers and study multi-head attention, head by head"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "headlab 0.1");
  hl::CommandRunner runner;
  hl::add_train_command(app, runner);
  hl::add_grads_command(app, runner);
  hl::add_attn_command(app, runner);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return runner ? runner() : 0;
  } catch (const hl::Error& e) {
    std::fprintf(stderr, "headlab: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "headlab: error: %s\n", e.what());
    return 1;
  }
}
