// The pages of views/ for Python's inline views (python/headlab/views.py wraps them).
#include "bindings.h"
#include "lib/fileutil.h"
#include "views/pages.h"

namespace hl::bindings {

namespace {

// Rows of held-out batches as sequences, trailing padding removed (at most n of them).
std::vector<std::vector<int32_t>> rows_of(const PyData& d, int n) {
  if (n < 1) throw py::value_error("examples: must be at least 1, got " + std::to_string(n));
  std::vector<std::vector<int32_t>> rows = unpadded_rows(d.batches, n);
  if (rows.empty()) throw py::value_error("view: the batches hold no rows");
  return rows;
}

}  // namespace

void bind_views(py::module_& m) {
  // View.save writes through the library's one writer: atomic, and never over a device, a FIFO or a link
  m.def("_write_file_atomic", [](const std::string& path, const std::string& bytes) { write_file_atomic(path, bytes); },
        py::arg("path"), py::arg("bytes"));
  m.def("_rows_of", &rows_of, py::arg("data"), py::arg("n"));
  m.def("_head_view_page",
        [](TransformerLM& model, const std::vector<std::tuple<std::string, std::vector<int32_t>, std::vector<std::string>>>& rows,
           const std::string& title, const std::string& subtitle, bool compact) {
          std::vector<views::ViewExample> examples;
          for (const auto& [name, ids, tokens] : rows) examples.push_back({name, ids, tokens});
          std::vector<std::string> cuts;
          nlohmann::json data;
          {
            py::gil_scoped_release release;
            cuts = views::fit_examples_to_page(examples, model.cfg.n_layers, model.cfg.n_heads);
            data = {{"title", title},
                    {"subtitle", subtitle},
                    {"layers", model.cfg.n_layers},
                    {"heads", model.cfg.n_heads},
                    {"examples", views::head_view_examples(model, examples)}};
          }
          return py::make_tuple(views::head_view_page(std::move(data), compact), cuts);
        });
  m.def("_byte_token_text", &byte_token_text);
  // vmin, vmax: None = the data's own colour scale (views::ColourScale)
  const auto scale = [](const std::optional<double>& lo, const std::optional<double>& hi) {
    views::ColourScale s;
    if (lo) s.vmin = *lo;
    if (hi) s.vmax = *hi;
    return s;
  };
  m.def("_token_values_page", [scale](const std::string& title, const std::vector<std::string>& tokens, const std::vector<double>& values,
                                      const std::string& value_name, std::optional<double> vmin, std::optional<double> vmax) {
    return views::token_values_page(title, tokens, values, value_name, scale(vmin, vmax));
  });
  m.def("_grid_page", [scale](const std::string& title, int rows, int cols, const std::vector<double>& values,
                              const std::vector<std::string>& row_labels, const std::vector<std::string>& col_labels,
                              const std::string& value_name, std::optional<double> vmin, std::optional<double> vmax) {
    return views::grid_page(title, rows, cols, values, row_labels, col_labels, value_name, scale(vmin, vmax));
  });
}

}  // namespace hl::bindings
