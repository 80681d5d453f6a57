// headlab export: a headlab checkpoint -> a model other tools read. --format hf-gpt2 writes a
// Hugging Face GPT-2 directory (config.json + model.safetensors, GPT2LMHeadModel's keys), with
// the GPT-2 tokenizer files found beside the source copied byte for byte; --format hf-<model_type>
// (gpt_neox, llama, ...) that architecture's layout (models/hf_models.h); --format hf the layout
// the model's options call for.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "lib/fileutil.h"
#include "models/checkpoint.h"
#include "models/hf_gpt2.h"
#include "models/hf_models.h"
#include "train/run_dir.h"

namespace hl {

namespace {

struct ExportOpts {
  std::string checkpoint, format = "hf", out;
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
  const std::string layout = o.format == "hf" ? hf_layout_for(*model) : o.format.substr(3);  // refused before anything is written
  // the tokenizer files beside the source (a model directory's own, or beside a checkpoint file) go with it
  const std::string parent = fs::path(o.checkpoint).parent_path().string();
  const std::string tokenizer_dir = src_is_dir ? o.checkpoint : parent.empty() ? "." : parent;
  if (layout != "gpt2") {
    const bool tied = write_hf_model(*model, layout, o.out, tokenizer_dir);
    std::printf("wrote %s and model.safetensors (%s layout, %s)\n", (fs::path(o.out) / "config.json").lexically_normal().string().c_str(),
                layout.c_str(), tied ? "tied unembedding" : "untied unembedding");
    for (const std::string& name : hf_tokenizer_files())
      if (file_exists(o.out + "/" + name)) std::printf("copied the tokenizer file %s\n", name.c_str());
    return 0;
  }
  check_hf_gpt2_exportable(*model);
  const bool tied = write_hf_gpt2(*model, o.out, tokenizer_dir);
  std::printf("wrote %s and model.safetensors (GPT-2 layout, %s)\n", (fs::path(o.out) / "config.json").lexically_normal().string().c_str(),
              tied ? "tied unembedding" : "untied unembedding: tie_word_embeddings false, lm_head.weight written");
  for (const std::string& name : gpt2_tokenizer_files())
    if (file_exists(o.out + "/" + name)) std::printf("copied the tokenizer file %s\n", name.c_str());
  return 0;
}

}  // namespace

void add_export_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand("export", "Write a headlab checkpoint in another tool's layout (Hugging Face: gpt2, gpt_neox, llama, qwen2, qwen3, mistral, gemma2, gemma3_text, gpt_neo)");
  auto o = std::make_shared<ExportOpts>();
  sub->add_option("checkpoint", o->checkpoint, "Model checkpoint (safetensors, a run directory, or a Hugging Face model directory)")->required();
  std::vector<std::string> formats = {"hf", "hf-gpt2"};
  for (const std::string& t : hf_model_types()) formats.push_back("hf-" + t);
  sub->add_option("--format", o->format, "Layout to write: hf = the Hugging Face layout the model's options call for, or hf-<model_type>")
      ->capture_default_str()->check(CLI::IsMember(formats));
  sub->add_option("--out", o->out, "Directory to write config.json and model.safetensors into")->required();
  sub->callback([&runner, o] { runner = [o] { return run_export(*o); }; });
}

}  // namespace hl
