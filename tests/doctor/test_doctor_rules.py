"""Each rule on hand-written event lists: fires on the fact, stays silent without it, never raises."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from doctor_events import clean_run, codes, grads, session, step

from torchscope.doctor import SETTING_HELP, Settings, diagnose
from torchscope.doctor.finding import describe_steps
from torchscope.doctor.rules import RULES


def only(findings: list[Any], code: str) -> dict[str, Any]:
    hits = [f for f in findings if f["code"] == code]
    assert len(hits) == 1, f"expected one {code}, got {[(f['code'], f['message']) for f in findings]}"
    return hits[0]


# ---------------------------------------------------------------- engine, settings, wording
def test_clean_run_has_no_findings() -> None:
    assert diagnose(clean_run()) == []


def test_every_pitfall_has_a_rule_and_every_setting_is_documented() -> None:
    assert [c for c, _ in RULES] == [f"P{i}" for i in range(1, 19)]
    assert {f.name for f in dataclasses.fields(Settings)} == set(SETTING_HELP)


def test_settings_overrides_parse_strings_and_reject_unknown() -> None:
    s = Settings.from_overrides({"explode_factor": "1e4", "min_steps": "5", "memory_growth_bytes": "1e6"})
    assert (s.explode_factor, s.min_steps, s.memory_growth_bytes) == (1e4, 5, 1_000_000)
    assert Settings.from_overrides(None) == Settings()
    with pytest.raises(ValueError, match="unknown doctor setting 'nope'"):
        Settings.from_overrides({"nope": "1"})
    with pytest.raises(ValueError, match="needs a number"):
        Settings.from_overrides({"min_steps": "many"})


def test_describe_steps() -> None:
    assert describe_steps([3], 9) == "at step 3"
    assert describe_steps([3, 4, 5, 6, 7, 8, 9], 9) == "since step 3, every step"
    assert describe_steps([3, 4, 5], 9) == "steps 3-5"
    assert describe_steps([1, 3, 9], 9) == "on 3 steps (1, 3, 9)"


@pytest.mark.parametrize("junk", [
    [{"kind": "step"}],
    [{"kind": "step", "step": "x", "grads": "nope", "forwards": [1, None], "memory": []}],
    [session(), {"kind": "step", "step": 0, "grads": {"none": ["a", None], "pre_nonzero": [None], "norm": ["x"]}}],
    [session(), {"kind": "graph", "step": 0, "ops": [{"id": "z", "inputs": None, "flags": "nan"}], "root": 9,
                 "nodes": [None, {"id": 1}], "edges": [[1], "x"]}],
    [{"kind": "log", "level": "error"}, {"kind": "end", "status": "error", "message": None}, {"x": 1}, 7],
    [session(), step(0, scaler={"scale": "big", "skipped": "yes"}, hooks={"a": "b"}, events=[1, {"what": None}])],
])
def test_malformed_events_never_raise(junk: list[Any]) -> None:
    for _, rule in RULES:  # the rules themselves, not only diagnose's safety net
        from torchscope.doctor.run import split_by_rank
        for run in split_by_rank(junk):
            assert isinstance(rule(run, Settings()), list)


def test_findings_carry_rank_and_sort_errors_first() -> None:
    events = [session(), *[step(i, grads=grads(pre_nonzero=[0] if i else [])) for i in range(4)],
              {**session(), "rank": 1}, *[{**step(i, forwards=[{"built_graph": True, "backward": False}]), "rank": 1}
                                          for i in range(2)]]
    found = diagnose(events)
    assert [(f["code"], f["rank"]) for f in found] == [("P5", 0), ("P6", 1)]


# ---------------------------------------------------------------- P1 cut path, P9 non-differentiable
def _detach_graph(s: int) -> dict[str, Any]:
    return {"kind": "graph", "step": s, "rank": 0, "root": 0,
            "tensors": [{"id": 0, "param": "enc.weight"}, {"id": 1}, {"id": 2}, {"id": 3},
                        {"id": 4, "param": "head.weight"}, {"id": 5}, {"id": 6}, {"id": 7, "param": "enc.bias"}],
            "ops": [{"id": 0, "name": "aten::addmm", "module": "enc", "inputs": [7, 1, 0], "outputs": [2],
                     "grad_mode": True, "phase": "forward", "src": "net.py:10"},
                    {"id": 1, "name": "torch::Tensor.detach", "module": "", "inputs": [2], "outputs": [],
                     "grad_mode": True, "flags": ["breaks_graph"], "phase": "forward", "src": "net.py:11"},
                    {"id": 2, "name": "aten::detach", "module": "", "inputs": [2], "outputs": [3], "grad_mode": True},
                    {"id": 3, "name": "aten::addmm", "module": "head", "inputs": [3, 4], "outputs": [5],
                     "grad_mode": True},
                    {"id": 4, "name": "aten::mse_loss", "module": "", "inputs": [5], "outputs": [6],
                     "grad_mode": True}],
            "nodes": [{"id": 0, "name": "MseLossBackward0", "op": 4}, {"id": 1, "name": "AddmmBackward0", "op": 3},
                      {"id": 2, "name": "AccumulateGrad", "param": "head.weight"}],
            "edges": [[0, 1, 0], [1, 2, 0]]}


def test_p1_points_at_the_parameter_and_the_op_where_its_path_breaks() -> None:
    events = [session(), *[step(i, grads=grads(none=[0, 1], norm=[None, None, 1.0, 1.0])) for i in range(5)],
              _detach_graph(0)]
    f = only(diagnose(events), "P1")
    assert f["severity"] == "error" and f["steps"] == [0, 1, 2, 3, 4] and f["since"] == 0
    assert f["params"] == ["enc.weight", "enc.bias"] and f["modules"] == ["enc"]
    assert f["targets"][0] == {"step": 0, "rank": 0, "op": 1, "module": ""}
    assert {"param": "enc.weight", "module": "enc"}.items() <= f["targets"][1].items()
    assert "Tensor.detach()" in f["message"] and "torch::" not in f["message"] and f["src"] == "net.py:11"
    assert "since step 0, every step" in f["message"]


def test_p1_a_layer_the_forward_never_uses_gets_its_own_fix() -> None:
    """enc is never read by any op of the captured graph (defined, never called): not a cut
    path, so the fix is to call it or remove it, not the detach/no_grad advice."""
    g = _detach_graph(0)
    g["ops"] = [op | {"inputs": [1, 4]} if op["id"] == 3 else op for op in g["ops"] if op["id"] in (3, 4)]
    events = [session(), *[step(i, grads=grads(none=[0, 1], norm=[None, None, 1.0, 1.0])) for i in range(4)], g]
    f = only(diagnose(events), "P1")
    assert "the forward never used them" in f["message"] and "Call the layer in forward()" in f["fix"]
    assert ".detach()" not in f["fix"]


def test_p1_reads_no_break_from_a_step_where_the_parameter_had_a_gradient() -> None:
    """The only captured graph is step 0's, where enc got its gradient; enc got none at step 3
    (an idle expert): the finding says its path was cut, and names no op of step 0."""
    g = _detach_graph(0)
    g["ops"] = [op for op in g["ops"] if op["id"] not in (1, 2)]
    g["ops"][1] = g["ops"][1] | {"inputs": [2, 4]}  # head reads enc's output: nothing cut
    events = [session(), step(0), step(1), step(2), step(3, grads=grads(none=[0, 1], norm=[None, None, 1.0, 1.0])), g]
    f = only(diagnose(events), "P1")
    assert f["steps"] == [3] and f["severity"] == "warning" and "aten::" not in f["message"]
    assert "got no gradient on 1 of 4 steps each (step 3) and one on the others" in f["message"]
    assert "never received" not in f["message"]


def _layer_drop_events(cut: bool) -> list[dict[str, Any]]:
    """enc gets a gradient on steps 0 and 2; on steps 1 and 3 (graph captured at 1) the forward
    skips it (``cut`` False: head reads the input directly) or detaches its output (``cut``)."""
    g = _detach_graph(1)
    if not cut:
        g["ops"] = [op | {"inputs": [1, 4]} if op["id"] == 3 else op for op in g["ops"] if op["id"] in (3, 4)]
    none = grads(none=[0, 1], norm=[None, None, 1.0, 1.0])
    return [session(), step(0), step(1, grads=none), step(2), step(3, grads=none), g]


def test_p1_a_parameter_the_forward_uses_on_some_steps_only_is_a_path_chosen_per_step() -> None:
    """Layer drop, early exit, an idle expert: no gradient on the steps whose forward did not
    use the parameter, one on the others -- by design (info), not 'never received'."""
    f = only(diagnose(_layer_drop_events(cut=False)), "P1")
    assert f["severity"] == "info" and f["steps"] == [1, 3] and f["params"] == ["enc.weight", "enc.bias"]
    assert "got no gradient on 2 of 4 steps each (steps 1, 3) and one on the others" in f["message"]
    assert "did not use them on those steps" in f["message"] and "never" not in f["message"]
    cut = only(diagnose(_layer_drop_events(cut=True)), "P1")  # used on those steps but cut there: a bug
    assert cut["severity"] == "error" and "to the loss break" in cut["message"] and "at Tensor.detach()" in cut["message"]
    assert "got no gradient on 2 of 4 steps each" in cut["message"]


def test_p1_no_gradient_on_steps_of_a_structure_it_had_one_in_is_a_path_chosen_per_step() -> None:
    """No graph of a step without the gradient (default mode captured another): where those
    steps built the structure (graph_signature) of steps that gave the parameter a gradient,
    another module of the same shape ran in its place (a routed expert) -- info, as when the
    graph shows it; a structure of their own (a cut changes what the loss reaches) stays a warning."""
    none = grads(none=[0, 1], norm=[None, None, 1.0, 1.0])
    routed = [session(), *[step(i, graph_signature="moe", **({"grads": none} if i % 2 else {})) for i in range(6)]]
    f = only(diagnose(routed), "P1")
    assert f["severity"] == "info" and "same structure as on the others" in f["message"]
    own = [session(), *[step(i, **({"grads": none, "graph_signature": "cut"} if i % 2 else {"graph_signature": "moe"}))
                        for i in range(6)]]
    assert only(diagnose(own), "P1")["severity"] == "warning"


def test_p1_no_grad_forward_points_at_the_op_run_without_grad() -> None:
    g = _detach_graph(0)
    g["ops"] = [g["ops"][0] | {"grad_mode": False}, *g["ops"][2:]]
    f = only(diagnose([session(), step(0, grads=grads(none=[0, 1])), g]), "P1")
    assert f["targets"][0]["op"] == 0 and "torch.no_grad()" in f["message"]


def test_p1_silent_when_backward_failed_or_grads_present() -> None:
    failed = step(0, grads=grads(none=[0, 1, 2, 3]), backward_errors=["Trying to backward through the graph a "
                                                                        "second time"])
    assert "P1" not in codes(diagnose([session(), failed]))
    # no graph (mode='light'): an unused parameter, a cut path and a gradient cleared after
    # backward look alike, and all three are named (a warning: none is known)
    light = only(diagnose([session(), *[step(i, grads=grads(none=[0, 1], norm=[None, None, 1.0, 1.0])) for i in range(3)]]), "P1")
    assert "had no gradient at optimizer.step()" in light["message"] and "never received" not in light["message"]
    assert "never uses them, the path to the loss is cut, or .grad was cleared" in light["message"]
    assert light["severity"] == "warning"
    assert "P1" not in codes(diagnose([session(), step(0), _detach_graph(0)]))


def _threshold_graph(s: int, metric_only: bool = False) -> dict[str, Any]:
    ops = [{"id": 0, "name": "aten::addmm", "module": "pos", "inputs": [0, 1], "outputs": [2], "grad_mode": True},
           {"id": 1, "name": "aten::gt", "module": "", "inputs": [2], "outputs": [3], "grad_mode": True,
            "flags": ["non_differentiable"], "src": "train.py:30"},
           {"id": 2, "name": "aten::_to_copy", "module": "", "inputs": [3], "outputs": [4], "grad_mode": True},
           {"id": 3, "name": "aten::mse_loss", "module": "", "inputs": [4, 9], "outputs": [5], "grad_mode": True},
           {"id": 4, "name": "aten::mse_loss", "module": "", "inputs": [2, 9], "outputs": [6], "grad_mode": True},
           {"id": 5, "name": "aten::add", "module": "", "inputs": [6] if metric_only else [5, 6], "outputs": [7],
            "grad_mode": True}]
    return {"kind": "graph", "step": s, "rank": 0, "root": 0, "ops": ops,
            "nodes": [{"id": 0, "name": "AddBackward0", "op": 5}, {"id": 1, "name": "MseLossBackward0", "op": 4}],
            "edges": [[0, 1, 0]]}


def test_p9_points_at_the_first_non_differentiable_op_feeding_the_loss() -> None:
    f = only(diagnose([session(), step(0), step(1), _threshold_graph(0), _threshold_graph(1)]), "P9")
    assert f["severity"] == "error" and f["steps"] == [0, 1]
    assert f["targets"] == [{"step": 0, "rank": 0, "op": 1, "module": ""}] and f["src"] == "train.py:30"
    assert "aten::gt" in f["message"]


def test_p9_silent_for_a_metric_that_does_not_feed_the_loss() -> None:
    assert "P9" not in codes(diagnose([session(), step(0), _threshold_graph(0, metric_only=True)]))


def test_p9_loss_without_grad_fn_error() -> None:
    ev = step(0, backward_errors=["element 0 of tensors does not require grad and does not have a grad_fn"])
    assert "P9" in codes(diagnose([session(), ev]))


# ---------------------------------------------------------------- P2 dead, P3 norms, P4 NaN
def test_p2_dead_branch_names_its_modules() -> None:
    dead = grads(zero_frac=[1.0, 1.0, 0.1, 0.0], norm=[0.0, 0.0, 1.0, 1.0])
    f = only(diagnose([session(), *[step(i, grads=dead) for i in range(4)]]), "P2")
    assert f["message"].startswith("Gradient reaching enc.weight, enc.bias is 99%+ exact zeros")
    assert f["modules"] == ["enc"] and f["params"] == ["enc.weight", "enc.bias"] and f["severity"] == "warning"
    assert f["view"] == "gradients" and f["steps"] == [0, 1, 2, 3]


def test_p2_silent_for_embeddings_short_blips_and_all_zero_steps() -> None:
    emb = session(modules=[("", "Net"), ("enc", "Embedding"), ("head", "Linear")])
    sparse = grads(zero_frac=[0.995, 1.0, 0.0, 0.0])
    assert "P2" not in codes(diagnose([emb, *[step(i, grads=sparse) for i in range(4)]]))
    blip = [step(i, grads=grads(zero_frac=[1.0, 0, 0, 0]) if i == 2 else grads()) for i in range(6)]
    assert "P2" not in codes(diagnose([session(), *blip]))
    everything = grads(zero_frac=[1.0] * 4, norm=[0.0] * 4)
    assert "P2" not in codes(diagnose([session(), *[step(i, grads=everything) for i in range(4)]]))
    # the same with the gradients known to be None before each backward and a loss that is not 0:
    # nothing reaches the model (a zeroing zero_grad cannot explain it)
    none_before = [step(i, grads=everything, zero_grad_set_to_none=True) for i in range(4)]
    assert [f["title"] for f in diagnose([session(), *none_before])] == ["No gradient reaches the model"]
    zero_loss = [step(i, grads=everything, zero_grad_set_to_none=True, loss=0.0, losses=[0.0]) for i in range(4)]
    assert "P2" not in codes(diagnose([session(), *zero_loss]))


def test_p3_exploding_norm_over_steps() -> None:
    norms = [1.0, 1.2, 0.9, 1.1, 50.0, 4000.0, 3e5]
    events = [session(), *[step(i, grads=grads(norm=n)) for i, n in enumerate(norms)]]
    f = only(diagnose(events), "P3")
    assert f["steps"] == [5, 6] and "exploded" in f["message"] and f["data"]["norm"][-1] == pytest.approx(6e5)


def test_p3_a_steady_divergence_is_told_when_it_starts() -> None:
    """A learning rate past the stability limit: the norm grows 1.4x and the loss 2x at every
    step.  Against the median of all earlier steps (which rises with the run) the explosion
    shows only after 40 steps; told as a divergence, it starts at step 0, is reported from step 7 on
    (eight steps of growth) and names no exploding layer it cannot know."""
    events = [session(), *[step(i, grads=grads(norm=1.4 ** i), loss=2.0 ** i, losses=[2.0 ** i]) for i in range(50)]]
    f = only(diagnose(events), "P3")
    assert f["message"].startswith("Training is diverging: the gradient norm grew at every step from step 0 to step 7")
    assert f["steps"][0] == 0 and "exploded past 1000x its usual level at step" in f["message"]
    assert "Lower the learning rate" in f["fix"]
    # the same gradients with a falling loss (a warm-up, a curriculum): no divergence
    healthy = [session(), *[step(i, grads=grads(norm=1.4 ** (i % 12)), loss=1 / (i + 1), losses=[1 / (i + 1)])
                            for i in range(40)]]
    assert "P3" not in codes(diagnose(healthy))


def test_p3_exploding_names_the_layer_that_jumped() -> None:
    """The step an explosion starts, the layer whose norm jumped over its own history is named
    (here head.weight: 1e4x its usual 0.1, while the others hardly moved)."""
    usual = [0.1, 0.1, 0.1, 0.1]
    jump = [0.2, 0.1, 1000.0, 0.3]
    events = [session(), *[step(i, grads=grads(norm=usual)) for i in range(5)], step(5, grads=grads(norm=jump))]
    f = only(diagnose(events), "P3")
    assert f["steps"] == [5] and f["params"] == ["head.weight"] and f["modules"] == ["head"]
    assert f["targets"] == [{"step": 5, "rank": 0, "param": "head.weight", "module": "head"}]
    assert "jumped most in head.weight (10000x)" in f["message"]


def test_p3_vanishing_layer_by_layer() -> None:
    params = [(f"l{i}.weight", f"l{i}", [32, 32]) for i in range(4)]
    mods = [("", "Net"), *[(f"l{i}", "Linear") for i in range(4)]]
    per_layer = grads(n=4, norm=[1e-9, 1e-6, 1e-3, 1.0])
    f = only(diagnose([session(params, mods), *[step(i, grads=per_layer) for i in range(3)]]), "P3")
    assert f["params"] == ["l0.weight", "l3.weight"] and f["targets"][0]["param"] == "l0.weight"
    healthy = grads(n=4, norm=[0.2, 0.5, 1.0, 3.0])
    assert diagnose([session(params, mods), *[step(i, grads=healthy) for i in range(3)]]) == []


def test_p3_attention_query_and_key_weights_are_not_vanishing() -> None:
    """A fresh transformer: each block's attention query and key weights get gradients 1e-5 the
    size of the others' (they only act through the attention scores), at every depth.  Not
    P3 -- whereas the same sizes shrinking block by block from the loss back are."""
    kinds = ["query", "key", "value", "out", "ffn_in", "ffn_out"]
    params = [(f"b{b}.{k}.weight", f"b{b}.{k}", [16, 16]) for b in range(3) for k in kinds]
    params.append(("head.weight", "head", [16, 16]))
    mods = [("", "Net"), *[(m, "Linear") for _, m, _ in params]]
    per_block = [1e-5, 1e-5, 1.0, 1.0, 1.0, 1.0]
    flat = grads(n=len(params), norm=[*per_block * 3, 1.0])
    assert "P3" not in codes(diagnose([session(params, mods), *[step(i, grads=flat) for i in range(3)]]))
    shrinking = grads(n=len(params), norm=[*(v * 1e-3 ** (2 - b) for b in range(3) for v in per_block), 1.0])
    f = only(diagnose([session(params, mods), *[step(i, grads=shrinking) for i in range(3)]]), "P3")
    assert f["params"] == ["b0.query.weight", "head.weight"]


def test_p3_thresholds_are_settings() -> None:
    norms = [1.0, 1.0, 1.0, 1.0, 200.0]
    events = [session(), *[step(i, grads=grads(norm=n)) for i, n in enumerate(norms)]]
    assert "P3" not in codes(diagnose(events))
    assert "P3" in codes(diagnose(events, Settings.from_overrides({"explode_factor": "100"})))


def test_p4_points_at_the_first_op_that_produced_nan() -> None:
    g = {"kind": "graph", "step": 2, "rank": 0,
         "ops": [{"id": 0, "name": "aten::std", "module": "norm", "outputs": [0]},
                 {"id": 1, "name": "aten::div", "module": "norm", "flags": ["nan"], "src": "m.py:9",
                  "inputs": [0], "outputs": [1]},
                 {"id": 2, "name": "aten::addmm", "module": "head", "flags": ["nan"], "inputs": [1], "outputs": [2]}]}
    bad = grads(nan=[32, 8, 8, 1])
    events = [session(), step(0), step(1), step(2, loss=math.nan, losses=[math.nan], grads=bad), g]
    f = only(diagnose(events), "P4")
    assert f["steps"] == [2] and f["targets"][0] == {"step": 2, "rank": 0, "op": 1, "module": "norm"}
    assert f["src"] == "m.py:9" and "aten::div" in f["message"] and f["severity"] == "error"
    # the loss went NaN at step 0, before any step was checked op by op: the op is caught at
    # step 2, which the message says without claiming the NaN began there
    early = [session(), step(0, loss=math.nan, losses=[math.nan]), step(1, loss=math.nan, losses=[math.nan]),
             step(2, loss=math.nan, losses=[math.nan], grads=bad), g]
    f = only(diagnose(early), "P4")
    assert f["steps"] == [0, 1, 2] and "since step 0, produced by aten::div" in f["message"]
    assert "first produced by" not in f["message"] and "caught at step 2" in f["message"]


def test_p4_blames_the_op_whose_nan_reaches_the_loss_not_an_absorbed_mask() -> None:
    """A causal mask of -inf (flagged) that the softmax reading it absorbs causes nothing; the
    log of a zero probability, whose -inf runs on into the loss, does."""
    ops = [{"id": 0, "name": "aten::full", "module": "attn", "outputs": [0], "flags": ["nan"]},
           {"id": 1, "name": "aten::triu", "module": "attn", "inputs": [0], "outputs": [1], "flags": ["nan"]},
           {"id": 2, "name": "aten::add", "module": "attn", "inputs": [9, 1], "outputs": [2], "flags": ["nan"]},
           {"id": 3, "name": "aten::_softmax", "module": "attn", "inputs": [2], "outputs": [3]},
           {"id": 4, "name": "aten::log", "module": "head", "inputs": [3], "outputs": [4], "flags": ["nan"],
            "src": "m.py:12"},
           {"id": 5, "name": "aten::mean", "module": "", "inputs": [4], "outputs": [5], "flags": ["nan"]}]
    g = {"kind": "graph", "step": 0, "rank": 0, "ops": ops}
    f = only(diagnose([session(), step(0, loss=math.inf, losses=[math.inf]), g]), "P4")
    assert f["targets"][0]["op"] == 4 and "aten::log" in f["message"] and f["src"] == "m.py:12"
    masked_only = {**g, "ops": ops[:4]}  # a healthy step with the mask checked: nothing to say
    assert "P4" not in codes(diagnose([session(), step(0), masked_only]))


def test_p4_does_not_blame_an_op_that_only_read_nan_parameters() -> None:
    """A loss NaN at step 2 (not checked op by op: nothing was non-finite before), the optimizer
    writes NaN into the weights, and step 3's checked capture finds the first NaN at the first op
    that reads a weight: a transpose.  The finding names step 2 and its loss line, not the op."""
    g = {"kind": "graph", "step": 3, "rank": 0,
         "tensors": [{"id": 0, "param": "enc.weight"}, {"id": 1}],
         "ops": [{"id": 0, "name": "aten::t", "module": "enc", "inputs": [0], "outputs": [1], "flags": ["nan"],
                  "src": "m.py:4"}]}
    bad = grads(nan=[32, 8, 8, 1])
    events = [session(), step(0), step(1), step(2, loss=math.nan, losses=[math.nan], grads=bad,
                                                  backward_src=["train.py:33"]), step(3, loss=math.nan, grads=bad), g]
    f = only(diagnose(events), "P4")
    assert f["steps"] == [2, 3] and f["src"] == "train.py:33" and f["view"] == "gradients"
    assert "first appeared at step 2 in the loss" in f["message"] and "not the cause" in f["message"]
    assert all("op" not in t for t in f["targets"]) and f["targets"][0]["param"] == "enc.weight"


def test_p4_names_the_backward_node_that_made_a_nan_from_finite_gradients() -> None:
    """A finite loss with NaN gradients: the checked backward's first node (in execution order)
    that turned finite gradients non-finite is the cause, named with the op it is the gradient of;
    a later node that only received them is not.  Caught on a step after the first bad one, the
    message says both steps."""
    g = {"kind": "graph", "step": 2, "rank": 0,
         "ops": [{"id": 7, "name": "aten::sqrt", "module": "", "src": "m.py:15", "outputs": [3]}],
         "nodes": [{"id": 0, "name": "AddBackward0", "order": 0},
                   {"id": 1, "name": "PowBackward0", "order": 3, "made_nonfinite": True},
                   {"id": 2, "name": "SqrtBackward0", "op": 7, "module": "", "order": 2, "made_nonfinite": True}]}
    bad = grads(nan=[32, 8, 8, 1])
    f = only(diagnose([session(), step(0), step(1), step(2, grads=bad), g]), "P4")
    assert "first produced in the backward at step 2 by SqrtBackward0, the gradient of aten::sqrt" in f["message"]
    assert f["targets"][0] == {"step": 2, "rank": 0, "node": 2, "op": 7, "module": ""} and f["src"] == "m.py:15"
    assert "norm of exactly zero" in f["fix"]
    later = only(diagnose([session(), step(0), step(1, grads=bad), step(2, grads=bad), g]), "P4")
    assert "since step 1, made in the backward by SqrtBackward0" in later["message"]
    assert "at step 2, the first step checked node by node" in later["message"]


def test_p4_silent_on_scaler_skipped_steps_with_finite_loss() -> None:
    ev = step(0, grads=grads(inf=[3, 0, 0, 0]), scaler={"scale": 32768.0, "skipped": True})
    assert "P4" not in codes(diagnose([session(), ev, step(1, scaler={"scale": 32768.0, "skipped": False})]))


# ---------------------------------------------------------------- P5 zero_grad, P6 unused graph, P7 alive
def test_p5_missing_zero_grad_deduplicated_since_step_1() -> None:
    events = [session(), step(0, zero_grad=0), *[step(i, zero_grad=0, grads=grads(pre_nonzero=[0, 1, 2, 3]))
                                                 for i in range(1, 7)]]
    f = only(diagnose(events), "P5")
    assert f["steps"] == [1, 2, 3, 4, 5, 6] and "since step 1, every step" in f["message"]
    assert f["params"] == ["enc.weight", "enc.bias", "head.weight", "head.bias"] and f["severity"] == "error"


def test_p5_zero_grad_between_backward_and_step() -> None:
    events = [session(), *[step(i, grads=grads(none=[0, 1, 2, 3], norm=[None] * 4)) for i in range(3)]]
    found = diagnose(events)
    assert codes(found) == ["P5"] and "between backward() and step()" in found[0]["message"]


def test_p6_evaluation_graph_nobody_used() -> None:
    unused = {"micro": 1, "grad_mode": True, "training": False, "built_graph": True, "backward": False,
              "saved_bytes": 40960, "src": "train.py:40"}
    events = [session(), step(0), *[step(i, forwards=[*step(i)["forwards"], unused]) for i in (1, 3)], step(2)]
    f = only(diagnose(events), "P6")
    assert f["steps"] == [1, 3] and f["src"] == "train.py:40" and f["view"] == "memory"
    assert "40.0 KiB" in f["message"] and "eval mode" in f["message"]
    used = {**unused, "backward": True}
    assert "P6" not in codes(diagnose([session(), step(0, forwards=[used])]))


def test_p6_evaluations_one_after_another_hold_one_graph_at_a_time() -> None:
    """Four evaluation batches in one step, each output replaced by the next: each graph is freed
    as the next forward runs, so what was held is one forward's saved bytes, not their sum."""
    evals = [{"micro": 1 + k, "grad_mode": True, "training": False, "built_graph": True, "backward": False,
              "saved_bytes": 4096, "src": "train.py:40"} for k in range(4)]
    events = [session(), step(0), step(1, forwards=[*step(1)["forwards"], *evals]), step(2)]
    f = only(diagnose(events), "P6")
    assert f["data"]["saved_bytes"] == 4096 and "holding up to 4.0 KiB of saved activations each" in f["message"]


