// --threads of the commands other than train (train's is a training setting, resolved with the
// same rule by its run plan, train/run_plan.h): a count given is obeyed; without one the busy-machine rule
// (choose_threads, lib/threads.h) picks it and says so, as train does.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace hl {

// Binds --threads to `threads`, which stays 0 unless the flag is given.
CLI::Option* add_threads_option(CLI::App* sub, int& threads);
// The thread count to run on: `threads` when given (> 0), else the busy-machine rule from the
// default count, its notice on stderr.
int command_threads(int threads);
// The busy-machine rule's notice on stderr, with how to ask for `wanted` threads anyway (no-op when empty).
void say_thread_choice(const std::string& notice, int wanted);

}  // namespace hl
