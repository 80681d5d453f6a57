// --threads of the commands other than train (train's is a training setting, resolved with the
// same rule in TrainFlags::resolve): a count given is obeyed; without one the busy-machine rule
// (choose_threads, lib/threads.h) picks it and says so, as train does.
#pragma once
#include <CLI/CLI.hpp>

namespace hl {

// Binds --threads to `threads`, which stays 0 unless the flag is given.
CLI::Option* add_threads_option(CLI::App* sub, int& threads);
// The thread count to run on: `threads` when given (> 0), else the busy-machine rule from the
// default count, its notice on stderr.
int command_threads(int threads);

}  // namespace hl