def test_p6_an_evaluation_between_steps_is_told_as_the_step_it_follows() -> None:
    """Evaluations run after the optimizer steps of steps 3 and 7 land in the next steps'
    forwards, before their training forward; one after the last step (11) is in the end event.
    All three are told as the step they follow: 3, 7, 11 -- not 4, 8, 11."""
    ev = {"micro": 0, "grad_mode": True, "training": False, "built_graph": True, "backward": False,
          "saved_bytes": 1024, "src": "train.py:50"}
    events = [session(), *[step(i, forwards=[ev, *step(i)["forwards"]] if i in (4, 8) else step(i)["forwards"])
                           for i in range(12)],
              {"kind": "end", "t": 0.0, "status": "finished", "steps": 12, "forwards": [ev]}]
    f = only(diagnose(events), "P6")
    assert f["steps"] == [3, 7, 11] and "3 forward passes in eval mode" in f["message"]


def test_p6_one_training_forward_without_backward_is_told_not_warned() -> None:
    """A loop that skips a batch before backward (``if torch.isfinite(loss): loss.backward()``)
    leaves one training-mode forward unused: harmless, so info, and no 'torch.no_grad() is missing'."""
    skipped = {"micro": 1, "grad_mode": True, "training": True, "built_graph": True, "backward": False}
    events = [session(), step(0), step(1, forwards=[skipped, *step(1)["forwards"]]), step(2), step(3)]
    f = only(diagnose(events), "P6")
    assert f["severity"] == "info" and f["steps"] == [1] and f["title"] == "Graph built but never used"
    assert "skipped before backward" in f["message"] and "is missing" not in f["message"]
    # from a call site of its own on every step (a GAN's fakes for the critic, ``G(z).detach()``):
    # no evaluation, so no model.eval() in the fix, which would change a training generator
    twice = [session(), *[step(i, forwards=[skipped, *step(i)["forwards"]]) for i in (0, 1)]]
    f = only(diagnose(twice), "P6")
    assert f["severity"] == "info" and f["title"] == "Graph built but never used"
    assert "2 forward passes in training mode" in f["message"] and "model.eval()" not in f["fix"].split(".")[0]
    in_eval = [session(), *[step(i, forwards=[{**skipped, "training": False}, *step(i)["forwards"]]) for i in (0, 1)]]
    assert only(diagnose(in_eval), "P6")["severity"] == "warning"


