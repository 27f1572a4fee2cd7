"""A ``torch.profiler`` Chrome trace (``labkit.train(..., profile=DIR)``), read back: its
steps, its computation and its communication, per rank.

HolisticTraceAnalysis (``hta``) answers the same questions, and more, from a folder of
traces; it brings pandas and plotly with it, so the few totals a lesson needs are read
here from the JSON itself (the format: the Trace Event Format of Chrome's ``about:tracing``,
which Perfetto reads).

In a trace, a **step** is a ``ProfilerStep#N`` span. **Communication** is the time inside a
collective: gloo runs each one on a worker thread of its own (``gloo:all_reduce``...), NCCL
as a kernel on the GPU (``ncclDevKernel...``). **Computation** is the time the step's own
thread spends in operators (forward, backward, the optimizer) other than launching or
waiting for a collective. On a GPU rank that is the host's time in operators (launching
kernels); the kernels themselves are the trace's GPU tracks, which Perfetto shows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from labkit.runtime.comm.meter import union_seconds

# collectives as gloo and NCCL name them in a trace (the work itself, not its launch)
COMM = re.compile(r"^(gloo:|nccl:)|nccl(Dev)?Kernel", re.IGNORECASE)
# what the step's thread does to start or wait for a collective: not computation
COMM_CALL = re.compile(r"^(c10d::|c10d:|record_param_comms)|wait", re.IGNORECASE)
STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class TraceEvent:
    name: str
    tid: int | str
    start_s: float  # since the trace's first step began
    end_s: float
    kind: str  # "step", "comm" or "compute"


def load_trace(path) -> dict:
    """The trace JSON at ``path``."""
    return json.loads(Path(path).read_text())


def _spans(trace) -> tuple[list[dict], list[dict]]:
    """(every complete event, the step spans) of a trace (a path or the loaded JSON)."""
    if not isinstance(trace, dict):
        trace = load_trace(trace)
    spans = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in spans if STEP.match(e.get("name", ""))]
    if not steps:
        raise ValueError("this trace has no ProfilerStep spans: record it with labkit.train("
                         "..., profile=DIR), or a profiler with a schedule")
    return spans, steps


def first_step_us(trace) -> float:
    """When the trace's first step began, on the profiler's clock (microseconds; the ranks
    of one machine share it)."""
    return min(e["ts"] for e in _spans(trace)[1])


def trace_events(trace, origin_us: float | None = None) -> list[TraceEvent]:
    """The steps, collectives and computing operators of one rank's trace (a path or the
    loaded JSON), times in seconds from ``origin_us`` (default: its first step's start)."""
    spans, steps = _spans(trace)
    origin = min(e["ts"] for e in steps) if origin_us is None else origin_us
    threads = {e["tid"] for e in steps}  # the thread that runs the steps
    out = []
    for e in spans:
        name = e.get("name", "")
        if STEP.match(name):
            kind = "step"
        elif COMM.search(name):
            kind = "comm"
        elif e["tid"] in threads and e.get("cat") in ("cpu_op", "user_annotation") \
                and not COMM_CALL.search(name):
            kind = "compute"
        else:
            continue
        out.append(TraceEvent(name, e["tid"], (e["ts"] - origin) * 1e-6,
                              (e["ts"] + e["dur"] - origin) * 1e-6, kind))
    return out


def trace_totals(trace) -> dict:
    """One rank's trace, totalled over its steps: ``steps``, ``step_s`` (their wall time),
    ``comm_s`` (time inside collectives) and ``compute_s`` (time computing), in seconds;
    overlapping events count once."""
    events = trace_events(trace)
    steps = [(e.start_s, e.end_s) for e in events if e.kind == "step"]

    def inside(kind: str) -> float:
        clipped = [(max(e.start_s, s0), min(e.end_s, s1)) for e in events if e.kind == kind
                   for s0, s1 in steps if e.start_s < s1 and e.end_s > s0]
        return union_seconds(clipped)

    return {"steps": len(steps), "step_s": sum(e - s for s, e in steps),
            "comm_s": inside("comm"), "compute_s": inside("compute")}


def trace_vs_clocks(report) -> list[dict]:
    """Per rank, the trace's totals (``trace_totals``) beside labkit's own clocks over the
    same steps (the report's timed steps): ``{"trace": {...}, "labkit": {...}}``, each with
    ``step_s``, ``comm_s`` (labkit: ``comm_busy_s``, all time inside collectives) and
    ``compute_s`` (labkit: the step less its exposed communication)."""
    from labkit.training.report import timed_steps

    if not report.traces:
        raise ValueError("this run has no traces: train it with profile=DIR")
    steps = timed_steps(report.ranks)
    out = []
    for rank, path in zip(report.ranks, report.traces, strict=True):
        records = [rank["records"][s] for s in steps]
        clocks = {"steps": len(records),
                  "step_s": sum(r["step_s"] for r in records),
                  "comm_s": sum(r["comm_busy_s"] for r in records),
                  "compute_s": sum(r["compute_s"] for r in records)}
        out.append({"trace": trace_totals(path), "labkit": clocks})
    return out


def trace_agreement(ranks: list[dict]) -> dict[str, float]:
    """The largest relative difference, over ranks, between the trace's totals and labkit's
    (``trace_vs_clocks``'s list): ``{"step_s", "compute_s", "comm_s"}``, 0.1 for 10%; and
    ``comm_of_step``, the communication's difference as a part of labkit's step time (a
    few short intervals differ more, relatively, than the steps they sit in)."""
    out = {key: max(abs(r["trace"][key] - r["labkit"][key]) / r["labkit"][key]
                    for r in ranks) for key in ("step_s", "compute_s", "comm_s")}
    out["comm_of_step"] = max(abs(r["trace"]["comm_s"] - r["labkit"]["comm_s"])
                              / r["labkit"]["step_s"] for r in ranks)
    return out
