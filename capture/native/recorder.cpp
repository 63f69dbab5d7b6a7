// The op stream of `full` mode from C++: a RecordFunction observer (see capture/_native.py).
//
// Why C++: a Python TorchDispatchMode costs ~18 us of C++ <-> Python transition per aten op
// before it records anything (1.6-1.9x a transformer step), and recording an op in Python
// another ~40 us.  This observer records the same facts -- the op, its module, its tensors,
// their storages, the step's allocations and frees -- at ~1-2 us an op, and writes the very
// records (`schema.OpRecord`, `schema.TensorMeta`) the Python recorder builds, as JSON, once
// per step (`encode`); Python gets only what it uses during the step (`drain`).
//
// Which records: RecordFunction fires at every Dispatcher::call, so it sees composite ops and
// their decompositions and kernels' internal calls.  Kept are the ops a dispatch mode sees:
// the outermost op of a nesting that is not CompositeImplicitAutograd; its children are
// kernel internals.  The module, phase and source-line context is set from Python (module
// hooks) as a small integer; the source line of an op outside a torch module is read from the
// Python frames of the calling thread, with the GIL taken for that moment only.
//
// Nothing here keeps a tensor alive: tensors and storages are held by weak references, which
// keep the C++ object's memory (so its address is not reused while we compare it) and never
// its data.  Must be compiled with -DNDEBUG: record_function.h has an #ifndef NDEBUG member.
#include <Python.h>
#include <frameobject.h>

#include <ATen/ATen.h>
#include <ATen/SequenceNumber.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/function.h>  // Node: torch 2.11 has no node.h
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/profiler/orchestration/observer.h>  // profilerEnabled
#include <torch/csrc/utils/pybind.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <algorithm>
#include <array>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------ op facts, cached
struct OpInfo {
  PyObject* name = nullptr;  // interned "aten::addmm" (owned, never freed: few hundred)
  bool composite = false;    // CompositeImplicitAutograd: its decomposition is recorded instead
  bool inplace = false;      // writes one of its arguments
  bool skip = false;         // not the user's computation (profiler:: markers) or not an op
  bool to_copy = false;      // aten::_to_copy: a cast autocast may have made
  bool source = false;       // a NaN source (nan_source): its outputs are checked on every forward
};

struct PairHash {
  size_t operator()(const std::pair<const void*, const void*>& p) const noexcept {
    return std::hash<const void*>()(p.first) * 31u ^ std::hash<const void*>()(p.second);
  }
};

std::mutex g_info_mu;
std::unordered_map<std::pair<const void*, const void*>, OpInfo, PairHash> g_info;

// capture/schema.py NAN_SOURCE_OPS: outputs checked on every recorded step's forward (in-place forms too)
bool nan_source(const char* name) {
  static const std::array<std::string_view, 25> kOps{
      "aten::log",  "aten::log2", "aten::log10", "aten::log1p",      "aten::div",  "aten::sqrt",
      "aten::rsqrt", "aten::pow", "aten::exp",   "aten::reciprocal", "aten::acos", "aten::asin",
      "aten::atanh", "aten::acosh", "aten::xlogy", "aten::logit",    "aten::erfinv",
      // a row masked wholly with -inf (an empty sequence's attention) comes out NaN
      "aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax",
      // the unbiased spread of one element (a one-step episode's returns normalised) is NaN
      "aten::std", "aten::var", "aten::std_mean", "aten::var_mean"};
  std::string_view n(name);
  if (!n.empty() && n.back() == '_') n.remove_suffix(1);
  return std::find(kOps.begin(), kOps.end(), n) != kOps.end();
}

OpInfo make_info(const at::RecordFunction& fn) {
  OpInfo info;
  auto opname = fn.operator_name();
  if (!opname) {
    info.skip = true;  // a record by name only, not a dispatcher op
    return info;
  }
  const std::string& name = opname->name;
  info.skip = name.rfind("profiler::", 0) == 0;
  info.to_copy = name == "aten::_to_copy";
  info.source = nan_source(name.c_str());
  auto handle = c10::Dispatcher::singleton().findOp(*opname);
  if (handle) {
    // decomposed into the ops it calls -- unless a backend kernel of its own runs instead
    // (silu_backward, mish_backward: a CPU kernel beside their math one; taken for composite,
    // their outputs were missing from full mode's ledger: QA 45b)
    info.composite = handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
                     !handle->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
                     !handle->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
    for (const auto& arg : handle->schema().arguments()) {
      if (arg.alias_info() && arg.alias_info()->isWrite()) {
        info.inplace = true;
        break;
      }
    }
  }
  PyGILState_STATE g = PyGILState_Ensure();
  info.name = PyUnicode_InternFromString(name.c_str());
  PyGILState_Release(g);
  return info;
}

// the name and overload strings of a schema-based record live as long as the operator
const OpInfo& op_info(const at::RecordFunction& fn) {
  std::pair<const void*, const void*> key{fn.name(), fn.overload_name()};
  {
    std::lock_guard<std::mutex> g(g_info_mu);
    auto it = g_info.find(key);
    if (it != g_info.end()) return it->second;
  }
  OpInfo info = make_info(fn);  // takes the GIL: never while holding g_info_mu
  // never cleared: callbacks on other threads hold references into it (a node-based map keeps
  // them valid as it grows); it grows by one entry per operator overload
  std::lock_guard<std::mutex> g(g_info_mu);
  return g_info.emplace(key, info).first->second;
}

// ------------------------------------------------------------------ the step's records
struct TensorRec {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::kFloat;
  c10::Device device{c10::kCPU};
  bool requires_grad = false, is_leaf = true, strided = false, has_version = false;
  int64_t ptr = 0, offset = 0, nbytes = 0, version = 0;
  PyObject* param = nullptr;  // borrowed from g_params
  int64_t sid = -1;      // the step's storage id, given at the drain after it was recorded
  int64_t grad_fn = -1;  // the graph node it is an output of (set_grad_fn)
};

enum Flag : uint32_t {
  F_OUTSIDE = 1,
  F_INPLACE = 2,
  F_NONDIFF = 4,
  F_AUTOCAST = 8,
  F_AUTOCAST_CAST = 16,
  F_NAN = 32,
  F_INPLACE_SAVED = 64,
};

struct OpRec {
  PyObject* name = nullptr;  // borrowed from OpInfo (or owned by g_marker_objs)
  int64_t ctx = -1;
  int phase = 0;
  int64_t micro = 0;
  size_t in_begin = 0, in_end = 0, out_begin = 0, out_end = 0;  // into g_io
  bool grad_mode = false, inference_mode = false, inplace = false, marker = false, to_copy = false;
  PyObject* src = nullptr;  // borrowed from g_srcs; null: the context's
  int64_t t0 = 0, dur_ns = 0;
  int64_t alloc = 0, free = 0, live = 0;
  size_t freed_begin = 0, freed_end = 0;  // into g_freed_io: the storages freed during it
  uint32_t flags = 0;
  PyObject* marker_flags = nullptr;  // owned tuple of str, markers only
  // a forward op's thread's autograd sequence counter as it began and as it ended: the graph
  // nodes made during it, or right after (made_by), for nodes no output of it links
  int64_t seq0 = -1, seq1 = -1;
  bool done = false;
};

