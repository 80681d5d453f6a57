// headlab export: a headlab checkpoint -> a model other tools read. --format hf-gpt2 writes a
// Hugging Face GPT-2 directory (config.json + model.safetensors, GPT2LMHeadModel's keys), with
// the GPT-2 tokenizer files found beside the source copied byte for byte.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "models/hf_gpt2.h"
#include "train/run_dir.h"

namespace hl {

namespace {

struct ExportOpts {
  std::string checkpoint, format = "hf-gpt2", out;
};

int run_export(const ExportOpts& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool src_is_dir = fs::is_directory(o.checkpoint, ec);
  refuse_replacing_run_file("--out", o.out);  // never among a run's snapshots
  if (fs::exists(o.out, ec) && !fs::is_directory(o.out, ec)) fail("--out ", o.out, ": exists and is not a directory");
  if (fs::exists(o.out, ec) && src_is_dir && fs::equivalent(o.out, o.checkpoint, ec))
    fail("--out ", o.out, ": is the source model's directory; choose another");
  for (const auto& entry : fs::directory_iterator(o.out, ec))  // before the model loads; write_hf_gpt2 checks again
    fail("--out ", o.out, ": already holds ", entry.path().filename().string(),
         "; the export writes a directory of its own: give a new or empty directory");
  const std::unique_ptr<TransformerLM> model = load_model(o.checkpoint);
  check_hf_gpt2_exportable(*model);  // refused before anything is written
  const std::string tokenizer_dir =
      src_is_dir ? o.checkpoint : fs::path(o.checkpoint).parent_path().string();
  const bool tied = write_hf_gpt2(*model, o.out, tokenizer_dir.empty() ? "." : tokenizer_dir);
  std::printf("wrote %s and model.safetensors (GPT-2 layout, %s)\n", (fs::path(o.out) / "config.json").lexically_normal().string().c_str(),
              tied ? "tied unembedding" : "untied unembedding: tie_word_embeddings false, lm_head.weight written");
  for (const std::string& name : gpt2_tokenizer_files())
    if (file_exists(o.out + "/" + name)) std::printf("copied the tokenizer file %s\n", name.c_str());
  return 0;
}

}  // namespace

void add_export_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("export", "Write a headlab checkpoint in another tool's layout (Hugging Face GPT-2)");
  auto o = std::make_shared<ExportOpts>();
  sub->add_option("checkpoint", o->checkpoint, "Model checkpoint (safetensors, a run directory, or a Hugging Face GPT-2 directory)")->required();
  sub->add_option("--format", o->format, "Layout to write")->capture_default_str()->check(CLI::IsMember({"hf-gpt2"}));
  sub->add_option("--out", o->out, "Directory to write config.json and model.safetensors into")->required();
  sub->callback([&runner, o] { runner = [o] { return run_export(*o); }; });
}

}  // namespace hl
