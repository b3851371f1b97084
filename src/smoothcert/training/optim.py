"""Optimizers and learning-rate schedules of a training run, by name.

``OPTIMIZERS[config.optimizer](parameters, config)`` builds the run's optimizer and
``SCHEDULES[config.lr_schedule](optimizer, config)`` its schedule, stepped once per epoch; both
read their settings off the run's :class:`~smoothcert.training.TrainConfig` (whose unset
optimizer settings are already the method's defaults).
"""

from __future__ import annotations

from torch.optim import SGD, Adam, Optimizer
from torch.optim.lr_scheduler import LRScheduler, MultiStepLR, StepLR

from ..registry import Registry

OPTIMIZERS: Registry = Registry("optimizer")
"""Optimizers by name: ``OPTIMIZERS[name](parameters, config)``."""

SCHEDULES: Registry = Registry("lr_schedule")
"""Learning-rate schedules by name: ``SCHEDULES[name](optimizer, config)``, stepped once per
epoch."""


@OPTIMIZERS.register("sgd")
def _sgd(parameters, c) -> Optimizer:
    """SGD with momentum (Nesterov's if asked) and L2 weight decay (Cohen et al. 2019)."""
    return SGD(parameters, lr=c.lr, momentum=c.momentum, nesterov=c.nesterov,
               weight_decay=c.weight_decay)


@OPTIMIZERS.register("adam")
def _adam(parameters, c) -> Optimizer:
    """Adam (Kingma & Ba 2015) at lr with L2 weight decay added to the gradient, torch's
    ``Adam(lr, weight_decay)`` as Salman et al. 2020 train their denoisers; momentum and nesterov
    are SGD's and not used."""
    return Adam(parameters, lr=c.lr, weight_decay=c.weight_decay)


@SCHEDULES.register("step")
def _step(opt, c) -> LRScheduler:
    """lr × lr_gamma every lr_step_size epochs (Cohen et al. 2019: × 0.1 every 30)."""
    return StepLR(opt, step_size=c.lr_step_size, gamma=c.lr_gamma)


@SCHEDULES.register("multistep")
def _multistep(opt, c) -> LRScheduler:
    """lr × lr_gamma at each of the lr_milestones epochs."""
    return MultiStepLR(opt, milestones=list(c.lr_milestones), gamma=c.lr_gamma)


@SCHEDULES.register("constant")
def _constant(opt, c) -> LRScheduler:
    """The same lr in every epoch."""
    return MultiStepLR(opt, milestones=[], gamma=1.0)