struct Context {
  py::object module, src;
  int64_t call = 0;
  bool inside = false, walk = false;
};

struct TensorKey {
  c10::weak_intrusive_ptr<c10::TensorImpl> ref;
  int64_t tid;
};

struct StorageRec {
  c10::weak_intrusive_ptr<c10::StorageImpl> ref;
  int64_t bytes;
  int64_t ptr;  // its data pointer: its storage id once drained (OpRecord.freed)
};

struct NodeTime {  // one autograd node's run in a recorded backward
  int64_t seq, t0, t1;
};

struct SeqLink {
  int64_t op;
  std::vector<int64_t> tids;
};

std::mutex g_mu;  // the records below; never held while taking the GIL
std::vector<OpRec> g_ops;
std::vector<int64_t> g_io;
// the data pointers of the storages freed since the last op (g_freed_ptrs), and per op (its
// freed_begin..freed_end; storage ids once drained)
std::vector<int64_t> g_freed_ptrs, g_freed_io;
size_t g_freed_sent = 0;
std::vector<TensorRec> g_tensors;
std::unordered_map<c10::TensorImpl*, TensorKey> g_tids;
std::vector<StorageRec> g_storages;
std::unordered_map<c10::StorageImpl*, size_t> g_storage_index;  // -> g_storages
std::unordered_map<uint64_t, SeqLink> g_seq;
// objects holding Python references are never destroyed: at exit the interpreter is gone first
std::vector<Context>& g_ctx = *new std::vector<Context>();  // written under the GIL and g_mu
size_t g_ops_sent = 0, g_tensors_sent = 0, g_seq_sent = 0;
std::vector<uint64_t> g_seq_order;
std::vector<NodeTime> g_nodes;
size_t g_nodes_sent = 0;
int64_t g_live = 0, g_freed = 0, g_shed = 0, g_max_ops = 0;
std::string g_failed;
bool g_check_nan = false, g_nan_seen = false, g_autocast_seen = false;

// capture/schema.py UNINITIALISED_OPS: outputs that hold whatever bits the allocator left
bool uninitialised(const char* name) {
  static const std::array<std::string_view, 5> kOps{"aten::empty", "aten::empty_like", "aten::empty_strided",
                                                    "aten::new_empty", "aten::new_empty_strided"};
  const std::string_view n(name);
  return std::find(kOps.begin(), kOps.end(), n) != kOps.end();
}

// Whether every value of a floating `t` is finite: its minimum and maximum, one pass and two
// scalars (NaN propagates through aminmax) -- not isfinite(t), a bool copy of a whole
// activation on the device, which a model near its memory limit may not have room for.
// Read with Python dispatch off (as torch._C._DisableTorchDispatch): the loop's own
// TorchDispatchMode (a FLOP counter) must not see these ops; `t` is a plain tensor here.
bool has_nan(const at::Tensor& t) {
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  if (t.is_complex()) return at::isnan(t).any().item<bool>();
  auto [lo, hi] = at::aminmax(t);  // NaN propagates through aminmax
  return at::stack({lo, hi}).isnan().any().item<bool>();
}

bool finite(const at::Tensor& t) {
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  if (t.is_complex()) return at::isfinite(t).all().item<bool>();
  auto [lo, hi] = at::aminmax(t);
  return at::stack({lo, hi}).isfinite().all().item<bool>();
}

// set from Python between ops, read by callbacks (the owner thread's, or the engine's during backward)
std::atomic<int64_t> g_cur_ctx{-1};
std::atomic<int> g_phase{0};  // 0: the forward, 1: the backward, 2: optimizer.step() (full mode)
std::atomic<int64_t> g_micro{0};
std::atomic<int64_t> g_explicit{0};
std::atomic<bool> g_on{false};
std::atomic<bool> g_paused{false};
std::thread::id g_owner;
// The live registration of the observer, and each thread's own: a thread-local callback can only
// be removed by the thread that added it, so one left behind when recording moved to another
// thread (a forward in one thread, its backward in another) is removed by its thread, at its
// next op or start() -- never kept, never removed from the wrong thread.
std::atomic<at::CallbackHandle> g_handle{0};
thread_local at::CallbackHandle t_handle = 0;
uint64_t g_gen = 0;  // bumped by reset() (g_mu held): a record begun before it is not finished after

std::unordered_map<c10::TensorImpl*, py::object>& g_params = *new std::unordered_map<c10::TensorImpl*, py::object>();  // parameter TensorImpl -> name

// per thread: kept ancestors (kernel internals are not recorded), nesting depth, whether the
// outermost record ran under autocast (an autocast kernel's own casts run with it excluded)
thread_local int t_inside = 0;
thread_local int t_depth = 0;
thread_local bool t_autocast = false;
thread_local bool t_paused = false;
// the sequence number of the autograd node this thread ran last in a recorded backward (-1:
// none yet): its ops, and the engine's reduction of its outputs to their inputs' shapes (a
// broadcast bias's sum) just after it, are the backward of the module whose op made the node
thread_local int64_t t_node = -1;

// source lines: code object -> the user's basename (or None for torch's and ours)
py::object& g_user_base = *new py::object();  // Python callable filename -> basename | None
std::unordered_map<PyObject*, py::object>& g_code_base = *new std::unordered_map<PyObject*, py::object>();  // holds the code objects
std::unordered_map<std::string, PyObject*> g_srcs;      // "file.py:12" -> owned str

struct Ctx : public at::ObserverContext {
  int kind = 0;  // 1 composite (depth only), 2 kept, 3 an autograd node
  int64_t op = -1;
  uint64_t gen = 0;  // g_gen when `op` was taken
  // a NaN source's floating inputs, kept from its start when check_nan is off (fn.inputs() is
  // gone by its end: the dispatcher destroys the boxed arguments once the start callbacks ran)
  bool kept = false;
  std::vector<at::Tensor> ins;
};

// This thread's registration when it is no longer the live one: removed, here, where it was added.
bool drop_orphan() {
  if (t_handle == 0 || t_handle == g_handle.load(std::memory_order_relaxed)) return false;
  at::removeCallback(t_handle);
  t_handle = 0;
  return true;
}

bool autocast_now() {
  return at::autocast::is_autocast_enabled(at::kCPU) || at::autocast::is_autocast_enabled(at::kCUDA);
}

