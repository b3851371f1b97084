"""The Trainer (smoothcert.training.trainer): the learning rate of every epoch under its schedule,
the training-set indices it passes to a method that asks for them (and to no other), and the
variant it records in the checkpoint's meta."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from smoothcert.methods import TrainingMethod, build_method
from smoothcert.training import TrainConfig
from smoothcert.training.trainer import Trainer

BASE = dict(dataset="digits", arch="digits_cnn", method="gaussian", sigma=0.25, batch_size=32,
            train_size=64, lr=0.1, seed=1)


@pytest.mark.parametrize("schedule, more, expected", [
    # MultiStepLR at [1, 3]: epoch e runs at lr·γ^(number of milestones ≤ e)
    ("multistep", {"lr_milestones": [1, 3]}, [0.1, 0.01, 0.01, 0.001, 0.001]),
    # StepLR every 2 epochs (Cohen et al.'s × 0.1 every 30, scaled down)
    ("step", {"lr_step_size": 2}, [0.1, 0.1, 0.01, 0.01, 0.001]),
    ("constant", {}, [0.1] * 5),
])
def test_the_lr_of_each_epoch_follows_the_schedule_stepped_once_per_epoch(schedule, more,
                                                                         expected):
    """The log's lr of epoch e (0-based) is the lr its steps ran at; the schedule steps once
    after each epoch, also across a resume (a fresh Trainer loading the checkpoint state)."""
    config = TrainConfig(**BASE, epochs=5, lr_schedule=schedule, lr_gamma=0.1, **more)
    trainer, lrs = Trainer(config), []
    for _ in range(3):
        lrs.append(trainer.train_epoch()["lr"])
    state = trainer.train_state()
    resumed = Trainer(config)
    resumed.load(type("Saved", (), {"train_state": state,
                                    "state_dict": trainer.model.state_dict()})())
    for _ in range(2):
        lrs.append(resumed.train_epoch()["lr"])
    assert lrs == pytest.approx(expected, rel=1e-12)


class Recorder(TrainingMethod):
    """Cross-entropy on clean inputs that records the indices it is given."""

    needs_indices = True

    @dataclass(frozen=True)
    class Options:
        pass

    def setup(self):
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def loss(self, model, x, y, noise, generator, idx=None):
        self.seen.append((idx.clone(), x.clone()))
        logits = model(x)
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


def test_a_method_that_needs_indices_gets_those_of_its_batch_and_others_get_none():
    """Every training example once per epoch, each index with its own (un-augmented: digits has
    no augmentation) pixels; a method without ``needs_indices`` is called with five arguments."""
    trainer = Trainer(TrainConfig(**BASE, epochs=1))
    trainer.method = Recorder()
    trainer.train_epoch()
    idx = torch.cat([i for i, _ in trainer.method.seen])
    assert sorted(idx.tolist()) == list(range(64))
    for i, x in trainer.method.seen:
        assert torch.equal(x, trainer.train_data.batch(i)[0])
    plain = Trainer(TrainConfig(**BASE, epochs=1))  # gaussian's loss has no idx parameter
    assert not plain.method.needs_indices and plain.train_epoch()["loss"] > 0


def test_the_meta_records_a_named_variant_only_where_there_is_one():
    trainer = Trainer(TrainConfig(**BASE, epochs=1))
    assert trainer.meta()["method"] == {"name": "gaussian", "hparams": {"num_noise": 1}}
    catrs = TrainConfig(**{**BASE, "method": "catrs"}, epochs=1,
                        method_params={"target": "self", "num_steps": 1})
    meta = Trainer(catrs).meta()["method"]
    assert meta["variant"] == "target=self"
    assert meta["hparams"] == build_method("catrs", target="self", num_steps=1).hparams()
