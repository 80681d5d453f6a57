// hl.precision("bf16"): the linear layers' products of everything run inside the `with` block
// (analyses, studies, forwards) in bf16, like torch.autocast; training takes Trainer(precision=).
#include <memory>
#include <optional>

#include "lib/bf16.h"
#include "python/bindings.h"

namespace hl::bindings {

namespace {
struct PyPrecision {
  Precision precision;
  std::optional<PrecisionScope> scope;  // while inside the with block
};
}  // namespace

void bind_precision(py::module_& m) {
  py::class_<PyPrecision>(m, "precision",
                          "Context manager: inside `with hl.precision(\"bf16\"):` the linear layers' products take bf16 "
                          "operands with float32 accumulation (norms, softmax, the residual stream stay float32), on "
                          "this thread. For forward-only studies of large models; results are approximate (a warning "
                          "says so). Needs a CPU with AVX512_BF16. precision(\"float32\") restores the default inside "
                          "an outer bf16 block.")
      .def(py::init([](const std::string& name) {
             auto p = std::make_unique<PyPrecision>();  // not movable: it may hold a scope
             p->precision = parse_precision(name, "precision");
             return p;
           }),
           py::arg("precision"), "Makes the block; precision is float32 or bf16")
      .def("__enter__",
           [](PyPrecision& p) -> PyPrecision& {
             if (p.scope) throw Error("precision: this block is already entered");
             p.scope.emplace(p.precision);  // checks the CPU for bf16
             if (p.precision == Precision::Bf16 && PyErr_WarnEx(PyExc_UserWarning, kBf16ResultsNote, 1) != 0)
               throw py::error_already_set();
             return p;
           },
           py::return_value_policy::reference, "Sets this thread's precision (bf16: checks the CPU and warns)")
      .def("__exit__", [](PyPrecision& p, const py::object&, const py::object&, const py::object&) {
        p.scope.reset();
        return false;
      }, py::arg("exc_type"), py::arg("exc_value"), py::arg("traceback"), "Restores the precision of before the block")
      .def_property_readonly("name", [](const PyPrecision& p) { return std::string(precision_name(p.precision)); },
                             "The precision: float32 or bf16");
}

}  // namespace hl::bindings