// "file.py:12" of the innermost user frame; called with nothing locked
PyObject* walk_src() {
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject* out = nullptr;
  try {
    PyFrameObject* f = PyEval_GetFrame();  // borrowed
    Py_XINCREF(f);
    while (f != nullptr) {
      PyCodeObject* code = PyFrame_GetCode(f);  // new reference
      auto it = g_code_base.find(reinterpret_cast<PyObject*>(code));
      if (it == g_code_base.end()) {
        py::object fname = py::reinterpret_borrow<py::object>(code->co_filename);
        py::object base = g_user_base(fname);
        it = g_code_base.emplace(reinterpret_cast<PyObject*>(code), base).first;
        Py_INCREF(code);  // the key stays valid: the map holds the code object
      }
      Py_DECREF(code);
      if (!it->second.is_none()) {
        std::string key = py::cast<std::string>(it->second) + ":" + std::to_string(PyFrame_GetLineNumber(f));
        auto s = g_srcs.find(key);
        if (s == g_srcs.end()) s = g_srcs.emplace(key, PyUnicode_FromString(key.c_str())).first;
        out = s->second;
        Py_DECREF(f);
        break;
      }
      PyFrameObject* back = PyFrame_GetBack(f);  // new reference
      Py_DECREF(f);
      f = back;
    }
  } catch (...) {
    PyErr_Clear();
    out = nullptr;
  }
  PyGILState_Release(g);
  return out;
}

// strided with sizes and strides of its own: not sparse, nested, symbolic or a Python subclass
// (whose sizes() may call into Python)
bool is_plain(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return impl->layout() == c10::kStrided && !impl->is_nested() && !impl->is_python_dispatch() &&
         !impl->has_symbolic_sizes_strides() && !t._is_zerotensor();
}

// The shapes of an op's other tensors, ragged dimensions (a jagged nested tensor's symbolic
// sequence lengths) as -1.  Read before g_mu is taken: a subclass's sizes may run Python, and
// ops, which this thread then does not record.
using Shapes = std::vector<std::pair<c10::TensorImpl*, std::vector<int64_t>>>;

std::vector<int64_t> loose_shape(const at::Tensor& t) {
  std::vector<int64_t> out;
  bool was = t_paused;
  t_paused = true;
  try {
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    for (const c10::SymInt& d : impl->sym_sizes()) {
      auto v = d.maybe_as_int();
      out.push_back(v ? *v : -1);
    }
  } catch (...) {
    out.clear();  // a C++ nested tensor has no sizes
  }
  t_paused = was;
  return out;
}

// the tensor table index of `t`, recording its metadata at first sight (g_mu held)
int64_t tensor_id(const at::Tensor& t, const Shapes* shapes = nullptr) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  auto it = g_tids.find(impl);
  if (it != g_tids.end()) {
    if (!it->second.ref.expired()) return it->second.tid;
    g_tids.erase(it);
  }
  TensorRec r;
  r.dtype = impl->dtype().toScalarType();
  r.device = impl->device();
  r.requires_grad = t.requires_grad();
  r.is_leaf = t.is_leaf();
  if (!is_plain(t)) {
    if (shapes != nullptr)
      for (const auto& s : *shapes)
        if (s.first == impl) r.sizes = s.second;
  } else {
    auto sz = impl->sizes();
    r.sizes.assign(sz.begin(), sz.end());
    if (impl->has_storage() && impl->storage().unsafeGetStorageImpl() != nullptr) {
      auto st = impl->strides();
      r.strides.assign(st.begin(), st.end());
      c10::StorageImpl* si = impl->storage().unsafeGetStorageImpl();
      r.strided = true;
      r.ptr = reinterpret_cast<int64_t>(si->data_ptr().get());
      r.nbytes = static_cast<int64_t>(si->nbytes());
      r.offset = impl->storage_offset();
    }
  }
  const auto& vc = impl->version_counter();
  if (vc.enabled()) {
    r.has_version = true;
    r.version = static_cast<int64_t>(vc.current_version());
  }
  auto p = g_params.find(impl);
  if (p != g_params.end()) r.param = p->second.ptr();
  int64_t tid = static_cast<int64_t>(g_tensors.size());
  g_tensors.push_back(std::move(r));
  g_tids.emplace(impl, TensorKey{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), tid});
  return tid;
}

// tensors among an op's arguments; a Python number passed as one (`h * 2`) is not a tensor
// of the user's, and a dispatch mode does not see it as one
template <class F>
void each_tensor(const c10::ArrayRef<const c10::IValue>& vs, F f) {
  for (const auto& v : vs) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number()) f(t);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec())
        if (t.defined()) f(t);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef())
        if (e.isTensor() && e.toTensor().defined()) f(e.toTensor());
    }
  }
}

// A composite op called on a tensor subclass (a jagged nested tensor's linear) is the user's
// op: the subclass implements it on its inner tensors, whose ops are kernel internals here.
bool subclass_input(const c10::ArrayRef<const c10::IValue>& vs) {
  bool found = false;
  each_tensor(vs, [&](const at::Tensor& t) { found = found || t.unsafeGetTensorImpl()->is_python_dispatch(); });
  return found;
}

Shapes loose_shapes(const c10::ArrayRef<const c10::IValue>& vs) {
  Shapes out;
  each_tensor(vs, [&](const at::Tensor& t) {
    if (!is_plain(t)) out.emplace_back(t.unsafeGetTensorImpl(), loose_shape(t));
  });
  return out;
}

// storages the ledger watched that died since the last op: their bytes are freed (g_mu held)
void collect_frees() {
  for (size_t i = 0; i < g_storages.size();) {
    if (g_storages[i].ref.expired()) {
      g_freed += g_storages[i].bytes;
      g_freed_ptrs.push_back(g_storages[i].ptr);
      g_storage_index.erase(g_storages[i].ref._unsafe_get_target());
      if (i + 1 != g_storages.size()) {
        g_storages[i] = std::move(g_storages.back());
        g_storage_index[g_storages[i].ref._unsafe_get_target()] = i;
      }
      g_storages.pop_back();
    } else {
      ++i;
    }
  }
}

// Whether a floating input of a NaN source whose output is non-finite already held NaN/Inf: the
// op passed it on, it did not make it -- for a NaN out (`nan_out`), a NaN in: an op that turns
// infinities into NaN made it (a softmax over a row masked wholly with -inf, inf / inf).  An input sharing an output's storage (an in-place op's
// `self`, an `out=`) holds the result, not what came in, and is not read.  Called only once an
// output was found non-finite, with the recorder paused: the common path reads no input.
c10::StorageImpl* storage_of(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->layout() != c10::kStrided || impl->is_python_dispatch() || !impl->has_storage()) return nullptr;
  return impl->storage().unsafeGetStorageImpl();
}

