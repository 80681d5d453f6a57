// headlab.Tokenizer: a tokenizer directory (datasets/tokenizer.h: Hugging Face's tokenizer.json, or
// GPT-2's vocab.json + merges.txt / encoder.json + vocab.bpe) from Python.
#include "bindings.h"
#include "datasets/tokenizer.h"

namespace hl::bindings {

namespace {

// Ids of one sequence from a list or a 1-d integer array ([] is no ids).
std::vector<int32_t> ids_list(const py::object& obj) {
  if (py::isinstance<py::sequence>(obj) && !py::isinstance<py::str>(obj) && py::len(obj) == 0) return {};
  const Ids ids = ids_from(obj, "decode: ids");  // (1, T) for one sequence
  if (ids.shape[0] != 1) throw py::value_error("decode: ids must be one sequence (T), got shape " + ids.shape.str());
  return ids.data;
}

}  // namespace

void bind_tokenizer(py::module_& m) {
  py::class_<Tokenizer, std::shared_ptr<Tokenizer>>(m, "Tokenizer",
                           "A BPE tokenizer giving the same ids as Hugging Face's tokenizers: a tokenizer.json (GPT-NeoX/Pythia, "
                           "Qwen2/3, SmolLM2, Llama 2/3, Gemma) or GPT-2's files.")
      .def_static("load", [](const PathArg& dir) { return std::const_pointer_cast<Tokenizer>(load_tokenizer(dir.path)); }, py::arg("dir"),
                  "From a directory with tokenizer.json (and tokenizer_config.json), vocab.json + merges.txt (Hugging Face's "
                  "GPT-2) or encoder.json + vocab.bpe (OpenAI).")
      .def(
          "encode",
          [](const Tokenizer& t, const py::object& text, bool add_special_tokens) {
            std::string bytes;
            if (py::isinstance<py::bytes>(text)) {
              bytes = text.cast<std::string>();
            } else if (py::isinstance<py::str>(text)) {
              Py_ssize_t n = 0;
              const char* utf8 = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
              if (!utf8) {  // a lone surrogate has no UTF-8
                PyErr_Clear();
                throw py::value_error("encode: the text is not valid Unicode (it holds a lone surrogate)");
              }
              bytes.assign(utf8, static_cast<size_t>(n));
            } else {
              throw py::type_error("encode: expected str (or UTF-8 bytes), got " + std::string(py::str(text.get_type().attr("__name__"))));
            }
            return interruptible([&] { return t.encode(bytes, "text", add_special_tokens); });  // Ctrl-C raises KeyboardInterrupt
          },
          py::arg("text"), py::arg("add_special_tokens") = true,
          "The token ids of text (str, or UTF-8 bytes) as a list of int; special tokens such as '<|endoftext|>' are one id "
          "each. add_special_tokens: the BOS/EOS the tokenizer's files add around a text (as Hugging Face's encode).")
      .def(
          "decode",
          [](const Tokenizer& t, const py::object& ids, bool skip_special_tokens) {
            const std::string bytes = t.decode(ids_list(ids), skip_special_tokens);
            // ids may cut a character apart: those bytes become U+FFFD, as in GPT-2's decoders
            return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "replace"));
          },
          py::arg("ids"), py::arg("skip_special_tokens") = false,
          "The text of ids (str) through the tokenizer's decoder; bytes that are no whole character become U+FFFD.")
      .def(
          "decode_bytes",
          [](const Tokenizer& t, const py::object& ids, bool skip_special_tokens) {
            return py::bytes(t.decode(ids_list(ids), skip_special_tokens));
          },
          py::arg("ids"), py::arg("skip_special_tokens") = false, "The exact bytes of ids through the tokenizer's decoder.")
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size, "How many tokens it has")
      .def_property_readonly("special_tokens", &Tokenizer::special_tokens, "Its special tokens' texts, e.g. <|endoftext|>, <s>")
      .def_property_readonly(
          "bos_token_id", [](const Tokenizer& t) -> py::object { return t.bos_id() < 0 ? py::object(py::none()) : py::object(py::int_(t.bos_id())); },
          "The id a text starts with under prepend_bos (GPT-2: <|endoftext|>; tokenizer.json: its post-processor's or "
          "tokenizer_config.json's bos_token), or None")
      .def("token_to_id", [](const Tokenizer& t, const std::string& token) -> py::object {
             const int32_t id = t.id_of(token);
             return id < 0 ? py::object(py::none()) : py::object(py::int_(id));
           }, py::arg("token"), "The id of a vocabulary entry as written in the files (e.g. 'Ġworld', '▁world'), or None")
      .def("token_text", &Tokenizer::token_text, py::arg("id"),
           "The token's text for display (control characters and partial characters escaped, e.g. '\\\\n', '\\\\xf0').")
      .def("__len__", &Tokenizer::vocab_size)
      .def("__repr__", [](const Tokenizer& t) { return "<headlab.Tokenizer " + t.source() + ": " + t.describe() + ">"; });
}

}  // namespace hl::bindings
