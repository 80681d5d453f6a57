#include "cli/precision_option.h"

#include <cstdio>

namespace hl {

CLI::Option* add_precision_option(CLI::App* sub, std::string& precision) {
  return sub
      ->add_option("--precision", precision,
                   "float32, or bf16 (large models: the linear layers' products with bf16 operands and float32 "
                   "accumulation; needs AVX512_BF16; results are approximate)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bf16"}));
}

Precision precision_from_flag(const std::string& precision) {
  const Precision p = parse_precision(precision, "--precision");
  if (p == Precision::Bf16) {
    require_bf16_cpu();
    std::fprintf(stderr, "%s\n", kBf16ResultsNote);
  }
  return p;
}

}  // namespace hl