bool nonfinite_input(const std::vector<at::Tensor>& ins, const std::vector<c10::IValue>& outs, bool nan_out) {
  std::vector<c10::StorageImpl*> held;
  each_tensor(c10::ArrayRef<const c10::IValue>(outs.data(), outs.size()), [&](const at::Tensor& t) {
    if (c10::StorageImpl* s = storage_of(t)) held.push_back(s);
  });
  for (const at::Tensor& t : ins) {
    c10::StorageImpl* s = storage_of(t);
    if (s != nullptr && std::find(held.begin(), held.end(), s) != held.end()) continue;
    if (nan_out ? has_nan(t) : !finite(t)) return true;
  }
  return false;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (drop_orphan()) return nullptr;  // the callbacks of this op were copied before: safe to remove
  if (t_paused || t_inside > 0 || !g_on.load(std::memory_order_relaxed) ||
      g_paused.load(std::memory_order_relaxed))
    return nullptr;
  if (g_phase.load(std::memory_order_relaxed) != 1 && std::this_thread::get_id() != g_owner)
    return nullptr;  // a forward (or optimizer.step()) op of another thread: not the recorded step's
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    // a node's start and end: the backward's order and per-node durations, without a Python
    // hook per node (its sequence number names it; AccumulateGrad's, all the same, does not)
    if (g_phase.load(std::memory_order_relaxed) != 1) return nullptr;
    auto ctx = std::make_unique<Ctx>();
    ctx->kind = 3;
    t_node = fn.seqNr();
    std::lock_guard<std::mutex> g(g_mu);
    ctx->op = static_cast<int64_t>(g_nodes.size());
    ctx->gen = g_gen;
    g_nodes.push_back(NodeTime{fn.seqNr(), now_ns(), 0});
    return ctx;
  }
  const OpInfo& info = op_info(fn);
  if (info.skip) return nullptr;
  auto ctx = std::make_unique<Ctx>();
  if (t_depth == 0) t_autocast = autocast_now();
  ++t_depth;
  if (info.composite && !subclass_input(fn.inputs())) {
    ctx->kind = 1;
    return ctx;
  }
  ctx->kind = 2;
  ++t_inside;
  int phase = g_phase.load(std::memory_order_relaxed);
  int64_t cur = g_cur_ctx.load(std::memory_order_relaxed);
  PyObject* src = nullptr;
  if (std::this_thread::get_id() == g_owner) {
    bool walk = true;
    {
      std::lock_guard<std::mutex> g(g_mu);
      if (cur >= 0 && static_cast<size_t>(cur) < g_ctx.size()) walk = g_ctx[cur].walk;
    }
    if (walk) src = walk_src();
  }
  Shapes shapes = loose_shapes(fn.inputs());
  if (info.source && phase == 0 && !g_check_nan) {
    // read only if an output is non-finite: whether the NaN/Inf came in or the op made it
    try {
      each_tensor(fn.inputs(), [&](const at::Tensor& t) {
        if (is_plain(t) && !t.is_meta() && t.numel() != 0 && (t.is_floating_point() || t.is_complex()))
          ctx->ins.push_back(t);
      });
      ctx->kept = true;
    } catch (...) {
      ctx->kept = false;
      ctx->ins.clear();
    }
  }
  std::lock_guard<std::mutex> g(g_mu);
  try {
    if (g_max_ops > 0 && static_cast<int64_t>(g_ops.size()) >= g_max_ops) {
      ++g_shed;
      return ctx;  // kind 2 without an op: children stay unrecorded, nothing is kept
    }
    OpRec r;
    r.name = info.name;
    r.ctx = cur;
    if (phase == 1 && t_node >= 0) {
      // a backward op: in the module (and call) of the forward op that made its node, as the
      // node itself is, not at the root outside the model
      auto made = g_seq.find(static_cast<uint64_t>(t_node));
      if (made != g_seq.end() && made->second.op >= 0 && static_cast<size_t>(made->second.op) < g_ops.size())
        r.ctx = g_ops[made->second.op].ctx;
    }
    r.phase = phase;
    r.micro = g_micro.load(std::memory_order_relaxed);
    r.grad_mode = c10::GradMode::is_enabled();
    r.inference_mode = c10::InferenceMode::is_enabled();
    r.inplace = info.inplace;
    r.src = src;
    r.in_begin = g_io.size();
    bool needs_grad = false;
    each_tensor(fn.inputs(), [&](const at::Tensor& t) {
      g_io.push_back(tensor_id(t, &shapes));
      needs_grad = needs_grad || t.requires_grad();
    });
    r.in_end = g_io.size();
    if (r.grad_mode && needs_grad) r.flags |= F_NONDIFF;  // cleared if an output is differentiable
    if (t_autocast && phase == 0) {
      r.flags |= F_AUTOCAST;
      g_autocast_seen = true;
    }
    r.to_copy = info.to_copy;
    if (phase == 0) r.seq0 = r.seq1 = static_cast<int64_t>(at::sequence_number::peek());
    r.t0 = now_ns();
    ctx->op = static_cast<int64_t>(g_ops.size());
    ctx->gen = g_gen;
    g_ops.push_back(r);
  } catch (const std::exception& e) {
    if (g_failed.empty()) g_failed = e.what();
  }
  return ctx;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* base) {
  if (base == nullptr) return;
  auto* ctx = static_cast<Ctx*>(base);
  if (ctx->kind == 3) {
    int64_t t1 = now_ns();
    std::lock_guard<std::mutex> g(g_mu);
    if (ctx->gen == g_gen && static_cast<size_t>(ctx->op) < g_nodes.size()) g_nodes[ctx->op].t1 = t1;
    return;
  }
  --t_depth;
  if (ctx->kind == 1) return;
  --t_inside;
  if (ctx->op < 0) return;
  int64_t t1 = now_ns();
  bool nan = false, seen = false;
  const bool source = g_phase.load(std::memory_order_relaxed) == 0 && nan_source(fn.name());
  if ((g_check_nan || source) && !uninitialised(fn.name())) {
    // the capture's own ops: not recorded, not differentiated
    t_paused = true;
    try {
      at::NoGradGuard no_grad;
      // a profiler the user runs around the loop sees these reads under our label, as the
      // Python side's torchscope::<part>, not as aminmax/isfinite of the user's op (QA 49c)
      std::optional<at::RecordFunction> label;
      if (torch::profiler::impl::profilerEnabled()) {
        label.emplace(at::RecordScope::USER_SCOPE);
        if (label->isActive()) label->before("torchscope::nan_check");
      }
      for (const auto& v : fn.outputs()) {
        if (!v.isTensor()) continue;
        const at::Tensor& t = v.toTensor();
        // meta tensors (compiled autograd and FakeTensor tracing run ops on them) hold no values
        if (!t.defined() || t.unsafeGetTensorImpl()->is_python_dispatch() || t.numel() == 0 || t.is_meta()) continue;
        if (!(t.is_floating_point() || t.is_complex())) continue;
        if (!finite(t)) {
          seen = nan = true;
          // a NaN source checked for itself (check_nan off) made the NaN/Inf only if it came in
          // through none of its inputs: `loss / accum_steps` of a NaN loss did not
          if (!g_check_nan && ctx->kept && nonfinite_input(ctx->ins, fn.outputs(), has_nan(t))) nan = false;
          break;
        }
      }
    } catch (...) {
    }
    t_paused = false;
  }
  ctx->ins.clear();  // the inputs' references, not held past the op (its frees are counted below)
  const auto& outs = fn.outputs();
  Shapes shapes = loose_shapes(c10::ArrayRef<const c10::IValue>(outs.data(), outs.size()));
  std::lock_guard<std::mutex> g(g_mu);
  // another thread's reset() (a new recorded step) since this op began: its record is gone
  if (ctx->gen != g_gen || static_cast<size_t>(ctx->op) >= g_ops.size()) return;
  try {
    OpRec& r = g_ops[ctx->op];
    r.dur_ns = t1 - r.t0;
    collect_frees();
    r.out_begin = g_io.size();
    int64_t alloc = 0;
    bool any_float = false, any_out = false;
    each_tensor(c10::ArrayRef<const c10::IValue>(outs.data(), outs.size()), [&](const at::Tensor& t) {
      any_out = true;
      c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      auto known_t = g_tids.find(impl);
      bool seen = known_t != g_tids.end() && !known_t->second.ref.expired();
      int64_t tid = tensor_id(t, &shapes);
      g_io.push_back(tid);
      any_float = any_float || t.is_floating_point() || t.is_complex();
      const TensorRec& tr = g_tensors[tid];
      if (tr.strided && !seen) {
        c10::StorageImpl* si = impl->storage().unsafeGetStorageImpl();
        bool known = g_storage_index.count(si) > 0;
        // a view or an in-place result shares an input's storage: nothing was allocated
        for (size_t k = r.in_begin; k < r.in_end && !known; ++k) known = g_tensors[g_io[k]].ptr == tr.ptr && tr.ptr != 0;
        if (!known) {
          alloc += tr.nbytes;
          g_storage_index[si] = g_storages.size();
          g_storages.push_back(StorageRec{impl->storage().getWeakStorageImpl(), tr.nbytes, tr.ptr});
        }
      }
      // autograd has set the output's grad_fn by now (the record wraps the autograd kernel)
      if (r.phase == 0 && r.grad_mode) {
        const auto& node = t.grad_fn();
        if (node) {
          uint64_t seq = node->sequence_nr();
          auto s = g_seq.find(seq);
          if (s == g_seq.end()) {
            s = g_seq.emplace(seq, SeqLink{ctx->op, {}}).first;
            g_seq_order.push_back(seq);
          }
          s->second.tids.push_back(tid);
        }
      }
    });
    r.out_end = g_io.size();
    if ((r.flags & F_NONDIFF) && (!any_out || any_float)) r.flags &= ~F_NONDIFF;
    // autocast's own cast: a _to_copy made with no user cast running that changes the dtype
    if (r.to_copy && (r.flags & F_AUTOCAST) && g_explicit.load() == 0 && r.in_end > r.in_begin &&
        r.out_end > r.out_begin && g_tensors[g_io[r.out_begin]].dtype != g_tensors[g_io[r.in_begin]].dtype)
      r.flags |= F_AUTOCAST_CAST;
    if (nan) r.flags |= F_NAN;
    if (seen) g_nan_seen = true;
    g_live += alloc - g_freed;
    r.alloc = alloc;
    r.free = g_freed;
    g_freed = 0;
    r.freed_begin = g_freed_io.size();
    g_freed_io.insert(g_freed_io.end(), g_freed_ptrs.begin(), g_freed_ptrs.end());
    r.freed_end = g_freed_io.size();
    g_freed_ptrs.clear();
    r.live = g_live;
    // (after reading the outputs' grad_fn: a view's is made when first asked for)
    if (r.seq0 >= 0) r.seq1 = static_cast<int64_t>(at::sequence_number::peek());
    r.done = true;
  } catch (const std::exception& e) {
    if (g_failed.empty()) g_failed = e.what();
  }
}

