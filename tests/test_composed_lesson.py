"""Notebook 07: its exercise check, both ways (the course's reference passes, planted wrong
groupings fail with the message meant for them), the rank grid's arithmetic, and the layout
picker over real runs."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import cloudpickle
import nbformat
import pytest

import labkit
from labkit.lessons.layouts.plots import (
    grid_positions,
    group_links,
    plot_rank_grid,
    step_split_by_dim,
)
from labkit.lessons.layouts.widgets import divisors, layout_from
from labkit.training.run import resolve
from tests.exercises import COURSE, solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value


def tp_outermost(degrees, dim):
    """Numbers the ranks with tp outermost (the mesh order reversed)."""
    names = list(reversed(list(degrees)))
    stride = math.prod(degrees[d] for d in names[names.index(dim) + 1:])
    size = math.prod(degrees.values())
    return [[r + i * stride for i in range(degrees[dim])] for r in range(size)
            if (r // stride) % degrees[dim] == 0]


def consecutive_for_every_dim(degrees, dim):
    """Right for tp only: every dimension's groups made of consecutive ranks."""
    size, d = math.prod(degrees.values()), degrees[dim]
    return [list(range(start, start + d)) for start in range(0, size, d)]


def only_the_first_group(degrees, dim):
    return [list(range(degrees[dim]))]


def not_written(degrees, dim):
    raise NotImplementedError()


def ranks_as_letters(degrees, dim):
    return [["a", "b"]]


def ranks_as_floats(degrees, dim):
    """The right groups, each rank off by 0.4: not ranks."""
    return [[r + 0.4 for r in group] for group in consecutive_for_every_dim(degrees, "tp")]


def groups_as_iterators(degrees, dim):
    """Consecutive ranks (right for tp only), each group an iterator."""
    return [iter(range(start, start + degrees[dim]))
            for start in range(0, math.prod(degrees.values()), degrees[dim])]


def verdict(cluster, fn, status="failed"):
    found = labkit.check.mesh_groups(cluster, fn)
    assert found.status == status, str(found)
    return str(found)


def test_mesh_groups_both_ways(four):
    reference = solution("07_putting_it_together", "mesh_groups_answer", "mesh_groups")
    message = verdict(four, reference, status="passed")
    assert "matches PyTorch's DeviceMesh" in message and "passed on 2 ranks too" in message
    message = verdict(four, tp_outermost)
    assert "on the real DeviceMesh is" in message and "tp innermost" in message
    assert "on the real DeviceMesh is [0, 2], yours is [0, 1]" in verdict(
        four, consecutive_for_every_dim)
    assert "leave out rank(s) [2, 3]" in verdict(four, only_the_first_group)
    assert "not attempted yet" in verdict(four, not_written, status="not attempted")
    assert four.world_size == 4  # the check put the cluster back at its size


def test_mesh_groups_says_what_is_wrong_with_groups_that_are_not_lists_of_ranks(four):
    """Answers of the wrong type get a verdict naming it, never an exception in the cell."""
    for planted in (ranks_as_letters, ranks_as_floats):
        message = verdict(four, planted)
        assert "each a list of ranks (whole numbers)" in message, (planted.__name__, message)
    # groups given as iterators are read once, and judged on their ranks
    assert "is [0, 2], yours is [0, 1]" in verdict(four, groups_as_iterators)


def test_rank_grid_places_groups_where_they_talk():
    layout = labkit.Layout(pp=2, dp=2, tp=2)
    where = grid_positions(layout)
    assert sorted(where.values()) == sorted((x, y) for x in range(2) for y in range(4))
    links = group_links(layout)
    assert ("tp", 0, 1) in links and ("dp", 0, 2) in links and ("pp", 0, 4) in links
    assert len(links) == 3 * 4  # 4 groups of 2 per dimension, one link each
    for dim, a, b in links:  # a tp link joins neighbours in a row
        if dim == "tp":
            assert where[a][1] == where[b][1] and abs(where[a][0] - where[b][0]) == 1
    fig = plot_rank_grid(layout, {"tp": 10, "dp": 5, "pp": 1})
    assert len(fig.axes) == 2
    assert len(plot_rank_grid(labkit.Layout(dp=4)).axes) == 1


