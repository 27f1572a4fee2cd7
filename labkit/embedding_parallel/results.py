"""Reading a table-wise or row-wise ``TrainReport``: weights, AUC, time split, memory by part."""

from __future__ import annotations

from labkit.memory.units import format_bytes

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


def speed_summary(reports: dict) -> dict:
    """Per run (``{label: TrainReport}``): median step, samples/s, oversubscription, and the
    step split into lookups, communication and the rest where the run measured lookups."""
    out = {}
    for label, report in reports.items():
        measured = "lookup_s" in report.ranks[0]["records"][-1]
        out[label] = {"split": time_split(report) if measured else None,
                      "step_s": report.median_step_s, "samples_per_s": report.samples_per_s,
                      "oversubscribed": report.oversubscribed}
    return out


def time_split(report) -> dict[str, float]:
    """The median step (slowest rank, as ``TrainReport.split``) split into table lookups
    (forward and weight gradients, collectives excluded), exposed communication, and the
    rest (the dense MLPs, the interaction, the optimizer). The parts add up to the step."""
    split = report.split()
    records = [r["records"][s] for r in report.ranks for s in range(report.steps)]
    median = next(r for r in records if r["step_s"] == split["step_s"])
    lookup = median.get("lookup_s", 0.0)
    rest = split["step_s"] - split["comm_s"] - lookup
    return {"step_s": split["step_s"], "lookup_s": lookup, "comm_s": split["comm_s"],
            "dense_s": rest}


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