// ------------------------------------------------------------------ to Python
// The links and timeline pairs are tuples of ints: untracked by the cyclic collector (they
// cannot form a cycle), so a step's thousands of them add nothing to its passes over the heap.
PyObject* int_tuple(const int64_t* b, const int64_t* e) {
  PyObject* t = PyTuple_New(e - b);
  for (Py_ssize_t i = 0; b + i < e; ++i) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(b[i]));
  PyObject_GC_UnTrack(t);
  return t;
}

std::unordered_map<int, PyObject*> g_dtype_names;
std::unordered_map<int, PyObject*> g_device_names;

PyObject* dtype_name(at::ScalarType st) {
  auto it = g_dtype_names.find(static_cast<int>(st));
  if (it == g_dtype_names.end())
    it = g_dtype_names.emplace(static_cast<int>(st), PyUnicode_FromString(torch::getTHPDtype(st)->name)).first;
  Py_INCREF(it->second);
  return it->second;
}

PyObject* device_name(const c10::Device& d) {
  int key = static_cast<int>(d.type()) * 1024 + d.index() + 1;
  auto it = g_device_names.find(key);
  if (it == g_device_names.end()) it = g_device_names.emplace(key, PyUnicode_FromString(d.str().c_str())).first;
  Py_INCREF(it->second);
  return it->second;
}

PyObject* dtype_name_borrowed(at::ScalarType st) {
  PyObject* o = dtype_name(st);
  Py_DECREF(o);  // the table keeps it
  return o;
}

PyObject* device_name_borrowed(const c10::Device& d) {
  PyObject* o = device_name(d);
  Py_DECREF(o);
  return o;
}

PyObject* storage_id(PyObject* ids, int64_t ptr) {
  PyObject* k = PyLong_FromLongLong(ptr);
  PyObject* v = PyDict_GetItem(ids, k);  // borrowed
  if (v == nullptr) {
    v = PyLong_FromSsize_t(PyDict_Size(ids));
    PyDict_SetItem(ids, k, v);
  } else {
    Py_INCREF(v);
  }
  Py_DECREF(k);
  return v;
}

// ------------------------------------------------------------------ the module's functions
void start() {
  drop_orphan();
  g_owner = std::this_thread::get_id();
  if (t_handle == 0) {
    // thread-local: the training thread's ops (and, through the state the autograd engine
    // propagates, its backward on device threads), never another thread's
    t_handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                              .needsInputs(true)
                                              .needsOutputs(true)
                                              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  }
  g_handle = t_handle;  // any other thread's registration is an orphan from now on
  g_on = true;
}

void stop() {
  g_on = false;
  g_handle = 0;
  drop_orphan();  // this thread's; another thread's goes at that thread's next op
}

