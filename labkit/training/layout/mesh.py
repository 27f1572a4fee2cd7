"""The one DeviceMesh of a run, built from its layout, and the names of its groups.

Every rank calls :func:`mesh_for` with the same layout; it returns a 5-D mesh named
``("pp", "dp", "fsdp", "cp", "tp")`` (degree-1 dimensions included, so ``mesh["tp"]`` always
exists). Nothing else in labkit builds a mesh.

A rank keeps one mesh per layout shape and reuses it in every run with that shape. Torch
makes that the only safe choice: DTensor caches its sharding decisions process-wide by the
mesh's *value* (shape and names, not its process groups), so a later run's equal mesh meets
the earlier one's groups in that cache; destroying them would break the later run, and
making new ones every run would pile up connections on warm ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from labkit.runtime.memory.capacity import on_host
from labkit.runtime.meshes import MESHES as _MESHES
from labkit.training.layout.layout import MESH_ORDER, Layout


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """A new mesh of the layout over every rank of the default process group (all ranks
    call it; each call makes new process groups)."""
    if layout.size != dist.get_world_size():
        raise ValueError(f"the layout {layout} needs {layout.size} ranks, the process group "
                         f"has {dist.get_world_size()}")
    with on_host(), torch.device("cpu"):  # the mesh's map of ranks: a host tensor, uncounted
        return init_device_mesh(device_type, tuple(layout.degrees.values()),
                                mesh_dim_names=MESH_ORDER)


def mesh_for(layout: Layout, device_type: str) -> DeviceMesh:
    """The rank's mesh for ``layout``: built the first time, the same one after."""
    key = (dist.group.WORLD.group_name, device_type, tuple(layout.degrees.values()))
    if key not in _MESHES:
        _MESHES[key] = build_mesh(layout, device_type)
    return _MESHES[key]


def _active_dims(layout: Layout, engines) -> list[str]:
    """Dimensions whose engine runs, in mesh order (a degree-1 engine still communicates)."""
    engine = engines.data_engine
    active = {"pp": engines.pipelined, "dp": engine in ("ddp", "naive", "zero1") or layout.dp > 1,
              "fsdp": engine in ("fsdp", "tables") or layout.fsdp > 1, "tp": layout.tp > 1,
              "cp": layout.cp > 1}
    return [dim for dim in MESH_ORDER if active[dim]]


class GroupLabels:
    """Which mesh dimension a collective's group is: "pp", "dp", "fsdp", "tp", or "world"
    for a group that is none of them. A group is known by its ranks (engines may make groups
    of their own over the same ranks: FSDP2's ``replicate`` on a tensor-parallel mesh does).
    When several dimensions have the same ranks (on one rank all of them do) the one whose
    engine runs wins."""

    def __init__(self, layout: Layout | None = None, engines=None, rank: int = 0):
        self._dims: dict[tuple[int, ...], str] = {}
        self._names: dict[str, str] = {}  # group name -> dimension, as they are met
        if layout is None:
            return
        order = _active_dims(layout, engines)
        order += [dim for dim in MESH_ORDER if dim not in order]
        for dim in order:
            ranks = next(g for g in layout.groups(dim) if rank in g)
            self._dims.setdefault(tuple(ranks), dim)

    def __call__(self, group) -> str:
        name = group_name(group)
        if name not in self._names:
            try:
                ranks = dist.get_process_group_ranks(c10d._resolve_process_group(name))
            except Exception:  # noqa: BLE001 - a group torch cannot name: counted as "world"
                ranks = None
            self._names[name] = self._dims.get(tuple(sorted(ranks or ())), "world")
        return self._names[name]


def group_name(group) -> str:
    """The name of any way torch.distributed lets a caller give a group."""
    if group is None:
        return dist.group.WORLD.group_name
    if isinstance(group, dist.ProcessGroup):
        return group.group_name
    if isinstance(group, str):
        return group
    try:
        return funcol._resolve_group_name(group)
    except Exception:  # noqa: BLE001 - an unknown form: counted, under "world"
        return ""