def test_p6_batches_skipped_at_the_loops_own_call_site_are_told_not_warned() -> None:
    """A loop that catches an error in its loss and skips the batch, several times: training
    forwards from the call site training uses (train.py:18) -- info, not 'no_grad() is missing'.
    An evaluation after the last step (in the end event) is still counted as one."""
    skipped = {"micro": 0, "grad_mode": True, "training": True, "built_graph": True, "backward": False,
               "src": "train.py:18"}
    events = [session(), *[step(i, forwards=[skipped, *step(i)["forwards"]]) for i in (0, 1, 2)]]
    f = only(diagnose(events), "P6")
    assert f["severity"] == "info" and f["steps"] == [0, 1, 2] and "skipped before backward" in f["message"]
    evaluation = {**skipped, "training": False, "src": "train.py:40"}
    end = {"kind": "end", "t": 1.0, "status": "finished", "steps": 3, "forwards": [evaluation]}
    f = only(diagnose([*events, end]), "P6")
    assert f["severity"] == "warning" and f["steps"] == [2] and f["src"] == "train.py:40"
    assert f["message"].startswith("1 forward pass in eval mode")


def test_p7_graphs_alive_growing() -> None:
    events = [session(), *[step(i, graphs_alive=10 * i, memory={"live": 1_000_000 + 1000 * i}) for i in range(6)]]
    f = only(diagnose(events), "P7")
    assert f["steps"] == [1, 2, 3, 4, 5] and f["view"] == "memory" and "up to 50 nodes, at step 5, +10 per step" in f["message"]


