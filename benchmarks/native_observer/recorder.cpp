// Benchmark experiment, not part of torchscope (see README.md in this folder).
//
// Records every aten op (forward + backward) via a global RecordFunction
// observer into flat int64 thread-local buffers; drain() hands them to Python
// as a single int64 tensor.  Also: an optional c10 MemoryReportingInfoBase
// pushed under DebugInfoKind::PROFILER_STATE to get an alloc/free ledger.
//
// Must be compiled with -DNDEBUG (ext.py does it): record_function.h has an
// #ifndef NDEBUG member, so a debug build of this file disagrees with the
// release libtorch about the layout of at::RecordFunction.
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

// ---------------------------------------------------------------- buffers
struct ThreadBuf {
  std::mutex mu;               // uncontended except during drain()
  std::vector<int64_t> data;
};

std::mutex g_registry_mu;
std::vector<std::shared_ptr<ThreadBuf>> g_registry;  // never shrinks

ThreadBuf& tbuf() {
  thread_local std::shared_ptr<ThreadBuf> b = [] {
    auto p = std::make_shared<ThreadBuf>();
    p->data.reserve(1 << 20);
    std::lock_guard<std::mutex> g(g_registry_mu);
    g_registry.push_back(p);
    return p;
  }();
  return *b;
}

// ---------------------------------------------------------------- interning
// Interned by *content*: autograd Node names arrive as owned std::string
// copies (StringView), so the const char* is NOT stable for backward scopes.
std::mutex g_names_mu;
std::deque<std::string> g_name_store;
std::unordered_map<std::string_view, int64_t> g_name_ids;
std::vector<std::string> g_names;  // id -> name (for python)

int64_t intern(const char* s) {
  if (!s) s = "";
  std::string_view sv(s);
  std::lock_guard<std::mutex> g(g_names_mu);
  auto it = g_name_ids.find(sv);
  if (it != g_name_ids.end()) return it->second;
  g_name_store.emplace_back(sv);
  int64_t id = (int64_t)g_names.size();
  g_names.emplace_back(sv);
  g_name_ids.emplace(std::string_view(g_name_store.back()), id);
  return id;
}

thread_local int64_t t_module = -1;
at::CallbackHandle g_handle = 0;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Tensor encodings (int64 words):
//  strided, has storage, non-symbolic:
//   [1, ndim, sizes..., strides..., dtype, dev_type, dev_idx, storage_impl,
//    data_ptr, nbytes, storage_offset, version, requires_grad]
//  undefined: [3]
//  opaque (sparse/nested/symbolic/no storage): [4, dtype, dev_type, dev_idx]
// IValue encodings: tensor as above, [2, n, elems...] for lists,
//   [5, value] int, [0, tag] other (0 None, 2 double, 3 bool, 9 misc).
inline void put_tensor(std::vector<int64_t>& o, const at::Tensor& t) {
  if (!t.defined()) { o.push_back(3); return; }
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  // nested: sizes() throws; python-dispatch subclasses (incl. FakeTensor) may
  // route sizes()/strides() into Python -> treat as opaque.
  if (impl->layout() != c10::kStrided || impl->is_nested() ||
      impl->is_python_dispatch() || !impl->has_storage() ||
      impl->has_symbolic_sizes_strides()) {
    o.push_back(4);
    o.push_back((int64_t)impl->dtype().toScalarType());
    o.push_back((int64_t)impl->device_type());
    o.push_back((int64_t)impl->device().index());
    return;
  }
  auto sizes = impl->sizes();
  auto strides = impl->strides();
  size_t nd = sizes.size();
  o.push_back(1);
  o.push_back((int64_t)nd);
  o.insert(o.end(), sizes.begin(), sizes.end());
  o.insert(o.end(), strides.begin(), strides.end());
  o.push_back((int64_t)impl->dtype().toScalarType());
  o.push_back((int64_t)impl->device_type());
  o.push_back((int64_t)impl->device().index());
  const c10::Storage& st = impl->storage();
  c10::StorageImpl* si = st.unsafeGetStorageImpl();
  o.push_back((int64_t)(intptr_t)si);
  o.push_back((int64_t)(intptr_t)(si ? si->data_ptr().get() : nullptr));
  o.push_back(si ? (int64_t)si->nbytes() : 0);
  o.push_back(impl->storage_offset());
  const auto& vc = impl->version_counter();
  o.push_back(vc.enabled() ? (int64_t)vc.current_version() : -1);
  o.push_back(impl->requires_grad() ? 1 : 0);
}

inline void put_ivalue(std::vector<int64_t>& o, const c10::IValue& v) {
  if (v.isTensor()) {
    put_tensor(o, v.toTensor());
  } else if (v.isTensorList()) {
    auto l = v.toTensorList();
    o.push_back(2);
    o.push_back((int64_t)l.size());
    for (size_t i = 0; i < l.size(); ++i) put_tensor(o, l.get(i));
  } else if (v.isList()) {
    auto l = v.toListRef();
    o.push_back(2);
    o.push_back((int64_t)l.size());
    for (const auto& e : l) {
      if (e.isTensor()) put_tensor(o, e.toTensor());
      else if (e.isNone()) o.push_back(3);
      else if (e.isInt()) { o.push_back(5); o.push_back(e.toInt()); }
      else { o.push_back(0); o.push_back(9); }
    }
  } else if (v.isInt()) {
    o.push_back(5);
    o.push_back(v.toInt());
  } else {
    o.push_back(0);
    o.push_back(v.isNone() ? 0 : (v.isDouble() ? 2 : (v.isBool() ? 3 : 9)));
  }
}

