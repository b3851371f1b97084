"""Training: the configuration, the one trainer loop, and the σ modes (fixed or per example)."""

from .config import SCHEDULES, TrainConfig
from .loop import Trainer, train

__all__ = ["SCHEDULES", "TrainConfig", "Trainer", "train"]
