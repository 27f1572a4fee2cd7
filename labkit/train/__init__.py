"""Training: one config, one shared loop, strategies plugged in, one report."""

from labkit.train.api import train
from labkit.train.config import TrainConfig
from labkit.train.report import TrainReport

__all__ = ["TrainConfig", "TrainReport", "train"]
