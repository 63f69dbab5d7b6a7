// Gradient statistics of CPU tensors, one pass over each (see capture/_native.py).
//
// Why: on the CPU each torch reduction is a dispatched op of a few microseconds, and a
// gradient's statistics take five to seven of them (norm, min/max, non-zeros, sum, NaN/Inf
// counts) plus a stack and a read: ~70 us for a 16k-element activation gradient, mostly
// per-call overhead.  Module outputs' gradients (every module of a captured step) and the
// parameters' gradients (every step) are read here once each instead.  CUDA tensors, tensor
// subclasses, complex and strided-odd layouts keep the torch path (these return None).
// the block loops below are written for the vectorizer, which -O2 leaves mostly off
#pragma GCC optimize("O3")
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/function.h>  // Node: torch 2.11 has no node.h
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <array>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tensors.h"

namespace py = pybind11;
using torchscope_native::owns_storage;
using torchscope_native::tensor_at;

namespace {

struct Part {
  double sumsq = 0, sum = 0;
  // the sums of x - c and (x - c)^2 for one of the tensor's own values c (its first): the
  // variance from these does not cancel when |mean| >> std, as sumsq - sum^2/n would
  double dsum = 0, dsumsq = 0;
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  int64_t nonzero = 0, nan = 0, inf = 0;

  void add(const Part& q) {
    sumsq += q.sumsq;
    sum += q.sum;
    dsum += q.dsum;
    dsumsq += q.dsumsq;
    lo = std::min(lo, q.lo);
    hi = std::max(hi, q.hi);
    nonzero += q.nonzero;
    nan += q.nan;
    inf += q.inf;
  }
};

// What a pass computes: the sum of squares only (a norm), or also min, max, non-zeros, sum and
// the shifted sums (the variance), and NaN/Inf counts on top.
enum Cols { kNorm = 0, kFull = 1, kFullNan = 2 };

// Lanes of floats over short blocks, so the compiler keeps them in vector registers (the
// ternaries below are exactly SSE/AVX min/max, NaN included), and each block's sums are added
// to doubles: a lane adds at most kBlock / kLanes values in float precision.
constexpr int kLanes = 16;
constexpr int64_t kBlock = 256;

template <typename T, int kCols>
__attribute__((target_clones("avx2", "default"))) void scan(const T* p, int64_t n, double shift, Part& out) {
  const float c = static_cast<float>(shift);  // one of the tensor's own values: exact
  float lo[kLanes], hi[kLanes];
  for (int k = 0; k < kLanes; ++k) {
    lo[k] = std::numeric_limits<float>::infinity();
    hi[k] = -std::numeric_limits<float>::infinity();
  }
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float ss[kLanes] = {}, sm[kLanes] = {}, ds[kLanes] = {}, dq[kLanes] = {};
    int32_t nz[kLanes] = {}, nan[kLanes] = {}, inf[kLanes] = {};
    for (int64_t j = i; j < i + kBlock; j += kLanes) {
      for (int k = 0; k < kLanes; ++k) {
        const float x = static_cast<float>(p[j + k]);
        ss[k] += x * x;
        if (kCols >= kFull) {
          sm[k] += x;
          const float d = x - c;
          ds[k] += d;
          dq[k] += d * d;
          lo[k] = x < lo[k] ? x : lo[k];  // a NaN compares false: never lo or hi (see finish)
          hi[k] = x > hi[k] ? x : hi[k];
          nz[k] += x != 0.0f;  // NaN != 0: counted, as torch.count_nonzero counts it
        }
        if (kCols == kFullNan) {
          nan[k] += x != x;
          inf[k] += (x - x) != (x - x) && x == x;  // inf - inf is NaN, a finite x's is 0
        }
      }
    }
    double b = 0, bs = 0, bd = 0, bq = 0;
    for (int k = 0; k < kLanes; ++k) {
      b += ss[k];
      bs += sm[k];
      bd += ds[k];
      bq += dq[k];
      out.nonzero += nz[k];
      out.nan += nan[k];
      out.inf += inf[k];
    }
    out.sumsq += b;
    out.sum += bs;
    out.dsum += bd;
    out.dsumsq += bq;
  }
  for (int k = 0; k < kLanes; ++k) {
    out.lo = std::min(out.lo, static_cast<double>(lo[k]));
    out.hi = std::max(out.hi, static_cast<double>(hi[k]));
  }
  for (; i < n; ++i) {  // the tail, element by element
    const double x = static_cast<float>(p[i]);
    out.sumsq += x * x;
    out.sum += x;
    out.dsum += x - c;
    out.dsumsq += (x - c) * (x - c);
    out.lo = x < out.lo ? x : out.lo;
    out.hi = x > out.hi ? x : out.hi;
    out.nonzero += x != 0;
    out.nan += std::isnan(x);
    out.inf += std::isinf(x);
  }
}