def test_layout_picker_degrees():
    assert divisors(4) == [1, 2, 4] and divisors(6) == [1, 2, 3, 6]
    assert layout_from(4, fsdp=1, tp=2, pp=1) == labkit.Layout(dp=2, tp=2)
    with pytest.raises(ValueError, match="does not divide the 4 ranks"):
        layout_from(4, fsdp=2, tp=4, pp=1)


class _Report:
    """Just what step_split_by_dim reads."""

    def __init__(self, dims):
        self.ranks = [{"records": [{"comm_dims": dims}]}]

    def split(self):
        return {"compute_s": 0.5, "comm_s": 0.3}


def test_step_split_shares_exposed_time_by_dimension():
    parts = step_split_by_dim(_Report({"tp": {"seconds": 0.1}, "dp": {"seconds": 0.3}}))
    assert parts == pytest.approx({"compute": 0.5, "dp": 0.225, "tp": 0.075})
    assert sum(parts.values()) == pytest.approx(0.8)


def test_layout_picker_trains_each_layout_once_and_says_what_is_wrong():
    """Two ranks, a tiny MLP: the sliders offer the divisors of 2, dp takes what is left, a
    product that does not divide the ranks is said in the panel, runs are cached."""
    config = labkit.TrainConfig(model=labkit.models.MLPConfig(d_hidden=64, n_layers=2),
                                global_batch=16, steps=2)
    with labkit.Cluster(2, device="cpu", progress=False) as two:
        explorer = labkit.widgets.LayoutExplorer(two, config)
        box = explorer.widget(labkit.Layout(dp=2), background=False)
        assert box.sliders["tp"].options == (1, 2) and box.sliders["dp"].disabled
        assert "dp2" in box.message.value and box.plot.outputs[0]["data"]["image/png"]
        box.sliders["tp"].value = 2
        assert box.sliders["dp"].value == 1 and "tp2" in box.message.value
        box.sliders["fsdp"].value = 2
        assert "does not divide the 2 ranks" in box.status.value
        assert set(explorer._runs) == {labkit.Layout(dp=2), labkit.Layout(tp=2)}
        report, oom = explorer.run(labkit.Layout(tp=2))
        assert oom is None and report.losses == pytest.approx(explorer.reference().losses,
                                                              abs=1e-5)
        assert two.world_size == 2  # the one-device reference put the cluster back


def test_layout_picker_chooses_micro_batches_that_split_the_batch():
    """Two per stage where they split each data rank's samples, else the fewest that do
    (1F1B needs one per stage): every pp the sliders offer on 3 ranks trains."""
    config = labkit.TrainConfig(model=labkit.models.MLPConfig(n_layers=4), global_batch=32)
    explorer = labkit.widgets.LayoutExplorer(SimpleNamespace(world_size=3,
                                                             memory_per_device=None), config)
    three = explorer.config_for(labkit.Layout(pp=3))  # 6 would not split 32 samples
    resolve(three, 3)
    assert three.micro_batches == 4
    assert explorer.config_for(labkit.Layout(dp=2, pp=2)).micro_batches == 4


def _setup_cells(**parameters) -> dict:
    """Notebook 07's parameters cell with ``parameters`` injected, then its setup cell (no
    rank starts there): the names they define."""
    nb = nbformat.read(COURSE / "07_putting_it_together.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    setup = next(c for c in code if "composed_layout =" in c)
    (params,) = [c.source for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    namespace = {"display": lambda *args: None}
    exec(params + "".join(f"\n{k} = {v!r}" for k, v in parameters.items()), namespace)
    exec(setup, namespace)
    return namespace


@pytest.mark.parametrize("asked", [3, 5, 6, 12])
def test_notebook_07_picks_a_rank_count_its_layouts_split(asked):
    """Asked for ranks its layouts cannot split (dp=2 x tp=n/2 of a 1024-wide MLP, the
    exercise's layouts), the lesson uses 4 or 8 ranks instead of failing halfway."""
    cells = _setup_cells(world_size=asked, oversubscribe=True)
    n, layout = cells["world_size"], cells["composed_layout"]
    assert n in labkit.lessons.layouts.check.LAYOUTS and layout.size == n
    config = labkit.TrainConfig(model=labkit.models.MLPConfig(d_hidden=cells["d_hidden"]),
                                global_batch=cells["global_batch"])
    for each in (layout, labkit.Layout(tp=n), labkit.Layout(dp=n)):
        resolve(config.replace(layout=each), n)
