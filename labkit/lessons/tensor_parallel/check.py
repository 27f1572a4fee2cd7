"""Notebook 04's exercise: a column-parallel and a row-parallel linear layer, by hand.

The learner writes two ``nn.Module`` classes built from a whole ``nn.Linear`` and the rank:
``ColumnParallelLinear`` keeps this rank's slice of the output features and returns that slice
of the output; ``RowParallelLinear`` keeps this rank's slice of the input features, takes that
slice of the input, and returns the whole output. Chained (column, ReLU, row) they must equal
the two ``nn.Linear`` layers, forward and backward, with Megatron-LM's communication: nothing
in the column layer's forward, one AllReduce of the output in the row layer's forward, one
AllReduce of the input's gradient in backward (and no all-gather anywhere).

Each layer is built from a copy of the ``nn.Linear`` (changing it in place, as
``parallelize_module`` does, is allowed), and is found to hold exactly its slices as
parameters, whatever their names: a weight of (out/N, in) and a bias of (out/N,) for the
column layer, (out, in/N) and (out,) for the row layer. Their gradients are compared with the
matching slices of the whole layers' (a bias kept as a plain tensor would never train). The
whole layers' values are computed by the check outside the ranks, from a seed drawn for each
run. The check runs at the cluster's rank count and at a second one.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, run_checked
from labkit.lessons.exercise.wire import Traffic

EXERCISE = "tensor_parallel_linears"
D_IN, D_HIDDEN, D_OUT, BATCH = 16, 32, 8, 4


def _close(a, b) -> bool:
    return a is not None and a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _layers(seed: int):
    """The two whole layers, the input and the loss's weight, on the CPU, from ``seed``:
    (batch, in) -> (batch, hidden) -> (batch, out); the loss is (y * weight).sum()."""
    torch.manual_seed(seed)
    first, second = nn.Linear(D_IN, D_HIDDEN), nn.Linear(D_HIDDEN, D_OUT)
    return first, second, torch.randn(BATCH, D_IN), torch.randn(BATCH, D_OUT)


def _job(ctx, column_class, row_class, seed: int) -> dict:
    """The learner's layers on this rank: what they computed, held and communicated (the
    check compares it with the whole layers outside the ranks)."""
    n, r = ctx.world_size, ctx.rank
    first, second, x, weight = (t.to(ctx.device) for t in _layers(seed))
    column, row = column_class(copy.deepcopy(first), r, n), row_class(copy.deepcopy(second), r, n)
    x_mine = x.clone().requires_grad_()
    out = {}
    with Traffic() as traffic:
        hidden = column(x_mine)
    out["column_forward"] = traffic.collectives
    with Traffic() as traffic:
        y = row(torch.relu(hidden))
    out["row_forward"] = traffic.collectives
    with Traffic() as traffic:
        (y * weight).sum().backward()
    out["backward"] = traffic.collectives
    out["hidden"], out["y"] = hidden.detach().cpu(), y.detach().cpu()
    out["x_grad"] = None if x_mine.grad is None else x_mine.grad.cpu()
    out["params"] = {name: [(tuple(p.shape), None if p.grad is None else p.grad.cpu())
                            for p in (m.parameters() if isinstance(m, nn.Module) else [])]
                     for name, m in (("column", column), ("row", row))}
    return out


def _reference(seed: int) -> dict:
    """The whole layers' output, the input's gradient and the weights' gradients."""
    first, second, x, weight = _layers(seed)
    x_ref = x.clone().requires_grad_()
    hidden = first(x_ref)
    y = second(torch.relu(hidden))
    (y * weight).sum().backward()
    return {"hidden": hidden.detach(), "y": y.detach(), "x_grad": x_ref.grad,
            "first": first, "second": second}


