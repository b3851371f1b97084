"""Training: the configuration, the one trainer loop, and the σ modes (fixed or per example)."""

from .config import SCHEDULES, TrainConfig
from .loop import train
from .sigma_modes import SIGMA_MODES, SigmaMode, build_sigma_mode
from .trainer import Trainer

__all__ = ["SCHEDULES", "SIGMA_MODES", "SigmaMode", "TrainConfig", "Trainer", "build_sigma_mode",
           "train"]