// doubles: no float lanes (they would round), one plain pass
template <>
void scan<double, kNorm>(const double* p, int64_t n, double, Part& out) {
  for (int64_t i = 0; i < n; ++i) {
    out.sumsq += p[i] * p[i];
  }
}

template <>
void scan<double, kFull>(const double* p, int64_t n, double c, Part& out) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = p[i];
    out.sumsq += x * x;
    out.sum += x;
    out.dsum += x - c;
    out.dsumsq += (x - c) * (x - c);
    out.lo = x < out.lo ? x : out.lo;
    out.hi = x > out.hi ? x : out.hi;
    out.nonzero += x != 0;
  }
}

template <>
void scan<double, kFullNan>(const double* p, int64_t n, double c, Part& out) {
  scan<double, kFull>(p, n, c, out);
  for (int64_t i = 0; i < n; ++i) {
    out.nan += std::isnan(p[i]);
    out.inf += std::isinf(p[i]);
  }
}

// The sums again in doubles, element by element: a float lane's x * x overflows for |x| above
// ~1.8e19 (a diverging bfloat16 run's activations, still finite), which read as a norm of inf
// beside finite min and max (QA 39a).  Only after a pass whose sums came out non-finite: rare.
template <typename T>
void sums_in_double(const T* p, int64_t n, double c, Part& out) {
  double sumsq = 0, sum = 0, dsum = 0, dsumsq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(p[i]);
    sumsq += x * x;
    sum += x;
    dsum += x - c;
    dsumsq += (x - c) * (x - c);
  }
  out.sumsq = sumsq;
  out.sum = sum;
  out.dsum = dsum;
  out.dsumsq = dsumsq;
}

template <typename T>
Part reduce_as(const at::Tensor& t, int cols) {
  const T* p = t.const_data_ptr<T>();
  const int64_t n = t.numel();
  constexpr int64_t kChunk = 1 << 16;  // small tensors: one chunk, no thread pool
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const double shift = n ? static_cast<double>(p[0]) : 0.0;  // the same in every chunk
  auto one = [&](int64_t c, Part& part) {
    const int64_t start = c * kChunk, len = std::min(kChunk, n - start);
    switch (cols) {
      case kNorm: scan<T, kNorm>(p + start, len, shift, part); break;
      case kFull: scan<T, kFull>(p + start, len, shift, part); break;
      default: scan<T, kFullNan>(p + start, len, shift, part); break;
    }
  };
  Part all;
  if (chunks <= 1) {
    one(0, all);
  } else {
    std::vector<Part> parts(chunks);
    // torch's own intra-op threads, as its reductions would use
    at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) one(c, parts[c]);
    });
    for (const Part& q : parts) all.add(q);
  }
  if (!std::is_same<T, double>::value && (!std::isfinite(all.sumsq) || !std::isfinite(all.dsumsq))) {
    sums_in_double(p, n, shift, all);  // (a NaN or Inf among the values stays so)
  }
  return all;
}

