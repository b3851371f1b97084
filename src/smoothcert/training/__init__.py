"""Training: the configuration, the one trainer loop, optimizers and schedules, and the σ modes
(fixed or per example)."""

from .config import TrainConfig
from .loop import train
from .optim import OPTIMIZERS, SCHEDULES
from .sigma_modes import SIGMA_MODES, SigmaMode, build_sigma_mode
from .trainer import Trainer

__all__ = ["OPTIMIZERS", "SCHEDULES", "SIGMA_MODES", "SigmaMode", "TrainConfig", "Trainer",
           "build_sigma_mode", "train"]
