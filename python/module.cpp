// headlab._core: the C++ library seen from Python (pybind11). The package `headlab`
// (python/headlab/__init__.py) re-exports it and adds what is easier to write in Python
// (progress display, no_grad as a context manager).
//
// Memory: np.asarray(tensor) is a view of the tensor's storage (buffer protocol, float32, C
// order); the array keeps the tensor alive. headlab.tensor(array) always copies. Every long
// C++ call releases the GIL; Python callbacks (hooks, training callbacks) take it back.
//
// This file makes the module; bindings.h lists the files that bind each area.
#include "bindings.h"
#include "lib/messages.h"

using namespace hl;
using namespace hl::bindings;

PYBIND11_MODULE(_core, m) {
  m.doc() = "headlab: a small C++ transformer lab for studying attention heads";

  // C++ errors carry their one-line message; bad input is ValueError.
  auto error_type = py::register_exception<Error>(m, "HeadlabError", PyExc_ValueError);
  error_type.doc() = "An error of the C++ library (bad input): its one-line message is the command line's";
  auto non_finite_type = py::register_exception<NonFiniteError>(m, "NonFiniteError", PyExc_FloatingPointError);
  non_finite_type.doc() = "A NaN or Inf where a finite value is needed (a loss, a weight)";
  static PyObject* const error = error_type.ptr();
  static PyObject* const non_finite = non_finite_type.ptr();
  // The same words as the CLI's error line: a JSON library's tag is dropped, the cause kept; a
  // malformed JSON file that reaches Python unwrapped is bad input too (ValueError).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NonFiniteError& e) {
      PyErr_SetString(non_finite, user_message(e.what()).c_str());
    } catch (const Error& e) {
      PyErr_SetString(error, user_message(e.what()).c_str());
    } catch (const nlohmann::json::exception& e) {
      PyErr_SetString(error, user_message(e.what()).c_str());
    } catch (const std::bad_alloc&) {  // work whose size was not estimated beforehand
      PyErr_SetString(PyExc_MemoryError, "out of memory: the call needed more memory than this process may use "
                                         "(ulimit -v, the cgroup's limit or the machine's); give it fewer rows or a smaller model");
    }
  });

  // In this order: a class is bound before the functions whose signatures name it (pybind11
  // writes a signature's types when the function is bound).
  bind_tensors(m);
  bind_models(m);
  bind_tasks(m);
  bind_training(m);
  bind_analyses(m);
  bind_views(m);
  bind_tokenizer(m);
  bind_features(m);
  bind_precision(m);
  bind_feature_study(m);
}