// A dense contiguous CPU tensor of a floating dtype read here, holding its own values (not a
// tensor subclass, a functorch wrapper or a functional tensor).
bool readable(const at::Tensor& t) {
  if (!owns_storage(t) || t.device().type() != c10::DeviceType::CPU || !t.is_contiguous() || t.is_neg() ||
      t.is_conj()) {
    return false;
  }
  const at::ScalarType dt = t.scalar_type();
  return dt == at::kFloat || dt == at::kDouble || dt == at::kHalf || dt == at::kBFloat16;
}

Part reduce(const at::Tensor& t, int cols) {
  switch (t.scalar_type()) {
    case at::kFloat: return reduce_as<float>(t, cols);
    case at::kDouble: return reduce_as<double>(t, cols);
    case at::kHalf: return reduce_as<c10::Half>(t, cols);
    default: return reduce_as<c10::BFloat16>(t, cols);
  }
}

// The population variance from the shifted sums (the sums of x - c and (x - c)^2).
double variance(const Part& s, double n) { return std::max(s.dsumsq - s.dsum * s.dsum / n, 0.0) / n; }

// min and max as torch reports them: NaN where the tensor holds one (only a NaN makes a sum of
// squares NaN)
void nan_extremes(Part& s) {
  if (std::isnan(s.sumsq)) {
    s.lo = s.hi = std::numeric_limits<double>::quiet_NaN();
  }
}

// (norm, min, max, non-zeros[, NaNs, Infs]) of a module output's gradient as Python floats,
// or None where the torch path must take them.
py::object tensor_stats(const at::Tensor& t, bool check_nan) {
  if (!readable(t) || t.numel() == 0) {
    return py::none();
  }
  Part s;
  {
    py::gil_scoped_release nogil;  // the data pass runs without the GIL: other threads go on
    s = reduce(t, check_nan ? kFullNan : kFull);
  }
  nan_extremes(s);
  py::tuple r(check_nan ? 6 : 4);
  r[0] = py::float_(std::sqrt(s.sumsq));
  r[1] = py::float_(s.lo);
  r[2] = py::float_(s.hi);
  r[3] = py::float_(static_cast<double>(s.nonzero));
  if (check_nan) {
    r[4] = py::float_(static_cast<double>(s.nan));
    r[5] = py::float_(static_cast<double>(s.inf));
  }
  return std::move(r);
}

// The parameters' gradients in the layout of _grads._cpu_values: the k norms, then with
// `full` k minima, k maxima, k non-zero counts, k sums and k (population) variances.  None if one of them is not
// readable here (the torch path then takes them all).
py::object grads_stats(const std::vector<at::Tensor>& ts, bool full) {
  for (const at::Tensor& t : ts) {
    if (!readable(t) || t.numel() == 0) {
      return py::none();
    }
  }
  const size_t k = ts.size();
  std::vector<Part> parts(k);
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < k; ++i) {
      parts[i] = reduce(ts[i], full ? kFull : kNorm);
    }
  }
  py::list out(full ? 6 * k : k);
  for (size_t i = 0; i < k; ++i) {
    Part& s = parts[i];
    out[i] = py::float_(std::sqrt(s.sumsq));
    if (full) {
      nan_extremes(s);
      out[k + i] = py::float_(s.lo);
      out[2 * k + i] = py::float_(s.hi);
      out[3 * k + i] = py::float_(static_cast<double>(s.nonzero));
      out[4 * k + i] = py::float_(s.sum);
      out[5 * k + i] = py::float_(variance(s, static_cast<double>(ts[i].numel())));
    }
  }
  return std::move(out);
}

// ------------------------------------------------------------------ the parameters' gradients
// At every step boundary, from the parameters themselves (the watch's list, None where one is
// gone): reading `.grad`, checking it and building the columns in Python costs ~2 us a
// parameter, as much as the statistics of a small gradient.

