"""Long sequences, interactively: a sequence-length slider; each length trains for real on
one device and with context parallelism under the same capacity, peaks per rank beside the
cap (or the OOM, with what the run would have needed, traced on fake tensors)."""

from __future__ import annotations

import dataclasses

from matplotlib.figure import Figure

from labkit.lessons.memory_wall.plots import plot_memory_bars
from labkit.runtime.memory.oom import DeviceOOM
from labkit.runtime.memory.units import format_bytes, parse_bytes
from labkit.training import TrainConfig, train
from labkit.training.estimate import estimate_memory
from labkit.training.layout import Layout


class SequenceExplorer:
    """Per sequence length: one device and ``Layout(cp=cp)`` trained under ``capacity``."""

    def __init__(self, cluster, model, seq_options, memory_per_device, cp: int = 2,
                 global_batch: int = 2, steps: int = 2):
        self.cluster, self.cp, self.seq_options = cluster, cp, sorted(seq_options)
        self.capacity = parse_bytes(memory_per_device)
        for seq in self.seq_options:  # bad lengths fail here, before any rank starts
            model.__class__(**{**dataclasses.asdict(model), "seq_len": seq})
            if seq % (2 * cp):
                raise ValueError(f"seq_len {seq} does not cut into 2 x cp = {2 * cp} chunks")
        self.model, self.global_batch, self.steps = model, global_batch, steps
        self._cache: dict[int, dict] = {}

    def config(self, seq: int, layout: Layout) -> TrainConfig:
        """The run trained at ``seq`` tokens under ``layout``."""
        model = dataclasses.replace(self.model, seq_len=seq)
        return TrainConfig(model=model, layout=layout, global_batch=self.global_batch,
                           steps=self.steps, optimizer="sgd", lr=0.1)

    def _run(self, seq: int, layout: Layout) -> dict:
        config = self.config(seq, layout)
        with self.cluster.resized(layout.size):
            try:
                report = train(self.cluster, config, memory_per_device=self.capacity,
                               estimate=False)
            except DeviceOOM as oom:  # what it would have needed: traced on fake tensors
                return {"oom": True, "breakdown": oom.breakdown,
                        "requested": oom.requested_bytes,
                        "estimate": estimate_memory(config, layout.size).peak_bytes}
        memory = max(report.ranks, key=lambda r: r["memory"]["peak_bytes"])["memory"]
        return {"oom": False, "breakdown": memory["at_peak"], "peak": memory["peak_bytes"],
                "losses": report.losses, "engine": report.extra.get("cp_engine")}

    def result(self, seq: int) -> dict:
        if seq not in self._cache:
            self._cache[seq] = {"one device": self._run(seq, Layout()),
                                f"cp={self.cp}": self._run(seq, Layout(cp=self.cp))}
        return self._cache[seq]

    def fitting(self) -> list[int]:
        """The lengths that train on one device and with cp under the capacity (runs them);
        none is an error that says what to change."""
        fits = [s for s in self.seq_options
                if not any(run["oom"] for run in self.result(s).values())]
        if not fits:
            raise ValueError(f"no sequence length of {self.seq_options} trains both on one device "
                             f"and with cp={self.cp} under {format_bytes(self.capacity)}: raise "
                             "memory_per_device or "
                             "add shorter lengths to seq_options")
        return fits

    def walled(self) -> list[int]:
        """The lengths where one device runs out of memory and cp trains (runs them)."""
        runs = {s: self.result(s) for s in self.seq_options}
        return [s for s, run in runs.items()
                if run["one device"]["oom"] and not run[f"cp={self.cp}"]["oom"]]

    def one_device_levers(self, seq: int) -> dict[str, int]:
        """One device's estimated peak at ``seq`` tokens with each of notebook 01's levers
        that applies to a batch this small: would a cheaper lever than cp have done?"""
        model = dataclasses.replace(self.model, seq_len=seq)
        levers = {"activation checkpointing": {"activation_checkpointing": True},
                  "bf16": {"precision": "bf16"},
                  f"accumulation x{self.global_batch}": {"grad_accumulation": self.global_batch}}
        return {name: estimate_memory(TrainConfig(model=model, global_batch=self.global_batch,
                                                  steps=self.steps, optimizer="sgd", lr=0.1,
                                                  **options), 1).peak_bytes
                for name, options in levers.items()}

    def figure(self, seq: int) -> Figure:
        bars = []
        for name, run in self.result(seq).items():
            bar = {"label": name + (" (OOM)" if run["oom"] else ""),
                   "breakdown": run["breakdown"], "oom": run["oom"]}
            bar.update({k: run[k] for k in ("requested", "estimate") if k in run})
            bars.append(bar)
        return plot_memory_bars(bars, self.capacity,
                                title=f"{seq} tokens per sequence: peak per rank (measured)")

    def message(self, seq: int) -> str:
        parts = []
        for name, run in self.result(seq).items():
            parts.append(f"{name}: out of memory (needs {format_bytes(run['estimate'])}, "
                         "estimated)" if run["oom"] else
                         f"{name}: peak {format_bytes(run['peak'])}")
        return "; ".join(parts) + f" (capacity {format_bytes(self.capacity)})"

    def widget(self, seq: int | None = None, background: bool = True):
        import ipywidgets as widgets

        from labkit.lessons.show.render import slider_panel

        slider = widgets.SelectionSlider(options=self.seq_options,
                                         value=seq or self.seq_options[0],
                                         description="sequence length",
                                         continuous_update=False, layout={"width": "450px"},
                                         style={"description_width": "initial"})
        box = slider_panel([slider], self.figure, lambda s: f"training {s} tokens",
                           self.message, background)
        box.slider = slider
        return box
