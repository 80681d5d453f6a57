// headlab convert: a model made elsewhere -> a headlab checkpoint. A Hugging Face GPT-2
// directory (or any checkpoint headlab reads) is converted here; a nanoGPT ckpt.pt (a torch
// pickle) by scripts/convert_nanogpt.py, run as a child process with Debian's Python and torch
// (it checks the archive's members and unpickles only tensors and containers: nothing in the
// file is ever run, and a TorchScript archive is refused).
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "cli/child_process.h"
#include "cli/commands.h"
#include "lib/fileutil.h"
#include "lib/stop.h"
#include "datasets/tokenizer.h"
#include "models/checkpoint.h"
#include "train/run_dir.h"

#ifndef HEADLAB_SOURCE_DIR
#define HEADLAB_SOURCE_DIR "."
#endif

namespace hl {

namespace {

struct ConvertOpts {
  std::string src, out;
};

// A torch.save file: a zip archive (torch >= 1.6) or a bare pickle (protocol 2+ starts with 0x80).
bool is_torch_file(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".pt" || ext == ".pth" || ext == ".ckpt") return true;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  unsigned char head[4] = {0, 0, 0, 0};
  const size_t n = std::fread(head, 1, 4, f);
  std::fclose(f);
  return (n == 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) || (n >= 1 && head[0] == 0x80);
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

int run_convert(const ConvertOpts& o) {
  refuse_output_over_input("--out", o.out, {{"SRC", o.src}});
  refuse_replacing_run_file("--out", o.out);
  std::error_code ec;
  if (!std::filesystem::exists(o.src, ec)) fail(o.src, ": not found");
  if (const std::string kind = non_regular_kind(o.src, true); !kind.empty() && kind != "a directory")
    fail(o.src, ": is ", kind, ", not a regular file: give a checkpoint file or a model directory");
  if (std::filesystem::is_directory(o.out, ec)) fail("--out ", o.out, ": is a directory; give the checkpoint file to write");
  check_can_write(o.out);
  if (std::filesystem::is_directory(o.src, ec)) {
    // writing into the model's own directory could replace one of its files (model.safetensors, a shard)
    const std::filesystem::path parent = std::filesystem::absolute(o.out).parent_path();
    if (std::filesystem::equivalent(parent, o.src, ec))
      fail("--out ", o.out, ": inside the source directory ", o.src, "; write the checkpoint elsewhere");
  }
  if (!std::filesystem::is_directory(o.src, ec) && is_torch_file(o.src)) {
    const std::string python = env_or("HEADLAB_PYTHON", file_exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3");
    // an installed binary runs its installed copy (bin/../share/headlab), never one in a source tree
    std::error_code e;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", e);
    const std::string installed = exe.parent_path().parent_path().string() + "/share/headlab/scripts/convert_nanogpt.py";
    const std::string script = !e && file_exists(installed)
                                   ? installed
                                   : env_or("HEADLAB_SOURCE_DIR", HEADLAB_SOURCE_DIR) + "/scripts/convert_nanogpt.py";
    if (!file_exists(script)) fail("convert: the nanoGPT converter ", script, " is missing (set HEADLAB_SOURCE_DIR to the source tree)");
    // the script writes beside --out under a name of our own (hidden, with our pid: never a
    // user's file); the file takes --out's name only once headlab loads it
    const std::filesystem::path out_path(o.out);
    const std::string partial =
        (out_path.has_parent_path() ? out_path.parent_path() : std::filesystem::path("."))
            .append("." + out_path.filename().string() + ".converting." + std::to_string(::getpid()))
            .string();
    struct RemovePartial {
      const std::string& path;
      ~RemovePartial() {
        std::error_code e;
        std::filesystem::remove(path, e);
      }
    } remove_partial{partial};
    std::string said;
    // The converter runs in its own process group, so a terminal's Ctrl-C reaches headlab alone;
    // a stop request is passed on to it.
    ChildOptions child;
    child.forward_stop = true;
    const int rc = run_child_process({python, script, o.src, "--out", partial, "--errors-to-stdout"}, child, &said);
    if (rc != 0) {
      // the script's one-line refusal (or its word that a signal stopped it); else what it
      // printed, then the exit status (a traceback went to stderr, above)
      const std::string prefix = "error: ";
      const bool one_line = said.rfind(prefix, 0) == 0 && said.find('\n') + 1 == said.size();
      std::string line = one_line ? said.substr(prefix.size(), said.size() - prefix.size() - 1) : "";
      if (const size_t at = line.find(partial); at != std::string::npos) line.replace(at, partial.size(), o.out);  // (a full disk)
      // stopped (us, passed on to it, or it alone): 130/143 and one line, as every command
      if (stop_requested()) {
        std::fprintf(stderr, "headlab: error: %s: not converted: stopped by %s; nothing was written\n", o.src.c_str(),
                     stop_signal_name().c_str());
        return stop_exit_code();
      }
      if (rc == 128 + SIGINT || rc == 128 + SIGTERM) {
        std::fprintf(stderr, "headlab: error: %s\n",
                     (line.empty() ? o.src + ": not converted: the converter was stopped; nothing was written" : line).c_str());
        return rc;
      }
      if (one_line) fail(line);
      std::fputs(said.c_str(), stderr);
      fail(o.src, ": not converted (", script, " exited with ", rc, ")");
    }
    load_model(partial);  // every check of a headlab checkpoint, before it takes --out's name
    std::filesystem::rename(partial, o.out);
    std::fputs(said.c_str(), stdout);
  } else {
    const SafetensorsFile f = read_checkpoint(o.src);
    const std::unique_ptr<TransformerLM> model = load_model(f);  // every check before writing
    std::map<std::string, std::string> meta;
    if (f.metadata.count("converted_from")) meta["converted_from"] = f.metadata.at("converted_from");
    save_checkpoint(o.out, *model, {}, meta);
  }
  const std::unique_ptr<TransformerLM> model = load_model(o.out);  // what was written loads
  const ModelConfig& c = model->cfg;
  std::printf("wrote %s: %d layers x %d heads, d_model %lld, d_ff %lld, vocab %lld, %lld positions, %lld parameters\n",
              o.out.c_str(), c.n_layers, c.n_heads, static_cast<long long>(c.d_model), static_cast<long long>(c.d_ff),
              static_cast<long long>(c.vocab_size), static_cast<long long>(c.max_seq_len),
              static_cast<long long>(parameter_count(c)));
  std::error_code dir_ec;
  if (std::filesystem::is_directory(o.src, dir_ec) && has_tokenizer_files(o.src))  // the checkpoint holds weights alone
    std::printf("the tokenizer stays in %s: give --tokenizer %s with --text, or keep using the directory itself\n", o.src.c_str(),
                o.src.c_str());
  return 0;
}

}  // namespace

void add_convert_command(CLI::App& app, CommandRunner& runner) {
  CLI::App* sub = app.add_subcommand(
      "convert", "Convert a model made elsewhere (Hugging Face model directory, nanoGPT ckpt.pt) to a headlab checkpoint");
  auto o = std::make_shared<ConvertOpts>();
  sub->add_option("src", o->src, "Hugging Face model directory (config.json + model.safetensors: gpt2, gpt_neox, llama, mistral, qwen2, qwen3, gpt_neo, gemma2), nanoGPT ckpt.pt, or a headlab checkpoint")
      ->required();
  sub->add_option("--out", o->out, "headlab checkpoint to write (safetensors)")->required();
  sub->callback([&runner, o] { runner = [o] { return run_convert(*o); }; });
}

}  // namespace hl