// The columns of _grads.GradRead for every parameter of `params` (GradStats: norm, nan, inf,
// none, then with `full` max_abs, mean, std, zero_frac), or None where a gradient is not
// readable here (the torch path then takes them all).  Sparse and empty gradients have no
// statistics, as there; NaN/Inf are counted (a second pass) only in a gradient whose norm is
// not finite.
py::object param_grads(const py::list& params, bool full) {
  const size_t n = params.size();
  std::vector<at::Tensor> gl;
  std::vector<size_t> at_idx;
  py::list none;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor* p = tensor_at(params[i]);
    if (p == nullptr) continue;
    if (!p->is_leaf()) return py::none();  // reading a non-leaf's .grad warns: the Python path's call
    const at::Tensor& g = p->grad();
    if (!g.defined()) {
      // an empty parameter (a rank's empty shard under FSDP's use_orig_params) has no gradient to get
      if (p->requires_grad() && p->numel() > 0) none.append(py::int_(i));
      continue;
    }
    if (g.numel() == 0) continue;
    // a sparse gradient (Embedding(sparse=True)) is read by the Python path, from its coalesced values
    if (g.layout() != c10::kStrided || !readable(g)) return py::none();
    gl.push_back(g);
    at_idx.push_back(i);
  }
  const size_t k = gl.size();
  std::vector<Part> parts(k);
  {
    py::gil_scoped_release nogil;
    for (size_t j = 0; j < k; ++j) parts[j] = reduce(gl[j], full ? kFull : kNorm);
  }
  py::list norm(n), nan(n), inf(n), max_abs(n), mean(n), std_(n), zero_frac(n);
  for (size_t i = 0; i < n; ++i) {
    norm[i] = py::none();
    nan[i] = py::int_(0);
    inf[i] = py::int_(0);
    if (full) {
      max_abs[i] = py::none();
      mean[i] = py::none();
      std_[i] = py::none();
      zero_frac[i] = py::none();
    }
  }
  for (size_t j = 0; j < k; ++j) {
    Part& s = parts[j];
    const size_t i = at_idx[j];
    const double l2 = std::sqrt(s.sumsq);
    norm[i] = py::float_(l2);
    if (full) {  // as _grads._full_columns computes them, the variance from the shifted sums
      nan_extremes(s);
      const double numel = static_cast<double>(gl[j].numel());
      max_abs[i] = py::float_(std::isnan(s.lo) || std::isnan(s.hi) ? std::numeric_limits<double>::quiet_NaN()
                                                         : std::max(std::abs(s.lo), std::abs(s.hi)));
      mean[i] = py::float_(s.sum / numel);
      zero_frac[i] = py::float_(1.0 - static_cast<double>(s.nonzero) / numel);
      if (numel > 1 && std::isfinite(l2)) {
        std_[i] = py::float_(std::sqrt(variance(s, numel) * numel / (numel - 1)));
      } else if (numel == 1) {
        std_[i] = py::float_(std::numeric_limits<double>::quiet_NaN());
      }
    }
    if (!std::isfinite(l2)) {
      Part c;
      {
        py::gil_scoped_release nogil;
        c = reduce(gl[j], kFullNan);
      }
      nan[i] = py::int_(c.nan);
      inf[i] = py::int_(c.inf);
      if (full) std_[i] = py::float_(std::numeric_limits<double>::quiet_NaN());
    }
  }
  py::dict out;
  out["norm"] = norm;
  out["nan"] = nan;
  out["inf"] = inf;
  out["none"] = none;
  if (full) {
    out["max_abs"] = max_abs;
    out["mean"] = mean;
    out["std"] = std_;
    out["zero_frac"] = zero_frac;
  }
  return std::move(out);
}

