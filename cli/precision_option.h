// --precision of the forward-only studies (detect, patch, dla, compose, knockout, edges, view):
// float32, or bf16 for large models (lib/bf16.h). train's --precision is a training setting.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "lib/bf16.h"

namespace hl {

CLI::Option* add_precision_option(CLI::App* sub, std::string& precision);
// The precision to run the command in: bf16 checks the CPU and says on stderr that results are
// approximate (kBf16ResultsNote).
Precision precision_from_flag(const std::string& precision);

}  // namespace hl
