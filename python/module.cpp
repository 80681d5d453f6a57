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

using namespace hl;
using namespace hl::bindings;

PYBIND11_MODULE(_core, m) {
  m.doc() = "headlab: a small C++ transformer lab for studying attention heads";

  // C++ errors carry their one-line message; bad input is ValueError.
  py::register_exception<Error>(m, "HeadlabError", PyExc_ValueError).doc() =
      "An error of the C++ library (bad input): its one-line message is the command line's";
  py::register_exception<NonFiniteError>(m, "NonFiniteError", PyExc_FloatingPointError).doc() =
      "A NaN or Inf where a finite value is needed (a loss, a weight)";

  // In this order: a class is bound before the functions whose signatures name it (pybind11
  // writes a signature's types when the function is bound).
  bind_tensors(m);
  bind_models(m);
  bind_tasks(m);
  bind_training(m);
  bind_analyses(m);
  bind_views(m);
  bind_tokenizer(m);
}
