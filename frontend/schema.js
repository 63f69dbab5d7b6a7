// Field names the dashboard reads, per event kind; mirrors capture/schema.py.
// tests/browser/test_dashboard_schema.py parses this file as text and checks every name
// here exists in the Python TypedDict of the same kind, so a rename there fails a test.
export const FIELDS = {
  session: ["kind", "session_id", "name", "started_at", "rank", "world_size", "mode", "model", "modules", "params", "torch_version", "device", "script", "settings"],
  ModuleInfo: ["path", "type", "n_params", "training", "extra_repr"],
  ParamInfo: ["name", "module", "shape", "dtype", "numel", "nbytes", "requires_grad"],
  step: ["kind", "step", "rank", "t", "duration_us", "forward_us", "backward_us", "loss", "losses", "graph_captured", "graph_signature", "grads", "activation_grads", "activations", "memory"],
  ActivationGrad: ["module", "norm", "max_abs", "zero_frac", "nan", "inf", "calls"],
  ActivationStats: ["module", "norm", "rms", "min", "max", "zero_frac", "numel", "nan", "inf", "calls"],
  GradStats: ["norm", "max_abs", "mean", "std", "zero_frac", "nan", "inf", "none", "clip"],
  ClipInfo: ["norm", "max_norm", "norm_type"],
  MemoryStats: ["params", "grads", "optimizer", "saved", "temporaries", "kept", "live", "peak", "device"],
  graph: ["kind", "step", "rank", "micro", "complete", "shed_ops", "ops", "tensors", "nodes", "edges", "root", "memory_timeline"],
  OpRecord: ["id", "name", "module", "call", "phase", "micro", "grad_mode", "inputs", "outputs", "inplace", "src", "dur_us", "alloc", "free", "live", "flags"],
  TensorMeta: ["id", "shape", "dtype", "device", "requires_grad", "is_leaf", "stride", "storage", "offset", "nbytes", "param", "grad_fn"],
  NodeRecord: ["id", "name", "param", "module", "op", "saved", "saved_bytes", "order", "dur_us", "higher_order", "autocast_cast", "made_nonfinite", "checkpointed", "attrs"],
  SavedTensor: ["name", "shape", "dtype", "nbytes", "storage", "offset", "stride"],
  end: ["kind", "status", "steps", "message"],
  Finding: ["code", "severity", "title", "message", "fix", "steps", "since", "rank", "targets", "modules", "params", "src", "view"],
  FindingTarget: ["step", "rank", "node", "op", "module", "param"],
};
