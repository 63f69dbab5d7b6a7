// Storages of the parameters and their gradients at a step boundary (see _watch._memory): one
// call over the watch's parameter list instead of a Python storage object per tensor (~3 us
// each, every step).  Tensor subclasses and tensors without their own storage return None:
// the Python path (_memory.storage_parts) names their inner tensors' storages.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>

#include "tensors.h"

namespace py = pybind11;
using torchscope_native::owns_storage;
using torchscope_native::tensor_at;

namespace {

// _memory.grad_storages: {storage data pointer: bytes} of the strided gradients of `params`
// (None items skipped), or None: the Python path's for a sparse gradient (its indices' and
// values' storages) too.
py::object grad_storages(const py::list& params) {
  py::dict out;
  for (const py::handle& h : params) {
    const at::Tensor* p = tensor_at(h);
    if (p == nullptr) continue;
    if (!p->is_leaf()) return py::none();  // a non-leaf's .grad warns when read: the Python path's
    const at::Tensor& g = p->grad();
    if (!g.defined()) continue;
    if (g.layout() != c10::kStrided) return py::none();
    if (!owns_storage(g)) return py::none();
    const c10::Storage& st = g.storage();
    out[py::int_(reinterpret_cast<intptr_t>(st.data()))] = py::int_(st.nbytes());
  }
  return std::move(out);
}

// _memory.storages of plain tensors: {storage data pointer: bytes} of each, or None (also
// for an empty tensor: a lazy module's parameter before its first forward, which Python tells).
py::object storages(const py::list& tensors) {
  py::dict out;
  for (const py::handle& h : tensors) {
    const at::Tensor* t = tensor_at(h);
    if (t == nullptr) continue;
    if (!owns_storage(*t) || t->numel() == 0) return py::none();
    const c10::Storage& st = t->storage();
    out[py::int_(reinterpret_cast<intptr_t>(st.data()))] = py::int_(st.nbytes());
  }
  return std::move(out);
}

// _watch._ptr_sum: the sum of the tensors' data pointers, or None.
py::object ptr_sum(const py::list& tensors) {
  uint64_t sum = 0;  // wraps as Python's int would not: only compared with itself
  for (const py::handle& h : tensors) {
    const at::Tensor* t = tensor_at(h);
    if (t == nullptr) continue;
    if (!owns_storage(*t)) return py::none();
    if (!t->storage().data() && t->numel() != 0) return py::none();  // no data yet (a meta tensor)
    sum += static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t->const_data_ptr()));
  }
  return py::int_(sum);
}

}  // namespace

void register_storage(py::module& m) {
  m.def("grad_storages", &grad_storages);
  m.def("ptr_sum", &ptr_sum);
  m.def("storages", &storages);
}
