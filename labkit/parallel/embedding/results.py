"""Reading a table-wise or row-wise ``TrainReport``: weights, AUC, time split, memory by part."""

from __future__ import annotations

from labkit.runtime.memory.units import format_bytes

PARTS = ("tables", "dense")
KINDS = ("parameters", "gradients", "optimizer")


def merged_weights(report) -> dict:
    """One state dict from every rank's returned weights (``return_weights=True``): each table
    from the rank that holds it (row-wise ones come back whole, gathered), the dense part from
    rank 0. Works for any strategy: replicated runs just return rank 0's."""
    merged: dict = {}
    for rank in report.ranks:
        for name, value in rank["weights"].items():
            merged.setdefault(name, value)
    return merged


def auc_curve(report) -> tuple[float, list[float]]:
    """(held-out AUC before training, after each step), evaluated by the ranks."""
    records = report.ranks[0]["records"]
    return records[0]["auc_before"], [r["held_out_auc"] for r in records]


class SpeedSummary(dict):
    """{run label: {"split", "step_s", "samples_per_s", "oversubscribed"}}, printed as a table
    of the step split (milliseconds) and each run's speed against the first run's."""

    def _rows(self) -> list[str]:
        first = next(iter(self.values()))["step_s"]
        rows = []
        for label, run in self.items():
            split = run["split"] or {"lookup_s": float("nan"), "comm_s": float("nan"),
                                     "optimizer_s": float("nan"), "dense_s": float("nan")}
            parts = "  ".join(f"{split[k] * 1e3:7.1f}" for k in SPLIT_KEYS)
            note = "  (oversubscribed)" if run["oversubscribed"] else ""
            rows.append(f"{label:<16}{run['step_s'] * 1e3:8.1f}  {parts}  "
                        f"{first / run['step_s']:6.2f}x{note}")
        return rows

    def __repr__(self) -> str:
        head = (f"{'median step, ms':<16}{'step':>8}  {'lookups':>7}  {'comm':>7}  "
                f"{'optim.':>7}  {'other':>7}  {'speed vs ' + next(iter(self), '')}")
        return "\n".join([head, *self._rows()])


SPLIT_KEYS = ("lookup_s", "comm_s", "optimizer_s", "dense_s")


def speed_summary(reports: dict) -> SpeedSummary:
    """Per run (``{label: TrainReport}``): median step, samples/s, oversubscription, and the
    step split into lookups, communication, the optimizer and the rest where the run measured
    lookups."""
    out = SpeedSummary()
    for label, report in reports.items():
        measured = "lookup_s" in report.ranks[0]["records"][-1]
        out[label] = {"split": time_split(report) if measured else None,
                      "step_s": report.median_step_s, "samples_per_s": report.samples_per_s,
                      "oversubscribed": report.oversubscribed}
    return out


def time_split(report) -> dict[str, float]:
    """The median step (slowest rank, as ``TrainReport.split``) split into table lookups
    (forward and weight gradients, collectives excluded), exposed communication, the
    optimizer's step, and the rest (the dense MLPs and the interaction, forward and
    backward). The parts add up to the step."""
    split = report.split()
    records = [r["records"][s] for r in report.ranks for s in range(report.steps)]
    median = next(r for r in records if r["step_s"] == split["step_s"])
    lookup = median.get("lookup_s", 0.0)
    rest = split["step_s"] - split["comm_s"] - lookup
    dense = max(0.0, rest - split["optimizer_s"])
    return {"step_s": split["step_s"], "lookup_s": lookup, "comm_s": split["comm_s"],
            "optimizer_s": rest - dense, "dense_s": dense}


def memory_by_part(report) -> list[dict]:
    """Per rank: bytes held for tables and for the dense part (weights + gradients + optimizer
    state, counted from the tensors the rank holds), and the rest of its measured peak
    (activations, lookups in flight, buffers). ``state_bytes`` by part and kind is kept."""
    out = []
    for rank in report.ranks:
        state = rank["records"][-1]["state_bytes"]
        totals = {part: sum(state[part][k] for k in KINDS) for part in PARTS}
        peak = rank["memory"]["peak_bytes"]
        out.append({"rank": rank["rank"], **totals, "rest": max(0, peak - sum(totals.values())),
                    "peak": peak, "state_bytes": state})
    return out


class CollectiveCounts(dict):
    """{run label: {collective kind: (calls, bytes, bytes sent per rank on a ring)}} of one
    step, shown as a table."""

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{label}</td><td>{kind}</td><td>{calls}</td>"
                       f"<td>{format_bytes(nbytes)}</td><td>{format_bytes(wire)}</td></tr>"
                       for label, kinds in self.items()
                       for kind, (calls, nbytes, wire) in sorted(kinds.items()))
        return ("<b>collectives in one training step (rank 0, measured)</b><table><tr><th>run"
                "</th><th>collective</th><th>calls</th><th>bytes (full tensors)</th>"
                f"<th>sent per rank (ring)</th></tr>{rows}</table>")


def collectives(reports: dict) -> CollectiveCounts:
    """The collectives of each run's last step (``{label: TrainReport}``), by kind."""
    return CollectiveCounts({label: {kind: tuple(v) for kind, v in
                                     report.ranks[0]["records"][-1]["comm_kinds"].items()}
                             for label, report in reports.items()})