def _compared(found: dict, ref: dict, r: int, n: int) -> dict:
    """One rank's findings, compared here with the whole layers (``_reference``)."""
    first, second = ref["first"], ref["second"]
    cols = slice(r * D_HIDDEN // n, (r + 1) * D_HIDDEN // n)
    out = {k: found[k] for k in ("column_forward", "row_forward", "backward")}
    out["hidden_ok"] = _close(found["hidden"], ref["hidden"][:, cols])
    out["hidden_shape"] = tuple(found["hidden"].shape)
    out["y_ok"] = _close(found["y"], ref["y"])
    out["bias_times"] = (((found["y"] - ref["y"]) / second.bias.detach()).mean().item() + 1
                         if found["y"].shape == ref["y"].shape else float("nan"))
    out["x_grad_ok"] = _close(found["x_grad"], ref["x_grad"])
    params = found["params"]
    out["held"] = {"column": _slices(params["column"], first.weight.grad[cols],
                                     first.bias.grad[cols]),
                   "row": _slices(params["row"], second.weight.grad[:, cols], second.bias.grad)}
    return out


def _slices(params: list, weight_grad, bias_grad) -> dict:
    """Which of the layer's slices the module holds as parameters (``params``: (shape,
    gradient) of each, found by shape), whether their gradients match, and the shapes of any
    other parameters it holds."""
    found, used = {}, set()
    for name, grad in (("weight", weight_grad), ("bias", bias_grad)):
        match = [i for i, (shape, _) in enumerate(params)
                 if tuple(shape) == tuple(grad.shape) and i not in used]
        if len(match) == 1:
            used.add(match[0])
        found[name] = {"shape": tuple(grad.shape), "held": len(match) == 1,
                       "grad_ok": len(match) == 1 and _close(params[match[0]][1], grad)}
    found["others"] = [tuple(shape) for i, (shape, _) in enumerate(params) if i not in used]
    return found


def _kinds(collectives: dict) -> str:
    return ", ".join(f"{c[0]} {k}" for k, c in collectives.items()) or "no collective"


def _problems(r: dict, n: int) -> list[str]:
    problems = []
    if not r["hidden_ok"]:
        problems.append(f"the column layer's output on this rank, of shape {r['hidden_shape']},"
                        f" is not its slice of nn.Linear's output ({BATCH}, {D_HIDDEN // n}):"
                        " keep rows rank*out/N to (rank+1)*out/N of the weight (and bias)")
    if r["column_forward"]:
        problems.append(f"the column layer's forward ran {_kinds(r['column_forward'])}: in a "
                        "column-then-row pair the row layer wants the slice, so no all-gather "
                        "(or any collective) is needed in the column layer's forward")
    if r["hidden_ok"] and not r["y_ok"]:
        if abs(r["bias_times"] - n) < 0.05:
            problems.append(f"the row layer's output carries its bias {n} times: every rank "
                            "added it before the all-reduce summed them; add it after")
        else:
            problems.append("the row layer's output differs from nn.Linear's: multiply this "
                            "rank's input slice by the matching columns of the weight, then "
                            "all-reduce the partial results")
    if set(r["row_forward"]) - {"all_reduce"} or r["row_forward"].get(
            "all_reduce", [0])[0] != (1 if n > 1 else r["row_forward"].get("all_reduce",
                                                                            [0])[0]):
        problems.append(f"the row layer's forward ran {_kinds(r['row_forward'])}; it needs "
                        "exactly one all_reduce, of its (batch, out) partial output")
    if r["y_ok"] and not r["x_grad_ok"]:
        problems.append("the input's gradient is only this rank's share: the column layer "
                        "must all-reduce the gradient of its input in backward (Megatron's "
                        "f: identity forward, all-reduce backward)")
    elif r["x_grad_ok"] and r["backward"].get("all_reduce", [0])[0] != (1 if n > 1 else 0):
        problems.append(f"backward ran {_kinds(r['backward'])}; Megatron's pair needs one "
                        "all_reduce, of the input's gradient")
    for layer, held in r["held"].items():
        problems += _slice_problems(layer, held, r["y_ok"])
    return problems


def _slice_problems(layer: str, held: dict, y_ok: bool) -> list[str]:
    problems = []
    for name in ("weight", "bias"):
        part = held[name]
        if not part["held"]:
            problems.append(f"the {layer} layer holds no parameter of shape {part['shape']} "
                            f"(its slice of the {name}): keep it as an nn.Parameter, so that "
                            "it gets a gradient and trains")
        elif y_ok and not part["grad_ok"]:
            problems.append(f"the {layer} layer's {name} gradient is not the matching slice "
                            "of nn.Linear's")
    if held["others"]:
        problems.append(f"the {layer} layer also holds parameters of shape "
                        f"{', '.join(map(str, held['others']))}: a tensor-parallel layer keeps "
                        "only its slices (not the whole nn.Linear it was built from)")
    return problems


def tensor_parallel_linears(cluster, column_class, row_class,
                            timeout: float | None = None) -> CheckResult:
    """Check the two classes, chained column -> ReLU -> row, on every rank of ``cluster``."""
    n = cluster.world_size
    for cls in (column_class, row_class):
        # a class's own ancestry only: the grader passes an answer (labkit.classroom's
        # Answer, executed on the ranks), whose type is labkit's but whose classes are not
        borrowed = [c for c in getattr(cls, "__mro__", [])
                    if getattr(c, "__module__", "").split(".")[0] == "labkit"]
        if borrowed:
            return failed(EXERCISE, f"{getattr(cls, '__name__', cls)} is (or derives from) "
                          f"labkit's own {borrowed[0].__name__}: write yours, from nn.Module")
    if D_HIDDEN % n:
        return failed(EXERCISE, f"the check splits {D_HIDDEN} features: use 1, 2, 4 or 8 ranks")
    return at_two_sizes(cluster, lambda: _check(cluster, column_class, row_class, timeout))


def _check(cluster, column_class, row_class, timeout: float | None) -> CheckResult:
    n, seed = cluster.world_size, fresh_seed()
    outcome = run_checked(cluster, EXERCISE, "your layers", _job, column_class, row_class,
                          seed, timeout=timeout)
    if outcome.verdict:
        return outcome.verdict
    ref = _reference(seed)
    try:
        values = [_compared(r, ref, rank, n) for rank, r in enumerate(outcome.values)]
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, RuntimeError):
        return failed(EXERCISE, "a rank sent back a report that labkit's check does not "
                      "write: its code on that rank changed the check's measurements")
    found = [(rank, p) for rank, r in enumerate(values) for p in _problems(r, n)]
    measured = {k: values[0][k] for k in ("column_forward", "row_forward", "backward")}
    if found:
        messages = list(dict.fromkeys(p for _, p in found))
        return failed(EXERCISE, messages[0], messages[1:], **measured)
    return passed(EXERCISE, "column -> ReLU -> row equals the two nn.Linear layers forward and "
                  "backward on every rank, with one all_reduce forward (the row layer's "
                  "output) and one backward (the input's gradient), and no all-gather.",
                  **measured)