// Bytes of the step's baseline freed outside any op (a .grad that zero_grad() dropped between
// the forward and the backward): a free of the next op, with no storage of the ledger's.
void untracked_free(int64_t bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  g_freed += bytes;
}

// The ledger follows tensor t's storage from now on, as if an op had made it: freed when it
// dies.  A tensor made outside any op -- a forward's input batch, made by the data loader --
// of `bytes` (a slice of a dataset: the part it spans); `counted`: its bytes are in the
// baseline already, else live from the next op on (no op's allocation).  False where the
// ledger follows that storage already (an op's output) or t has none.
bool follow(const at::Tensor& t, int64_t bytes, bool counted) {
  std::lock_guard<std::mutex> g(g_mu);
  if (!t.defined()) return false;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->has_storage() || impl->storage().unsafeGetStorageImpl() == nullptr) return false;
  c10::StorageImpl* si = impl->storage().unsafeGetStorageImpl();
  collect_frees();  // (a dead batch's storage may sit at this one's address until the next op)
  if (g_storage_index.count(si) > 0) return false;
  g_storage_index[si] = g_storages.size();
  g_storages.push_back(StorageRec{impl->storage().getWeakStorageImpl(), bytes,
                                  reinterpret_cast<int64_t>(si->data_ptr().get())});
  if (!counted) g_live += bytes;
  return true;
}

// Whether this thread has RecordFunction callbacks of its own (the tests' check that none is left).
bool observed() {
  return at::hasThreadLocalCallbacks();
}

void reset(int64_t baseline, bool check_nan, int64_t max_ops, py::dict params) {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto& r : g_ops) Py_XDECREF(r.marker_flags);
  g_ops.clear();
  g_io.clear();
  g_freed_ptrs.clear();
  g_freed_io.clear();
  g_freed_sent = 0;
  g_tensors.clear();
  g_tids.clear();
  g_storages.clear();
  g_storage_index.clear();
  g_seq.clear();
  g_seq_order.clear();
  g_nodes.clear();
  g_ctx.clear();
  g_ops_sent = g_tensors_sent = g_seq_sent = g_nodes_sent = 0;
  g_live = baseline;
  g_freed = g_shed = 0;
  g_max_ops = max_ops;
  g_failed.clear();
  ++g_gen;
  g_check_nan = check_nan;
  g_nan_seen = g_autocast_seen = false;
  g_cur_ctx = -1;
  g_paused = false;
  g_explicit = 0;
  g_params.clear();
  for (auto item : params) {
    auto ptr = reinterpret_cast<c10::TensorImpl*>(py::cast<intptr_t>(item.first));
    g_params.emplace(ptr, py::reinterpret_borrow<py::object>(item.second));
  }
}

// a module/phase context; returns its id for set_context
int64_t context(py::object module, int64_t call, bool inside, py::object src, bool walk) {
  std::lock_guard<std::mutex> g(g_mu);
  g_ctx.push_back(Context{std::move(module), std::move(src), call, inside, walk});
  return static_cast<int64_t>(g_ctx.size()) - 1;
}

void set_state(int64_t ctx, int phase, int64_t micro) {
  g_cur_ctx = ctx;
  g_phase = phase;
  g_micro = micro;
  t_node = -1;  // a backward about to start (or over) has run no node on this thread
}

void set_explicit(int64_t n) { g_explicit = n; }
void set_paused(bool p) { g_paused = p; }
void pause_thread(bool p) { t_paused = p; }

// a torch-level event (`.item()`, `detach()`...) as an op, in sequence with the others
void marker(py::object name, const at::Tensor& t, py::tuple flags, py::object src) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_max_ops > 0 && static_cast<int64_t>(g_ops.size()) >= g_max_ops) {
    ++g_shed;
    return;
  }
  OpRec r;
  static std::unordered_map<std::string, PyObject*> names;  // owned for the process's life: a few
  std::string n = py::cast<std::string>(name);
  auto nit = names.find(n);
  if (nit == names.end()) nit = names.emplace(n, PyUnicode_FromString(n.c_str())).first;
  r.name = nit->second;
  r.ctx = g_cur_ctx;
  r.phase = g_phase;
  r.micro = g_micro;
  r.grad_mode = c10::GradMode::is_enabled();
  r.marker = true;
  r.in_begin = g_io.size();
  if (t.defined()) g_io.push_back(tensor_id(t));
  r.in_end = r.out_begin = r.out_end = g_io.size();
  static std::unordered_map<std::string, PyObject*> srcs;
  std::string s = py::cast<std::string>(src);
  auto it = srcs.find(s);
  if (it == srcs.end()) it = srcs.emplace(s, PyUnicode_FromString(s.c_str())).first;
  r.src = it->second;
  r.live = g_live;
  r.marker_flags = flags.release().ptr();
  r.done = true;
  g_ops.push_back(r);
}

// Takes the records made since the last drain: gives the new tensors their storage ids (from
// `storage_ids`, the step's ptr -> id dict shared with the graph's saved tensors), and returns
// [(sequence_nr, op, tensor ids...)] for the grad_fn links, the timeline's new (op, live)
// pairs, the new ops' modules (by op id) and autocast casts, and the counters.  The records
// themselves stay here until `encode` writes them as JSON.
py::tuple drain(py::dict storage_ids) {
  std::lock_guard<std::mutex> g(g_mu);
  PyObject* ids = storage_ids.ptr();
  for (; g_tensors_sent < g_tensors.size(); ++g_tensors_sent) {
    TensorRec& r = g_tensors[g_tensors_sent];
    if (r.strided) {
      PyObject* v = storage_id(ids, r.ptr);
      r.sid = PyLong_AsLongLong(v);
      Py_DECREF(v);
    }
  }
  py::list timeline, modules, casts;
  size_t first = g_ops_sent;
  for (; g_ops_sent < g_ops.size(); ++g_ops_sent) {
    const OpRec& r = g_ops[g_ops_sent];
    if (!r.done) break;  // still running (a drain inside an op): next time
    // its freed storages' pointers as their ids (each was an earlier op's output: drained)
    for (; g_freed_sent < r.freed_end; ++g_freed_sent) {
      PyObject* v = storage_id(ids, g_freed_io[g_freed_sent]);
      g_freed_io[g_freed_sent] = PyLong_AsLongLong(v);
      Py_DECREF(v);
    }
    int64_t id = static_cast<int64_t>(g_ops_sent);
    const Context* c = r.ctx >= 0 && static_cast<size_t>(r.ctx) < g_ctx.size() ? &g_ctx[r.ctx] : nullptr;
    modules.append(c ? c->module : py::str(""));
    if (!r.marker) {
      int64_t pair[2] = {id, r.live};
      timeline.append(py::reinterpret_steal<py::object>(int_tuple(pair, pair + 2)));
      if (r.flags & F_AUTOCAST_CAST) casts.append(id);
    }
  }
  py::list links;  // (sequence number, op, tensor ids...) each, untracked like the records
  for (; g_seq_sent < g_seq_order.size(); ++g_seq_sent) {
    const SeqLink& l = g_seq[g_seq_order[g_seq_sent]];
    std::vector<int64_t> flat{static_cast<int64_t>(g_seq_order[g_seq_sent]), l.op};
    flat.insert(flat.end(), l.tids.begin(), l.tids.end());
    links.append(py::reinterpret_steal<py::object>(int_tuple(flat.data(), flat.data() + flat.size())));
  }
  py::list nodes;
  for (; g_nodes_sent < g_nodes.size(); ++g_nodes_sent) {
    const NodeTime& n = g_nodes[g_nodes_sent];
    if (n.t1 == 0) break;  // still running
    nodes.append(py::make_tuple(n.seq, n.t0, n.t1));
  }
  return py::make_tuple(links, timeline, nodes, g_shed, g_live, py::bool_(g_nan_seen), py::bool_(g_autocast_seen),
                        py::str(g_failed), modules, casts, static_cast<int64_t>(g_ops_sent),
                        static_cast<int64_t>(g_tensors_sent));
}

