// headlab.Tokenizer: GPT-2's byte-level BPE (datasets/bpe_tokenizer.h) from Python.
#include "bindings.h"
#include "datasets/bpe_tokenizer.h"

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
  py::class_<BpeTokenizer>(m, "Tokenizer",
                           "GPT-2's byte-level BPE tokenizer: the same ids as OpenAI's encoder and Hugging Face's GPT2Tokenizer.")
      .def_static("load", [](const PathArg& dir) { return BpeTokenizer::load(dir.path); }, py::arg("dir"),
                  "From a directory with vocab.json + merges.txt (Hugging Face) or encoder.json + vocab.bpe (OpenAI).")
      .def(
          "encode",
          [](const BpeTokenizer& t, const py::object& text) {
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
            return interruptible([&] { return t.encode(bytes); });  // Ctrl-C raises KeyboardInterrupt
          },
          py::arg("text"), "The token ids of text (str, or UTF-8 bytes) as a list of int; '<|endoftext|>' is one id.")
      .def(
          "decode",
          [](const BpeTokenizer& t, const py::object& ids) {
            const std::string bytes = t.decode(ids_list(ids));
            // ids may cut a character apart: those bytes become U+FFFD, as in GPT-2's decoders
            return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "replace"));
          },
          py::arg("ids"), "The text of ids (str); bytes that are no whole character become U+FFFD.")
      .def(
          "decode_bytes", [](const BpeTokenizer& t, const py::object& ids) { return py::bytes(t.decode(ids_list(ids))); },
          py::arg("ids"), "The exact bytes of ids.")
      .def_property_readonly("vocab_size", &BpeTokenizer::vocab_size, "How many tokens it has")
      .def_property_readonly("special_tokens", &BpeTokenizer::special_tokens, "Its special tokens' texts, e.g. <|endoftext|>")
      .def("token_text", &BpeTokenizer::token_text, py::arg("id"),
           "The token's text for display (control characters and partial characters escaped, e.g. '\\\\n', '\\\\xf0').")
      .def("__len__", &BpeTokenizer::vocab_size)
      .def("__repr__", [](const BpeTokenizer& t) {
        return "<headlab.Tokenizer " + t.source() + ": " + std::to_string(t.vocab_size()) + " tokens, " +
               std::to_string(t.merges()) + " merges>";
      });
}

}  // namespace hl::bindings
