"""train --test-size: the log's test columns on a fixed class-balanced subset of the test
split (a dense task's first N), the same for every run."""

import torch

from smoothcert.training.config import TrainConfig
from smoothcert.training.trainer import Trainer


def test_the_test_columns_read_a_fixed_balanced_subset():
    config = TrainConfig(dataset="digits", arch="digits_cnn", method="gaussian", sigma=0.25,
                         epochs=1, train_size=50, test_size=40)
    first, second = Trainer(config).test_data, Trainer(config).test_data
    assert len(first) == 40 and torch.equal(first.labels, second.labels)
    assert torch.equal(torch.bincount(first.labels, minlength=10), torch.full((10,), 4))
    assert len(Trainer(TrainConfig(dataset="digits", arch="digits_cnn", method="gaussian",
                                   sigma=0.25, epochs=1, train_size=50)).test_data) == 359