// P8's silent form, its candidates: each forward in-place op (an aten op named "..._": it writes
// its first argument) that ran after the graph node which saved a tensor of the storage it
// writes -- a `.data` write, which the saved tensor's version counter does not see.  `first`
// maps a storage id to the first op whose node saved it.  Returns (op id, storage id, storage
// offset, sizes, strides, element size) of the tensor each writes: whether it overlaps what was
// saved is decided in Python (_overlap: torch's own unsafe_chunk views -- a GRU cell's gates --
// write disjoint parts of one storage), which then flags the op (flag_op_inplace_saved).
py::list inplace_candidates(py::dict first_of) {
  std::unordered_map<int64_t, int64_t> first;
  for (auto item : first_of) first[item.first.cast<int64_t>()] = item.second.cast<int64_t>();
  std::lock_guard<std::mutex> g(g_mu);
  py::list out;
  for (size_t id = 0; id < g_ops_sent; ++id) {
    OpRec& r = g_ops[id];
    // forward ops only: the backward's own in-place accumulations write buffers whose storage
    // may reuse a freed saved tensor's address
    if (!r.inplace || r.marker || r.phase != 0 || r.in_end <= r.in_begin || r.name == nullptr) continue;
    Py_ssize_t len = 0;
    const char* name = PyUnicode_AsUTF8AndSize(r.name, &len);
    if (name == nullptr || len == 0 || name[len - 1] != '_') {
      PyErr_Clear();
      continue;
    }
    const int64_t tid = g_io[r.in_begin];
    if (tid < 0 || static_cast<size_t>(tid) >= g_tensors.size()) continue;
    const TensorRec& t = g_tensors[tid];
    auto it = first.find(t.sid);
    if (t.sid >= 0 && t.strided && it != first.end() && it->second < static_cast<int64_t>(id)) {
      out.append(py::make_tuple(static_cast<int64_t>(id), t.sid, t.offset, py::cast(t.sizes), py::cast(t.strides),
                                static_cast<int64_t>(c10::elementSize(t.dtype))));
    }
  }
  return out;
}

void flag_op_inplace_saved(int64_t id) {
  std::lock_guard<std::mutex> g(g_mu);
  if (id >= 0 && static_cast<size_t>(id) < g_ops_sent) g_ops[id].flags |= F_INPLACE_SAVED;
}

void set_grad_fn(int64_t tid, int64_t node) {
  std::lock_guard<std::mutex> g(g_mu);
  if (tid >= 0 && static_cast<size_t>(tid) < g_tensors.size()) g_tensors[tid].grad_fn = node;
}

// ------------------------------------------------------------------ records as JSON
// The drained records as the JSON the writer would make of schema.OpRecord / TensorMeta
// dicts, written here instead: building ~1,500 dicts a step cost the training thread ~2.5 ms
// of a transformer step, and encoding them the writer thread ~8 ms holding the GIL.
struct Json {
  std::string out;

  void raw(const char* s) { out += s; }
  void key(const char* k) {  // "k": after a comma unless it opens the object
    if (out.back() != '{') out += ',';
    out += '"';
    out += k;
    out += "\":";
  }
  void num(int64_t v) {
    char buf[24];
    auto res = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, res.ptr);
  }
  void real(double v) {  // Python's float repr: shortest round trip, and a float stays one
    if (!std::isfinite(v)) {
      out += std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity");
      return;
    }
    char buf[32];
    auto res = std::to_chars(buf, buf + sizeof buf, v);
    std::string_view t(buf, res.ptr - buf);
    out += t;
    if (t.find_first_of(".en") == std::string_view::npos) out += ".0";
  }
  void boolean(bool b) { out += b ? "true" : "false"; }
  void str(PyObject* s) {
    Py_ssize_t n = 0;
    const char* p = s && PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &n) : nullptr;
    if (p == nullptr) {  // not a str, or not UTF-8 encodable (a lone surrogate)
      PyErr_Clear();
      out += "\"\"";
      return;
    }
    text(p, n);
  }
  void text(const char* p, Py_ssize_t n) {
    out += '"';
    Py_ssize_t run = 0;  // the start of the stretch that needs no escape, appended at once
    for (Py_ssize_t i = 0; i < n; ++i) {
      const unsigned char ch = static_cast<unsigned char>(p[i]);
      if (ch != '"' && ch != '\\' && ch >= 0x20) continue;  // UTF-8 as is: JSON text is Unicode
      out.append(p + run, i - run);
      run = i + 1;
      if (ch < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", ch);
        out += buf;
      } else {
        out += '\\';
        out += static_cast<char>(ch);
      }
    }
    out.append(p + run, n - run);
    out += '"';
  }
  void ints(const int64_t* b, const int64_t* e) {
    out += '[';
    for (const int64_t* q = b; q < e; ++q) {
      if (q != b) out += ',';
      num(*q);
    }
    out += ']';
  }
};