def test_p7_silent_for_constant_or_no_alive_graphs() -> None:
    steady = [session(), *[step(i, graphs_alive=12) for i in range(6)]]
    assert "P7" not in codes(diagnose(steady))
    optimizer_state = [session(), *[step(i, memory={"live": 10_000_000 if i else 5_000_000}) for i in range(6)]]
    assert "P7" not in codes(diagnose(optimizer_state))
    # a loop variable holding the latest generator loss (WGAN-GP: two critic steps per generator
    # step): one graph of a steady size every other boundary, a larger trailing one at the end
    alternating = [session(), *[step(i, graphs_alive=20 * (i % 2) if i < 11 else 33) for i in range(12)]]
    assert "P7" not in codes(diagnose(alternating))
    # graphs piling up every other step do grow
    piling = [session(), *[step(i, graphs_alive=20 * (i // 2)) for i in range(12)]]
    assert "P7" in codes(diagnose(piling))
    # ``loss = train_step(x, y)``: the latest loss held from step 1 on, in a short run (4-6
    # steps: the first third was step 0's nothing, and the warning fired)
    for n in range(3, 9):
        held = [session(), *[step(i, graphs_alive=11 if i else 0) for i in range(n)]]
        assert "P7" not in codes(diagnose(held)), n
    leak = [session(), *[step(i, graphs_alive=11 * i) for i in range(4)]]  # history.append(loss)
    assert only(diagnose(leak), "P7")["steps"] == [1, 2, 3]


# ---------------------------------------------------------------- P8 in-place, P10 double backward
INPLACE_MSG = ("one of the variables needed for gradient computation has been modified by an inplace operation: "
               "[torch.FloatTensor [32, 32]], which is output 0 of Sigmoid, is at version 1; expected version 0")


def test_p8_error_points_at_the_backward_node_that_needed_the_value() -> None:
    g = {"kind": "graph", "step": 0, "rank": 0, "root": 0,
         "nodes": [{"id": 0, "name": "MseLossBackward0"}, {"id": 3, "name": "SigmoidBackward0", "module": "act"}]}
    events = [session(), step(0), g, step(1), step(2, backward_errors=[INPLACE_MSG], micro_batches=2)]
    f = only(diagnose(events), "P8")
    assert f["steps"] == [2] and f["targets"] == [{"step": 0, "rank": 0, "node": 3, "module": "act"}]
    assert "SigmoidBackward0" in f["message"]
    assert "P15" not in codes(diagnose(events))  # the failed backward is not a micro-batch


def test_a_backward_error_that_ends_the_run_is_one_crash() -> None:
    """Uncaught, the error is in its step's backward_errors and again in the end event (as
    'RuntimeError: ...'): one crash at one step, not 'since step 1, every step'."""
    events = [session(), step(0), step(1, backward_errors=[INPLACE_MSG]),
              {"kind": "end", "t": 1.0, "status": "error", "steps": 2, "message": f"RuntimeError: {INPLACE_MSG}"}]
    f = only(diagnose(events), "P8")
    assert f["steps"] == [1] and "at step 1" in f["message"]
    later = INPLACE_MSG.replace("[32, 32]", "[8, 8]")  # another tensor's, after the loop caught the first
    other = {"kind": "end", "t": 1.0, "status": "error", "steps": 2, "message": f"RuntimeError: {later}"}
    assert only(diagnose([*events[:-1], other]), "P8")["steps"] == [1, 2]


def test_p8_error_names_the_in_place_op_that_overwrote_a_saved_output() -> None:
    """``out = relu(...); out += x``: ReluBackward0 saved its output, the add_ wrote it.  On the
    failing (captured) step the finding points at the add_ and its line, not the backward call."""
    g = {"kind": "graph", "step": 0, "rank": 0, "root": 0,
         "tensors": [{"id": 0, "storage": 1}, {"id": 1, "storage": 2}, {"id": 2, "storage": 2}],
         "ops": [{"id": 0, "name": "aten::relu", "module": "block", "inputs": [0], "outputs": [1], "phase": "forward"},
                 {"id": 1, "name": "aten::add_", "module": "block", "inputs": [2, 0], "outputs": [2], "phase": "forward",
                  "flags": ["inplace"], "src": "m.py:11"}],
         "nodes": [{"id": 0, "name": "MseLossBackward0"}, {"id": 3, "name": "ReluBackward0", "module": "block", "op": 0}]}
    msg = INPLACE_MSG.replace("output 0 of Sigmoid", "output 0 of ReluBackward0")
    f = only(diagnose([session(), step(0, backward_errors=[msg]), g]), "P8")
    assert f["src"] == "m.py:11" and "aten::add_" in f["message"] and f["targets"][0]["op"] == 1


def test_p8_silent_form_flagged_op() -> None:
    g = {"kind": "graph", "step": 1, "rank": 0,
         "ops": [{"id": 5, "name": "aten::mul_", "module": "block", "flags": ["inplace", "inplace_saved"],
                  "src": "m.py:3"}]}
    f = only(diagnose([session(), step(0), step(1), g]), "P8")
    assert f["targets"][0]["op"] == 5 and f["src"] == "m.py:3"
    # the op run by two forwards of one step (a critic on real and fake): that step, once
    op = {**g["ops"][0], "id": 9}  # type: ignore[index, dict-item]
    twice = {**g, "ops": [*g["ops"], op]}  # type: ignore[list-item]
    f = only(diagnose([session(), step(0), step(1), twice]), "P8")
    assert f["steps"] == [1] and "(0, 0" not in f["message"] and "1, 1" not in f["message"]


def test_p10_double_backward() -> None:
    msg = "Trying to backward through the graph a second time (or directly access saved tensors after they have"
    events = [session(), step(0, backward_src=["rnn.py:40"]), step(1, backward_errors=[msg]), step(2),
              step(3, backward_errors=[msg])]
    f = only(diagnose(events), "P10")
    assert f["steps"] == [1, 3] and f["severity"] == "error" and "rnn.py:40" in f["message"]


# ---------------------------------------------------------------- P11 modes
MODES = [("", "Net"), ("enc", "Linear"), ("drop", "Dropout"), ("bn", "BatchNorm1d"), ("head", "Linear")]


def test_p11_training_in_eval_mode() -> None:
    eval_fwd = [{"grad_mode": True, "training": False, "built_graph": True, "backward": True, "src": "t.py:5"}]
    events = [session(modules=MODES), step(0), step(1), *[step(i, forwards=eval_fwd) for i in range(2, 5)]]
    f = only(diagnose(events), "P11")
    assert f["steps"] == [2, 3, 4] and f["modules"] == [""] and "since step 2" in f["message"]
    sensitive = [path for path, kind in MODES if kind.startswith(("Dropout", "BatchNorm"))]
    assert sensitive and all(repr(p) in f["message"] for p in sensitive)  # where eval mode changes something


def test_p11_evaluating_with_dropout_in_train_mode_and_frozen_bn() -> None:
    fwd = [{"grad_mode": False, "training": True, "train_modules": ["drop", "bn"], "built_graph": False},
           {"grad_mode": True, "training": True, "eval_modules": ["bn", "enc"], "built_graph": True, "backward": True}]
    found = [f for f in diagnose([session(modules=MODES), step(0, forwards=fwd)]) if f["code"] == "P11"]
    assert sorted(f["data"]["mode"] for f in found) == ["eval", "train"]
    by_mode = {f["data"]["mode"]: f for f in found}
    assert by_mode["train"]["modules"] == ["bn", "drop"] and by_mode["eval"]["modules"] == ["bn"]
    # one batch-norm module left in eval: what that changes, said of it alone
    assert "Training while 'bn' (BatchNorm1d) is in eval mode" in by_mode["eval"]["message"]
    assert "batch-norm statistics are frozen" in by_mode["eval"]["message"] and "dropout" not in by_mode["eval"]["message"]


def test_an_evaluation_every_n_steps_has_one_step_number_in_p6_and_p11() -> None:
    """An evaluation after step 4's optimizer.step() is recorded in step 5's event, before its
    trained forward: P6 (no no_grad, in eval mode) and P11 (no_grad, dropout in train mode) both
    tell it as step 4's -- they once said 4 and 5."""
    trained = {"grad_mode": True, "training": True, "built_graph": True, "backward": True}
    p6 = {"grad_mode": True, "training": False, "built_graph": True, "backward": False, "src": "t.py:9"}
    p11 = {"grad_mode": False, "training": True, "train_modules": ["drop"], "built_graph": False}
    for ev, code in ((p6, "P6"), (p11, "P11")):
        events = [session(modules=MODES), *[step(i, forwards=[ev, trained] if i % 5 == 0 and i else [trained])
                                            for i in range(11)]]
        assert only(diagnose(events), code)["steps"] == [4, 9], code


def test_p11_silent_without_mode_sensitive_modules() -> None:
    eval_fwd = [{"grad_mode": True, "training": False, "built_graph": True, "backward": True}]
    assert diagnose([session(), *[step(i, forwards=eval_fwd) for i in range(3)]]) == []


# ---------------------------------------------------------------- P12 copies, P13 hooks, P14 AMP, P15 accumulation
def test_p12_repeated_copies() -> None:
    rep = [{"what": "repeat_copy", "count": 2, "bytes": 139264, "src": "train.py:12"}]
    f = only(diagnose([session(), *[step(i, events=rep) for i in range(4)]]), "P12")
    assert f["steps"] == [0, 1, 2, 3] and f["src"] == "train.py:12" and "136.0 KiB" in f["message"]
    batch_moves = [{"what": "noop_to", "count": 2}]
    assert diagnose([session(), *[step(i, events=batch_moves, copies={"count": 2, "bytes": 4096})
                                  for i in range(4)]]) == []
    # copies counted on steps 0-3 of 8 only (the capture's schedule): repeats on all but the first
    # of them are every step's, and the message says so rather than "steps 1-3" alone
    counted = [step(i, events=rep if i else []) if i < 4 else {k: v for k, v in step(i).items() if k != "copies"}
               for i in range(8)]
    f = only(diagnose([session(), *counted]), "P12")
    assert f["steps"] == [1, 2, 3] and "judging by the steps copies are counted on" in f["message"]


def test_p13_hook_bytes_growing() -> None:
    events = [session(), *[step(i, hooks={"enc": 131072 * (i + 1)}) for i in range(6)]]
    f = only(diagnose(events), "P13")
    assert f["modules"] == ["enc"] and f["targets"][0]["module"] == "enc" and f["view"] == "memory"
    steady = [session(), *[step(i, hooks={"enc": 131072}) for i in range(6)]]
    assert "P13" not in codes(diagnose(steady))


def test_p14_scaler_skipping_every_step() -> None:
    events = [session(), *[step(i, scaler={"scale": 65536.0 / 2 ** (i + 1), "skipped": True}) for i in range(6)]]
    f = only(diagnose(events), "P14")
    assert f["steps"] == [0, 1, 2, 3, 4, 5] and f["data"]["scale"][-1] == 1024.0


def test_p14_a_collapsed_scale_tells_its_skips_from_the_steps_after() -> None:
    """Ten skips halving the scale below min_scale, then steps that run at that scale: the
    skipped steps are those ten; the later ones are said to run at a collapsed scale, not
    counted as skipped (QA round 26 read "skipped 10 of 15 steps (since step 0, every step)")."""
    events = [session(), *[step(i, scaler={"scale": 2.0 / 2 ** i if i < 10 else 2.0 ** -10, "skipped": i < 10})
                           for i in range(15)]]
    f = only(diagnose(events), "P14")
    assert "skipped 10 of 15 optimizer steps (steps 0-9)" in f["message"], f["message"]
    assert "after that its scale stayed below min_scale (since step 10, every step)" in f["message"], f["message"]
    assert f["steps"] == list(range(15))


def test_p14_silent_for_calibration_skips() -> None:
    events = [session(), *[step(i, scaler={"scale": 65536.0 if i < 2 else 32768.0, "skipped": i == 2})
                           for i in range(40)]]
    assert diagnose(events) == []


def _forwards(n: int) -> list[dict[str, Any]]:
    return [{"micro": k, "grad_mode": True, "training": True, "built_graph": True, "backward": True} for k in range(n)]


def test_p15_reads_every_term_of_a_summed_loss() -> None:
    """``ce / k + 0.01 * reg / k`` ends in an add: the captured graph shows each term scaled, and
    the steps of the same structure between captures are judged by it; a sum with one term
    not divided is still a finding."""
    def run(terms: list[str]) -> list[dict[str, Any]]:
        nodes = [{"id": 0, "name": "AddBackward0"}, *[{"id": i + 1, "name": t} for i, t in enumerate(terms)],
                 {"id": 9, "name": "AccumulateGrad", "param": "enc.weight"}]
        edges = [[0, i + 1, i] for i in range(len(terms))] + [[i + 1, 9, 0] for i in range(len(terms))]
        g = {"kind": "graph", "step": 0, "rank": 0, "micro": 0, "root": 0, "nodes": nodes, "edges": edges}
        return [session(), *[step(i, micro_batches=4, backward_roots=["AddBackward0"] * 4, forwards=_forwards(4),
                                  graph_signature="sig", graph_captured=i == 0) for i in range(3)], g]
    assert "P15" not in codes(diagnose(run(["DivBackward0", "MulBackward0"])))
    f = only(diagnose(run(["DivBackward0", "NllLossBackward0"])), "P15")
    assert f["steps"] == [0, 1, 2]


def test_p15_accumulation_without_division() -> None:
    events = [session(), *[step(i, micro_batches=4, backward_roots=["MseLossBackward0"] * 4, forwards=_forwards(4))
                           for i in range(3)]]
    f = only(diagnose(events), "P15")
    assert f["steps"] == [0, 1, 2] and f["data"]["micro_batches"] == [4, 4, 4] and "by 4" in f["message"]
    divided = [session(), *[step(i, micro_batches=4, backward_roots=["DivBackward0"] * 4, forwards=_forwards(4))
                            for i in range(3)]]
    assert diagnose(divided) == []
    # two losses backpropagated through one forward (multi-task): one micro-batch
    one_forward = [session(), *[step(i, micro_batches=2, backward_roots=["MseLossBackward0"] * 2) for i in range(3)]]
    assert diagnose(one_forward) == []
    # LBFGS: every closure pass clears .grad first, so only the last pass reaches the step
    cleared = [session(), *[step(i, micro_batches=5, accumulated=1, forwards=_forwards(5),
                                 backward_roots=["MseLossBackward0"] * 5) for i in range(3)]]
    assert diagnose(cleared) == []


def test_docs_name_every_setting_and_pitfall() -> None:
    from conftest import REPO

    text = (REPO / "docs" / "doctor.md").read_text()
    assert all(f"`{f.name}`" in text for f in dataclasses.fields(Settings))
    assert all(f"| P{i} |" in text for i in range(1, 19))


def test_findings_validate_against_the_schema() -> None:
    import json

    from torchscope.schema import Finding
    from torchscope.validate import _fields_ok  # the project's one walker of the schema's TypedDicts

    events = [session(), *[step(i, zero_grad=0, grads=grads(pre_nonzero=[0] if i else []), graphs_alive=5 * i,
                                hooks={"enc": 1 << (10 + i)}, micro_batches=2, forwards=_forwards(2))
                           for i in range(6)], _detach_graph(0)]
    found = diagnose(events)
    assert len({f["code"] for f in found}) >= 4
    for f in found:
        assert set(f) <= set(Finding.__annotations__) and _fields_ok(Finding, f), f
        assert json.loads(json.dumps(f)) == f  # plain data: the server and the browser get it as JSON


def test_p8_error_also_points_at_the_inplace_op_when_its_step_was_captured() -> None:
    g0 = {"kind": "graph", "step": 0, "rank": 0, "nodes": [{"id": 3, "name": "SigmoidBackward0", "module": ""}]}
    g2 = {"kind": "graph", "step": 2, "rank": 0,
          "ops": [{"id": 9, "name": "aten::index_put_", "module": "", "flags": ["inplace", "inplace_saved"],
                   "src": "net.py:33"}]}
    events = [session(), step(0), g0, step(1), step(2, backward_errors=[INPLACE_MSG]), g2]
    found = diagnose(events)
    assert codes(found) == ["P8"]  # the flagged op is the same event as the error: one finding
    f = found[0]
    assert f["targets"][0] == {"step": 2, "rank": 0, "op": 9, "module": ""} and f["targets"][1]["node"] == 3
    assert f["src"] == "net.py:33" and "aten::index_put_" in f["message"]


def test_p3_convergence_is_not_vanishing_but_a_stalled_loss_is() -> None:
    # A run fitting its batch: loss and gradient fall together by 1e8, and the tiny norms bounce.
    norms = [14.0, 26.0, 9.0, 12.0, 1.3, 0.19, 0.0009, 1.3, 0.0007, 0.0001, 1e-7, 0.0105, 2.5, 0.0, 0.36]
    losses = [2.5, 5.3, 1.8, 2.6, 0.02, 0.002, 1e-5, 0.02, 1e-5, 6e-7, 1e-9, 1e-4, 0.2, 0.0, 0.005]
    converging = [session(), *[step(i, grads=grads(norm=n), loss=lo) for i, (n, lo) in enumerate(zip(norms, losses, strict=True))]]
    assert diagnose(converging) == []  # step 13: loss exactly 0, gradients exactly 0: not P5 either
    stalled = [session(), *[step(i, grads=grads(norm=10.0 ** -i), loss=2.0) for i in range(8)]]
    f = only(diagnose(stalled), "P3")
    assert "vanished" in f["message"] and f["steps"] == [4, 5, 6, 7]


def test_p2_between_zero_frac_samples_a_zero_norm_counts_as_dead() -> None:
    sampled = grads(zero_frac=[1.0, 1.0, 0.1, 0.0], norm=[0.0, 0.0, 1.0, 1.0])
    between = grads(norm=[0.0, 0.0, 1.0, 1.0])
    del between["zero_frac"]
    f = only(diagnose([session(), *[step(i, grads=sampled if i % 10 == 0 else between) for i in range(12)]]), "P2")
    assert f["steps"] == list(range(12)) and f["modules"] == ["enc"]


@pytest.mark.parametrize("form", ["field", "message"])
def test_a_part_of_the_capture_turned_off_is_told_from_its_field_or_an_older_files_message(form: str) -> None:
    """Format 1.8 says which part turned off in ``LogEvent.capture_off``; a file before it, in
    the message alone: both are the doctor's "capture stopped" finding, and neither is an
    error of the loop's own (which a plain error line is)."""
    if form == "field":  # the message is not read: any wording
        off = {"kind": "log", "level": "error", "step": 2, "message": "graph recording stopped",
               "capture_off": {"part": "graph", "error": "KeyError('x')"}}
    else:
        off = {"kind": "log", "level": "error", "step": 2, "message": "torchscope: capture of graph turned off at "
               "step 2 after an internal error: KeyError('x'); your training goes on unchanged, ..."}
    loop_error = {"kind": "log", "level": "error", "step": 3, "message": "RuntimeError: CUDA out of memory"}
    found = [dict(f) for f in diagnose([session(), *(step(i) for i in range(4)), off, loop_error])]
    told = [f for f in found if f["code"] == "doctor"]
    assert len(told) == 1 and told[0]["title"] == "The capture stopped recording graph", found
    assert "at step 2" in told[0]["message"] and "(KeyError('x'))" in told[0]["message"]
    from torchscope.doctor.run import errors, split_by_rank

    (run,) = split_by_rank([session(), *(step(i) for i in range(4)), off, loop_error])
    assert [e.message for e in errors(run)] == ["RuntimeError: CUDA out of memory"]
