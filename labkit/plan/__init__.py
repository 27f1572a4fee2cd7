"""Plan a real run: time and memory of a layout on a named GPU cluster, projected from counted
FLOPs and bytes, and checked against measurement on this machine.

    cluster = labkit.plan.Cluster("H100", gpus_per_node=8, nodes=4)
    labkit.plan.project(GPT_7B, labkit.Layout(fsdp=4, tp=8), cluster, global_batch=256)
    labkit.plan.search(GPT_70B, cluster, global_batch=512).best
"""

from labkit.plan import published
from labkit.plan.calibrate import Calibration, calibrate
from labkit.plan.cluster import Cluster
from labkit.plan.hardware import GPU, GPUS, gpu
from labkit.plan.parallelism import Parallelism
from labkit.plan.project import ASSUMPTIONS, Projection, project
from labkit.plan.rules import PlanError
from labkit.plan.search import SearchResult, search

__all__ = ["ASSUMPTIONS", "GPU", "GPUS", "Calibration", "Cluster", "Parallelism", "PlanError",
           "Projection", "SearchResult", "calibrate", "gpu", "project", "published", "search"]
