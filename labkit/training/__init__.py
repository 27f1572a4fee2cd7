"""Training: one config, one shared loop, strategies plugged in, one report."""

from labkit.training.api import train
from labkit.training.config import TrainConfig
from labkit.training.report import TrainReport

__all__ = ["TrainConfig", "TrainReport", "train"]
