// The structure of a backward's autograd graph as one 64-bit key (see _watch._reuse_walk).
//
// Why: light and default mode need each backward's graph signature (a structure change is when
// default mode captures, and what the doctor compares), but walking the graph in Python costs
// 1-1.5 us a node -- most of a steady step on a deep model -- so a step reused the last walk's
// signature when cheap facts (root classes, number of nodes made) matched, and a change keeping
// those (one activation swapped for another) was only seen at the next periodic walk.  This
// walk is the same one in C++ (~30 ns a node warm): the Python walk then runs once per structure.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "tensors.h"

namespace py = pybind11;
using torchscope_native::tensor_at;
using torch::autograd::Node;

namespace {

inline uint64_t mix(uint64_t h, uint64_t v) {  // splitmix64's finalizer over h ^ v
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Node pointer -> discovery index, open addressing: the walk's one lookup per edge
// (std::unordered_map's node allocations were most of its cost).
class Index {
 public:
  explicit Index(size_t hint) {
    size_t size = 512;  // a power of two (slot() masks), at least twice the nodes expected
    while (size < hint * 2) size *= 2;
    grow(size);
  }

  // the index of `n`, inserting `next` when it is new (then `fresh` is set)
  int64_t get(const Node* n, int64_t next, bool& fresh) {
    if ((used_ + 1) * 2 > keys_.size()) grow(keys_.size() * 2);
    size_t at = slot(n);
    fresh = keys_[at] == nullptr;
    if (fresh) {
      keys_[at] = n;
      vals_[at] = next;
      ++used_;
    }
    return vals_[at];
  }

 private:
  size_t slot(const Node* n) const {
    const size_t mask = keys_.size() - 1;
    size_t at = (reinterpret_cast<uintptr_t>(n) >> 4) * 0x9e3779b97f4a7c15ULL & mask;
    while (keys_[at] != nullptr && keys_[at] != n) at = (at + 1) & mask;
    return at;
  }
  void grow(size_t size) {
    std::vector<const Node*> keys(std::move(keys_));
    std::vector<int64_t> vals(std::move(vals_));
    keys_.assign(size, nullptr);
    vals_.assign(size, 0);
    for (size_t k = 0; k < keys.size(); ++k) {
      if (keys[k] != nullptr) {
        const size_t at = slot(keys[k]);
        keys_[at] = keys[k];
        vals_[at] = vals[k];
      }
    }
  }
  std::vector<const Node*> keys_;
  std::vector<int64_t> vals_;
  size_t used_ = 0;
};

// Whether a node's C++ class is torch's PyNode, the node of every Python autograd.Function
// (asked by its mangled name, remembered per class in a small direct-mapped table; graph_key
// runs under the GIL, one call at a time).
bool is_py_node(const std::type_info& type) {
  static std::array<std::pair<const std::type_info*, bool>, 256> seen{};
  auto& slot = seen[(reinterpret_cast<uintptr_t>(&type) >> 4) & 255];
  if (slot.first != &type) {
    slot = {&type, std::strcmp(type.name(), "N5torch8autograd6PyNodeE") == 0};
  }
  return slot.second;
}

// A node's class's part of the key: the address of its C++ class's type_info (one per class in
// a process, as the key is compared only within one process); a Python autograd.Function's
// nodes all share one C++ class and are told apart by their Python class's name.
uint64_t class_hash(Node* n) {
  const std::type_info& type = typeid(*n);
  const uint64_t at = reinterpret_cast<uintptr_t>(&type);
  return is_py_node(type) ? at ^ std::hash<std::string>{}(n->name()) : at;
}

// (key, nodes) of the graph below `roots`' grad_fns: node classes in discovery order
// and every edge (from, to, input_nr), walked in the order AutogradWalk walks.  Equal
// structures give equal keys; a different class or edge, a different key (short of a 64-bit
// collision).
py::tuple graph_key(const py::list& roots, int64_t hint) {
  Index index(static_cast<size_t>(hint > 0 ? hint : 0));
  std::vector<std::pair<int64_t, Node*>> stack;
  std::vector<Node*> nodes;
  nodes.reserve(static_cast<size_t>(hint > 0 ? hint : 64));
  bool fresh = false;
  for (const py::handle& h : roots) {
    const at::Tensor* t = tensor_at(h);
    if (t == nullptr) continue;
    Node* fn = t->grad_fn().get();
    if (fn == nullptr) continue;
    index.get(fn, static_cast<int64_t>(nodes.size()), fresh);
    if (fresh) nodes.push_back(fn);
  }
  for (size_t i = 0; i < nodes.size(); ++i) stack.emplace_back(static_cast<int64_t>(i), nodes[i]);
  uint64_t key = 0x84222325cbf29ce4ULL;
  while (!stack.empty()) {
    auto [i, n] = stack.back();
    stack.pop_back();
    for (const torch::autograd::Edge& e : n->next_edges()) {
      Node* child = e.function.get();
      if (child == nullptr) continue;
      const int64_t j = index.get(child, static_cast<int64_t>(nodes.size()), fresh);
      if (fresh) {
        nodes.push_back(child);
        stack.emplace_back(j, child);
      }
      key = mix(key, (static_cast<uint64_t>(i) << 40) ^ (static_cast<uint64_t>(j) << 8) ^ e.input_nr);
    }
  }
  for (Node* n : nodes) key = mix(key, class_hash(n));
  return py::make_tuple(py::int_(key), py::int_(nodes.size()));
}

}  // namespace

void register_graph(py::module& m) { m.def("graph_key", &graph_key); }
