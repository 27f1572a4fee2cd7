"""The meshes a process remembers, and forgetting them when the process changes world.

``labkit.training.layout.mesh`` builds a run's meshes and keeps them here; the runtime forgets
them (and DTensor's caches) whenever a process goes on to another world: a launcher forked
from a notebook, the estimator's fake world.
"""

from __future__ import annotations

import sys

import torch

# (the world group's name, device type, degrees) -> the mesh: one per shape, per process
MESHES: dict[tuple, object] = {}


def forget_meshes() -> None:
    """Drop every mesh this process remembers, labkit's and DTensor's.

    DTensor caches its sharding decisions process-wide, keyed by a mesh's value (shape and
    names, not its rank or process groups), and the cached results hold the mesh they were
    made with. A process that goes on to another world (the estimator's fake group of rank 0
    of N, then rank 1 of N; a launcher forked from a notebook that estimated) would find
    another world's mesh in them, with another rank's coordinates: a rank would then cut
    another rank's shard. So every switch of world starts with no cached mesh anywhere.
    """
    MESHES.clear()
    if "torch.distributed.tensor" not in sys.modules:
        return  # DTensor was never used here: it caches nothing
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._collective_utils import MeshTopoInfo
    from torch.distributed.tensor._redistribute import _gen_transform_infos

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch's fast-path cache
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache.cache_clear()  # this thread's Python cache
    propagator._propagate_tensor_meta_cached.cache_clear()
    _gen_transform_infos.cache_clear()
    MeshTopoInfo.build_from_mesh.cache_clear()
