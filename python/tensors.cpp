// Binds headlab.Tensor (a buffer: np.asarray(t) is a view of its memory), headlab.tensor (a
// copy), tensor ops, no-grad and thread settings.
#include "bindings.h"
#include "lib/ops.h"
#include "lib/safetensors.h"
#include "lib/tensor.h"

namespace hl::bindings {

void bind_tensors(py::module_& m) {
  m.def(
      "load_safetensors",
      [](const PathArg& path) {
        const SafetensorsFile f = read_safetensors(path.path);
        py::dict out;
        for (const auto& [name, t] : f.tensors)
          out[py::str(name)] = t.dtype == DType::I32 || t.dtype == DType::I64 ? ids_to_array(f.ids(name)) : view_of(f.f32(name));
        return out;
      },
      py::arg("path"),
      "The tensors of a safetensors file as NumPy arrays, {name: array}: float32 (F32, BF16 and F16 read exactly), "
      "int32 (I32, I64); e.g. the inputs.safetensors patch and edges write");
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
      }, "The sizes of its axes (a tuple)")
      .def_property_readonly("ndim", &Tensor::ndim, "How many axes it has")
      .def("numpy", [](const Tensor& t) { return view_of(t); }, "A view of the tensor's memory (no copy)")
      .def("item", &Tensor::item, "The value of a one-element tensor (float)")
      .def_property("requires_grad", &Tensor::requires_grad, [](Tensor& t, bool on) {
        if (!t.is_leaf()) throw py::value_error("requires_grad can only be set on a leaf tensor (one no op made)");
        t.requires_grad_(on);
      }, "Whether backward() fills in its gradient (settable on a leaf)")
      .def_property_readonly("grad", [](const Tensor& t) -> py::object {
        Tensor g = t.grad();
        return g.defined() ? py::cast(g) : py::none();
      }, "Its gradient after backward() (a Tensor), or None")
      .def("backward", [](const Tensor& t) {
        if (!t.requires_grad()) throw py::value_error("backward(): the tensor does not require grad (no graph leads to it)");
        if (t.numel() != 1) throw py::value_error("backward(): needs a one-element tensor, got shape " + t.shape().str());
        py::gil_scoped_release release;
        t.backward();
      }, "Fills in the gradients of every tensor it was computed from (a one-element tensor)")
      .def("zero_grad", &Tensor::zero_grad, "Clears its gradient")
      .def("retain_grad", &Tensor::retain_grad, "Keeps the gradient of this non-leaf tensor after backward()")
      .def("detach", &Tensor::detach, "The same values, out of the graph (shares memory)")
      .def("clone", &Tensor::clone, "A copy (in the graph)")
      .def("__repr__", [](const Tensor& t) { return "headlab.Tensor" + t.shape().str(); })
      .def("__add__", [](const Tensor& a, const Tensor& b) { return add(a, b); })
      .def("__sub__", [](const Tensor& a, const Tensor& b) { return sub(a, b); })
      .def("__mul__", [](const Tensor& a, const Tensor& b) { return mul(a, b); })
      .def("__mul__", [](const Tensor& a, float s) { return mul_scalar(a, s); })
      .def("__rmul__", [](const Tensor& a, float s) { return mul_scalar(a, s); })
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); })
      .def("sum", [](const Tensor& t) { return sum(t); }, "The sum of every element (a one-element tensor)")
      .def("mean", [](const Tensor& t) { return mean(t); }, "The mean of every element (a one-element tensor)");

  m.def("tensor", [](const py::array& a, bool requires_grad) {
        Tensor t = tensor_from_array(a, "headlab.tensor");
        if (requires_grad) t.requires_grad_();
        return t;
      },
      py::arg("array"), py::arg("requires_grad") = false,
      "A float32 copy of a float array (float64 is rounded to float32); never a view");
  m.def("cross_entropy", [](const Tensor& logits, const py::object& targets) {
    return cross_entropy(logits, counted_targets_from(targets, "cross_entropy"));
  },
        py::arg("logits"), py::arg("targets"), "Mean cross-entropy of (B, T, V) logits over targets != -1");
  m.def("softmax", [](const Tensor& x, int axis) { return softmax(x, axis); }, py::arg("x"), py::arg("axis") = -1,
        "Softmax along axis (differentiable)");
  m.def("grad_enabled", &grad_enabled, "Whether ops record a graph now (False inside headlab.no_grad())");
  py::class_<NoGradGuard>(m, "_NoGradGuard").def(py::init<>());
  m.def("set_num_threads", &set_num_threads, py::arg("n"), "Threads of the C++ kernels from now on");
  m.def("num_threads", &num_threads, "Threads of the C++ kernels");
  m.def("live_tensors", [] { return TensorImpl::live_count.load(); }, "Tensors alive now (for leak checks)");
}

}  // namespace hl::bindings