// Whether a contiguous buffer of `n` values holds a non-zero one: any bit set besides the sign
// (-0.0 is zero, a NaN is not), blocks OR-ed without a branch per value.
template <typename U>
bool any_bits(const void* data, int64_t n, U mask) {
  const U* p = static_cast<const U*>(data);
  constexpr int64_t kStep = 4096;
  for (int64_t i = 0; i < n; i += kStep) {
    U acc = 0;
    const int64_t e = std::min(n, i + kStep);
    for (int64_t j = i; j < e; ++j) acc |= p[j];
    if (acc & mask) return true;
  }
  return false;
}

bool any_nonzero(const at::Tensor& g) {
  const void* d = g.const_data_ptr();
  const int64_t n = g.numel();
  switch (g.element_size()) {
    case 2: return any_bits<uint16_t>(d, n, 0x7fffu);
    case 4: return any_bits<uint32_t>(d, n, 0x7fffffffu);
    default: return any_bits<uint64_t>(d, n, 0x7fffffffffffffffull);
  }
}

// _grads.nonzero_grads of readable gradients: (indices whose .grad holds a non-zero, all
// .grad None, all None or zero), or None where the torch path must look.
py::object grads_nonzero(const py::list& params) {
  std::vector<at::Tensor> gl;
  std::vector<size_t> at_idx;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor* p = tensor_at(params[i]);
    if (p == nullptr) continue;
    if (!p->is_leaf()) return py::none();
    if (!p->requires_grad()) continue;  // frozen: no backward adds to what its .grad holds
    const at::Tensor& g = p->grad();
    if (!g.defined()) continue;
    if (g.is_sparse()) return py::none();  // the torch path counts a sparse gradient's rows
    if (g.numel() == 0) continue;
    if (!readable(g)) return py::none();
    gl.push_back(g);
    at_idx.push_back(i);
  }
  if (gl.empty()) return py::make_tuple(py::list(), true, true);
  std::vector<char> flags(gl.size());
  {
    py::gil_scoped_release nogil;
    for (size_t j = 0; j < gl.size(); ++j) flags[j] = any_nonzero(gl[j]);
  }
  py::list nonzero;
  for (size_t j = 0; j < gl.size(); ++j) {
    if (flags[j]) nonzero.append(py::int_(at_idx[j]));
  }
  const bool all_zero = nonzero.empty();
  return py::make_tuple(nonzero, false, all_zero);
}

// ------------------------------------------------------------------ module outputs' gradients
// A captured step's module outputs get a C++ pre-hook on their grad_fn (at the output's
// index) that takes the statistics as the gradient arrives -- no Python call at registration
// (Tensor.register_hook / Node.register_prehook cost 8-25 us each, ~40 a transformer step) nor
// in the backward.  The values wait here, by (epoch, slot), until the step's end takes them.
using Row = std::array<double, 6>;  // norm, min, max, non-zeros, NaNs, Infs
std::mutex g_act_mu;
std::vector<std::pair<std::pair<int64_t, int64_t>, Row>> g_act;  // ((epoch, slot), row)

struct ActHook : torch::autograd::FunctionPreHook {
  int64_t epoch, slot;
  size_t output_nr;
  ActHook(int64_t e, int64_t s, size_t k) : epoch(e), slot(s), output_nr(k) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (output_nr >= grads.size() || !grads[output_nr].defined()) return grads;
    try {
      at::Tensor g = grads[output_nr];
      if (!readable(g) && g.device().type() == c10::DeviceType::CPU && g.layout() == c10::kStrided) {
        g = g.contiguous();  // an expanded or transposed gradient: read a copy
      }
      if (!readable(g) || g.numel() == 0) return grads;
      Part s = reduce(g, kFullNan);  // NaN/Inf counts come at no extra pass here
      nan_extremes(s);
      Row row{std::sqrt(s.sumsq), s.lo, s.hi, static_cast<double>(s.nonzero), static_cast<double>(s.nan),
              static_cast<double>(s.inf)};
      std::lock_guard<std::mutex> lock(g_act_mu);
      if (g_act.size() < (1u << 16)) g_act.emplace_back(std::make_pair(epoch, slot), row);
    } catch (...) {
      // never into the user's backward: this module's statistics are missing, nothing else
    }
    return grads;
  }

  // compiled autograd collects hooks through this: ours is left out of its graph (the
  // statistics are missing) rather than failing the user's backward
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {}
};

