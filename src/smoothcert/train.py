"""Alias kept so that ``from smoothcert.train import TrainConfig, train`` keeps working; the
training code lives in :mod:`smoothcert.training`."""

from .training import SCHEDULES, TrainConfig, Trainer, train

__all__ = ["SCHEDULES", "TrainConfig", "Trainer", "train"]