void op_json(Json& j, const OpRec& r, int64_t id) {
  const Context* c = r.ctx >= 0 && static_cast<size_t>(r.ctx) < g_ctx.size() ? &g_ctx[r.ctx] : nullptr;
  j.raw("{");
  j.key("id"), j.num(id);
  j.key("name"), j.str(r.name);
  j.key("module");
  if (c) j.str(c->module.ptr());
  else j.raw("\"\"");
  j.key("call"), j.num(c ? c->call : 0);
  j.key("phase"), j.raw(r.phase == 1 ? "\"backward\"" : r.phase == 2 ? "\"optimizer\"" : "\"forward\"");
  j.key("micro"), j.num(r.micro);
  j.key("inputs"), j.ints(g_io.data() + r.in_begin, g_io.data() + r.in_end);
  j.key("outputs"), j.ints(g_io.data() + r.out_begin, g_io.data() + r.out_end);
  j.key("grad_mode"), j.boolean(r.grad_mode);
  if (!r.marker) j.key("inference_mode"), j.boolean(r.inference_mode);
  j.key("inplace"), j.boolean(r.inplace);
  PyObject* src = r.src ? r.src : (c ? c->src.ptr() : nullptr);
  j.key("src");
  if (src) j.str(src);
  else j.raw("\"\"");
  j.key("dur_us"), j.real(static_cast<double>(r.dur_ns) / 1000.0);
  j.key("alloc"), j.num(r.alloc);
  j.key("free"), j.num(r.free);
  if (r.freed_end > r.freed_begin) j.key("freed"), j.ints(g_freed_io.data() + r.freed_begin, g_freed_io.data() + r.freed_end);
  j.key("live"), j.num(r.live);
  std::vector<const char*> fixed;
  if (!(c && c->inside)) fixed.push_back("outside_model");
  if (!r.marker) {
    if (r.inplace) fixed.push_back("inplace");
    if (r.flags & F_NONDIFF) fixed.push_back("non_differentiable");
    if (r.flags & F_AUTOCAST) fixed.push_back("autocast");
    if (r.flags & F_AUTOCAST_CAST) fixed.push_back("autocast_cast");
    if (r.flags & F_NAN) fixed.push_back("nan");
    if (r.flags & F_INPLACE_SAVED) fixed.push_back("inplace_saved");
  }
  Py_ssize_t n_marker = r.marker && r.marker_flags ? PyTuple_GET_SIZE(r.marker_flags) : 0;
  if (n_marker || !fixed.empty()) {
    j.key("flags");
    j.raw("[");
    bool first = true;
    for (Py_ssize_t i = 0; i < n_marker; ++i, first = false) {
      if (!first) j.raw(",");
      j.str(PyTuple_GET_ITEM(r.marker_flags, i));
    }
    for (const char* f : fixed) {
      if (!first) j.raw(",");
      first = false;
      j.text(f, static_cast<Py_ssize_t>(std::strlen(f)));
    }
    j.raw("]");
  }
  j.raw("}");
}

void tensor_json(Json& j, const TensorRec& r, int64_t id) {
  j.raw("{");
  j.key("id"), j.num(id);
  j.key("shape"), j.ints(r.sizes.data(), r.sizes.data() + r.sizes.size());
  j.key("dtype"), j.str(dtype_name_borrowed(r.dtype));
  j.key("device"), j.str(device_name_borrowed(r.device));
  j.key("requires_grad"), j.boolean(r.requires_grad);
  j.key("is_leaf"), j.boolean(r.is_leaf);
  if (r.strided) {
    j.key("stride"), j.ints(r.strides.data(), r.strides.data() + r.strides.size());
    j.key("storage"), j.num(r.sid);
    j.key("offset"), j.num(r.offset);
    j.key("nbytes"), j.num(r.nbytes);
  }
  if (r.has_version) j.key("version"), j.num(r.version);
  if (r.param) j.key("param"), j.str(r.param);
  if (r.grad_fn >= 0) j.key("grad_fn"), j.num(r.grad_fn);
  j.raw("}");
}

// For graph nodes no op's output links (their sequence numbers, ascending), the forward op that
// made each: the one during which the counter passed it (an in-place op on a view makes its
// CopySlices there), or -- made between ops -- the op that ran right after it, the counter one
// past it (a custom autograd.Function's node, made before the ops of its forward run, which are
// the Function's module's).  [(op, made during it)], op -1 where none tells.  Asked as a captured
// backward begins, before its nodes run.
py::list made_by(const std::vector<int64_t>& seqs) {
  std::lock_guard<std::mutex> g(g_mu);
  py::list out;
  size_t lo = 0;
  for (int64_t s : seqs) {
    int64_t hit = -1;
    bool during = false;
    for (size_t k = lo; k < g_ops.size(); ++k) {
      const OpRec& r = g_ops[k];
      if (r.seq0 < 0) continue;  // a backward op, a marker
      if (r.seq1 <= s && r.seq0 != s + 1) {
        lo = k + 1;  // (the seqs ascend: no later node is made at or before this op)
        continue;
      }
      if (r.seq0 <= s && s < r.seq1) {
        hit = static_cast<int64_t>(k), during = true;
      } else if (r.seq0 == s + 1) {
        hit = static_cast<int64_t>(k);
      }
      break;
    }
    // and the ops its backward runs are that module's, as a linked node's are (on_enter), not
    // the root's; not in g_seq_order: Python has this link already
    if (hit >= 0) g_seq.emplace(static_cast<uint64_t>(s), SeqLink{hit, {}});
    out.append(py::make_tuple(hit, during));
  }
  return out;
}

// The drained ops and tensors as two JSON arrays (str); call after the last drain.
py::tuple encode() {
  std::lock_guard<std::mutex> g(g_mu);
  Json ops, tensors;
  ops.out.reserve(g_ops_sent * 260 + 2);
  tensors.out.reserve(g_tensors_sent * 160 + 2);
  ops.raw("[");
  for (size_t i = 0; i < g_ops_sent; ++i) {
    if (i) ops.raw(",");
    op_json(ops, g_ops[i], static_cast<int64_t>(i));
  }
  ops.raw("]");
  tensors.raw("[");
  for (size_t i = 0; i < g_tensors_sent; ++i) {
    if (i) tensors.raw(",");
    tensor_json(tensors, g_tensors[i], static_cast<int64_t>(i));
  }
  tensors.raw("]");
  return py::make_tuple(py::str(ops.out), py::str(tensors.out));
}

// stop watching frees and drop the weak references (the step's records are complete)
void finish() {
  std::lock_guard<std::mutex> g(g_mu);
  g_tids.clear();
  g_storages.clear();
  g_storage_index.clear();
}

void configure(py::object user_base) { g_user_base = std::move(user_base); }

}  // namespace

void register_stats(py::module& m);  // stats.cpp
void register_storage(py::module& m);  // storage.cpp
void register_graph(py::module& m);  // graph.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_stats(m);
  register_storage(m);
  register_graph(m);
  m.def("configure", &configure);
  m.def("start", &start);
  m.def("stop", &stop);
  m.def("observed", &observed);
  m.def("reset", &reset);
  m.def("untracked_free", &untracked_free);
  m.def("follow", &follow);
  m.def("context", &context);
  m.def("set_state", &set_state);
  m.def("set_explicit", &set_explicit);
  m.def("set_paused", &set_paused);
  m.def("pause_thread", &pause_thread);
  m.def("marker", &marker);
  m.def("drain", &drain);
  m.def("set_grad_fn", &set_grad_fn);
  m.def("made_by", &made_by);
  m.def("inplace_candidates", &inplace_candidates);
  m.def("flag_op_inplace_saved", &flag_op_inplace_saved);
  m.def("encode", &encode);
  m.def("finish", &finish);
}