// [n, values...] from get() (fn.inputs() / fn.outputs()).  RecordFunction swallows callback
// exceptions (it only logs a warning), so a throw here would leave a torn record that breaks
// decoding of the whole buffer: truncate to the record's fixed words and mark n = -1 instead.
template <class Get>
void put_values(std::vector<int64_t>& o, size_t fixed_end, Get get) {
  try {
    const auto& vs = get();
    o.push_back((int64_t)vs.size());
    for (const auto& v : vs) put_ivalue(o, v);
  } catch (...) {
    o.resize(fixed_end);
    o.push_back(-1);
  }
}

// ENTER: [1, len, handle, name_id, overload_id, seq, tid, t_ns, module,
//         scope, n_in, inputs...]
std::unique_ptr<at::ObserverContext> onEnter(const at::RecordFunction& fn) {
  ThreadBuf& b = tbuf();
  std::lock_guard<std::mutex> g(b.mu);
  auto& o = b.data;
  size_t start = o.size();
  o.push_back(1);
  o.push_back(0);
  o.push_back((int64_t)fn.handle());
  o.push_back(intern(fn.name()));
  o.push_back(intern(fn.overload_name()));
  o.push_back(fn.seqNr());
  o.push_back((int64_t)fn.threadId());
  o.push_back(now_ns());
  o.push_back(t_module);
  o.push_back((int64_t)fn.scope());
  put_values(o, start + 10, [&]() -> decltype(auto) { return fn.inputs(); });
  o[start + 1] = (int64_t)(o.size() - start);
  return nullptr;
}

// EXIT: [2, len, handle, tid, t_ns, n_out, outputs...]
void onExit(const at::RecordFunction& fn, at::ObserverContext*) {
  int64_t t = now_ns();
  ThreadBuf& b = tbuf();
  std::lock_guard<std::mutex> g(b.mu);
  auto& o = b.data;
  size_t start = o.size();
  o.push_back(2);
  o.push_back(0);
  o.push_back((int64_t)fn.handle());
  o.push_back((int64_t)fn.threadId());
  o.push_back(t);
  put_values(o, start + 5, [&]() -> decltype(auto) { return fn.outputs(); });
  o[start + 1] = (int64_t)(o.size() - start);
}

// ---------------------------------------------------------------- memory
struct Ledger : public c10::MemoryReportingInfoBase {
  std::vector<int64_t> ev;  // [ptr, bytes(+/-), total_alloc, dev_type, t_ns]
  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated,
                         size_t /*total_reserved*/, c10::Device device) override {
    ev.push_back((int64_t)(intptr_t)ptr);
    ev.push_back(alloc_size);
    ev.push_back((int64_t)total_allocated);
    ev.push_back((int64_t)device.type());
    ev.push_back(now_ns());
  }
  bool memoryProfilingEnabled() const override { return true; }
};
std::shared_ptr<Ledger> g_ledger;

}  // namespace

void start(bool inputs, bool outputs) {
  TORCH_CHECK(g_handle == 0, "already started");
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&onEnter, &onExit)
          .needsInputs(inputs)
          .needsOutputs(outputs)
          .needsIds(true)
          .scopes({at::RecordScope::FUNCTION,
                   at::RecordScope::BACKWARD_FUNCTION}));
}

void stop() {
  if (g_handle) at::removeCallback(g_handle);
  g_handle = 0;
}

void set_module(int64_t m) { t_module = m; }

at::Tensor drain() {
  std::vector<std::shared_ptr<ThreadBuf>> regs;
  {
    std::lock_guard<std::mutex> g(g_registry_mu);
    regs = g_registry;
  }
  auto* merged = new std::vector<int64_t>();
  for (auto& r : regs) {
    std::lock_guard<std::mutex> g(r->mu);
    if (merged->empty()) {
      merged->swap(r->data);
      r->data.reserve(merged->capacity());
    } else {
      merged->insert(merged->end(), r->data.begin(), r->data.end());
      r->data.clear();
    }
  }
  int64_t n = (int64_t)merged->size();
  return torch::from_blob(
      merged->data(), {n}, [merged](void*) { delete merged; },
      torch::TensorOptions().dtype(torch::kInt64));
}

std::vector<std::string> names() {
  std::lock_guard<std::mutex> g(g_names_mu);
  return g_names;
}

bool mem_start() {
  TORCH_CHECK(!g_ledger, "ledger already active");
  g_ledger = std::make_shared<Ledger>();
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, g_ledger);
  return c10::memoryProfilingEnabled();
}

at::Tensor mem_stop() {
  TORCH_CHECK(g_ledger, "ledger not active");
  c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
  auto l = std::move(g_ledger);
  g_ledger.reset();
  auto t = torch::tensor(l->ev, torch::kInt64);
  return t.reshape({-1, 5});
}

bool mem_enabled() { return c10::memoryProfilingEnabled(); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start, py::arg("inputs") = true, py::arg("outputs") = true);
  m.def("stop", &stop);
  m.def("set_module", &set_module);
  m.def("drain", &drain);
  m.def("names", &names);
  m.def("mem_start", &mem_start);
  m.def("mem_stop", &mem_stop);
  m.def("mem_enabled", &mem_enabled);
}