// Hooks tensor `t`'s node for the statistics of the gradient reaching it; False where the
// Python hook must do it (not a CPU floating tensor, or no node).
bool watch_grad(const at::Tensor& t, int64_t epoch, int64_t slot) {
  if (!t.defined() || t.device().type() != c10::DeviceType::CPU || !at::isFloatingType(t.scalar_type()) ||
      !readable(t)) {
    return false;
  }
  const auto& fn = t.grad_fn();
  if (!fn) return false;
  fn->add_pre_hook(std::make_unique<ActHook>(epoch, slot, static_cast<size_t>(t.output_nr())));
  return true;
}

// The rows of `epoch` as [(slot, (norm, min, max, non-zeros, NaNs, Infs))]; forgets every row
// of that epoch and older.
py::list take_grads(int64_t epoch) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, Row>> rows;
  {
    std::lock_guard<std::mutex> lock(g_act_mu);
    std::vector<std::pair<std::pair<int64_t, int64_t>, Row>> keep;
    for (auto& r : g_act) (r.first.first <= epoch ? rows : keep).push_back(r);
    g_act.swap(keep);
  }
  py::list out;
  for (const auto& r : rows) {
    if (r.first.first != epoch) continue;
    const Row& v = r.second;
    out.append(py::make_tuple(r.first.second, py::make_tuple(v[0], v[1], v[2], v[3], v[4], v[5])));
  }
  return out;
}

// ------------------------------------------------------------------ forward outputs reached
// Each root forward's output node gets a C++ pre-hook that marks, by token, that a backward
// reached it (a forward whose graph no backward consumes is P6).  Node.register_prehook and its
// handle's remove() cost ~40 us a step in situ; this, ~1 us.  The marks are a table Python reads
// in place (used_marks): slot token % size holds the token last reached there.  The hook stays
// on the node and dies with the graph; only a graph kept 65,536 tokens later and run again could
// overwrite a newer token's mark.
constexpr int64_t kMarks = 1 << 16;
int64_t g_marks[kMarks];  // 8-byte aligned stores: whole, from whichever thread runs the node

struct UsedHook : torch::autograd::FunctionPreHook {
  int64_t token;
  explicit UsedHook(int64_t t) : token(t) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    g_marks[token & (kMarks - 1)] = token;
    return grads;
  }

  // compiled autograd collects the hooks of the nodes its backward runs, every backward: this
  // node is reached, so it is marked here (the hook itself stays out of the compiled graph)
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    g_marks[token & (kMarks - 1)] = token;
  }
};

// Hooks tensor `t`'s node; False where it has none.
bool watch_used(const at::Tensor& t, int64_t token) {
  if (!t.defined()) return false;
  const auto& fn = t.grad_fn();
  if (!fn) return false;
  g_marks[token & (kMarks - 1)] = 0;
  fn->add_pre_hook(std::make_unique<UsedHook>(token));
  return true;
}

// The marks, as a read-only int64 memoryview over the table (made once by the caller).
py::memoryview used_marks() {
  return py::memoryview::from_buffer(g_marks, {kMarks}, {static_cast<py::ssize_t>(sizeof(int64_t))}, true);
}

}  // namespace

void register_stats(py::module& m) {
  m.def("tensor_stats", &tensor_stats);
  m.def("grads_stats", &grads_stats);
  m.def("param_grads", &param_grads);
  m.def("grads_nonzero", &grads_nonzero);
  m.def("watch_grad", &watch_grad);
  m.def("take_grads", &take_grads);
  m.def("watch_used", &watch_used);
  m.def("used_marks", &used_marks);
}
