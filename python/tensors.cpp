// Binds headlab.Tensor (a buffer: np.asarray(t) is a view of its memory), headlab.tensor (a
// copy), tensor ops, no-grad and thread settings.
#include "bindings.h"
#include "lib/ops.h"
#include "lib/tensor.h"

namespace hl::bindings {

void bind_tensors(py::module_& m) {
  // ---- tensors ------------------------------------------------------------------------------
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(), "float32 tensor; np.asarray(t) is a view of its memory")
      .def_buffer([](Tensor& t) -> py::buffer_info {
        std::vector<py::ssize_t> shape(t.shape().dims, t.shape().dims + t.ndim()), strides(t.ndim());
        py::ssize_t step = sizeof(float);
        for (int i = t.ndim() - 1; i >= 0; --i) strides[i] = step, step *= shape[i];
        return py::buffer_info(t.data(), sizeof(float), py::format_descriptor<float>::format(), t.ndim(), shape, strides);
      })
      .def_property_readonly("shape", [](const Tensor& t) {
        return py::tuple(py::cast(std::vector<int64_t>(t.shape().dims, t.shape().dims + t.ndim())));
      })
      .def_property_readonly("ndim", &Tensor::ndim)
      .def("numpy", [](const Tensor& t) { return view_of(t); }, "A view of the tensor's memory (no copy)")
      .def("item", &Tensor::item)
      .def_property("requires_grad", &Tensor::requires_grad, [](Tensor& t, bool on) {
        if (!t.is_leaf()) throw py::value_error("requires_grad can only be set on a leaf tensor (one no op made)");
        t.requires_grad_(on);
      })
      .def_property_readonly("grad", [](const Tensor& t) -> py::object {
        Tensor g = t.grad();
        return g.defined() ? py::cast(g) : py::none();
      })
      .def("backward", [](const Tensor& t) {
        if (!t.requires_grad()) throw py::value_error("backward(): the tensor does not require grad (no graph leads to it)");
        if (t.numel() != 1) throw py::value_error("backward(): needs a one-element tensor, got shape " + t.shape().str());
        py::gil_scoped_release release;
        t.backward();
      })
      .def("zero_grad", &Tensor::zero_grad)
      .def("retain_grad", &Tensor::retain_grad)
      .def("detach", &Tensor::detach)
      .def("clone", &Tensor::clone)
      .def("__repr__", [](const Tensor& t) { return "headlab.Tensor" + t.shape().str(); })
      .def("__add__", [](const Tensor& a, const Tensor& b) { return add(a, b); })
      .def("__sub__", [](const Tensor& a, const Tensor& b) { return sub(a, b); })
      .def("__mul__", [](const Tensor& a, const Tensor& b) { return mul(a, b); })
      .def("__mul__", [](const Tensor& a, float s) { return mul_scalar(a, s); })
      .def("__rmul__", [](const Tensor& a, float s) { return mul_scalar(a, s); })
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); })
      .def("sum", [](const Tensor& t) { return sum(t); })
      .def("mean", [](const Tensor& t) { return mean(t); });

  m.def("tensor", [](const py::array& a, bool requires_grad) {
        Tensor t = tensor_from_array(a, "headlab.tensor");
        if (requires_grad) t.requires_grad_();
        return t;
      },
      py::arg("array"), py::arg("requires_grad") = false,
      "A float32 copy of a float array (float64 is rounded to float32); never a view");
  m.def("cross_entropy", [](const Tensor& logits, const py::object& targets) {
    const Ids t = ids_from(targets, "targets");
    if (std::none_of(t.data.begin(), t.data.end(), [](int32_t v) { return v >= 0; }))
      throw py::value_error("cross_entropy: every target is -1 (not counted): the mean over no positions is undefined");
    return cross_entropy(logits, t);
  },
        py::arg("logits"), py::arg("targets"), "Mean cross-entropy of (B, T, V) logits over targets != -1");
  m.def("softmax", [](const Tensor& x, int axis) { return softmax(x, axis); }, py::arg("x"), py::arg("axis") = -1);
  m.def("grad_enabled", &grad_enabled);
  py::class_<NoGradGuard>(m, "_NoGradGuard").def(py::init<>());
  m.def("set_num_threads", &set_num_threads);
  m.def("num_threads", &num_threads);
  m.def("live_tensors", [] { return TensorImpl::live_count.load(); }, "Tensors alive now (for leak checks)");
}

}  // namespace hl::bindings
