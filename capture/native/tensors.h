// What stats.cpp and storage.cpp both ask of a tensor handed over from Python.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

namespace torchscope_native {

// The tensor behind a Python list item, or nullptr for None; throws TypeError for anything else.
inline const at::Tensor* tensor_at(const pybind11::handle& h) {
  if (h.is_none()) return nullptr;
  if (!THPVariable_Check(h.ptr())) throw pybind11::type_error("not a tensor");
  return &THPVariable_Unpack(h.ptr());
}

// A strided tensor holding its own storage: not a wrapper subclass (a DTensor), a functorch or
// functional wrapper, or a nested tensor.
inline bool owns_storage(const at::Tensor& t) {
  if (!t.defined() || t.layout() != c10::kStrided || t.is_nested() || !t.has_storage()) return false;
  const c10::DispatchKeySet ks = t.key_set();
  return !(ks.has(c10::DispatchKey::Python) || ks.has(c10::DispatchKey::FuncTorchBatched) ||
           ks.has(c10::DispatchKey::FuncTorchGradWrapper) || ks.has(c10::DispatchKey::Functionalize));
}

}  // namespace torchscope_native
