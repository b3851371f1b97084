"""Tasks at the runner's boundary, vector columns and per-example images beside records."""

import numpy as np
import pytest
import torch
from torch import nn

from smoothcert.certifiers.columns import Column, format_vector, parse_vector
from smoothcert.errors import SmoothcertError
from smoothcert.runs.artifacts import artifact_path, read_artifact, save_artifacts
from smoothcert.runs.runner import certify_dataset


def test_vectors_round_trip_and_rules():
    m = np.array([[0.1, 2.0], [3.0, -np.inf]])
    np.testing.assert_array_equal(parse_vector(format_vector(m)), m)
    assert format_vector(np.array([1, 2, 3])) == "1,2,3"
    finite = Column("vector", "x is numbers >= 0", low=0.0)
    either = Column("vector", "x is numbers", infinite=True)
    cells = np.array(["1,2", "0;1", "1,2;3", "inf", "nan", "-1", ""], dtype=object)
    assert finite.outside(cells).tolist() == [False, False, True, True, True, True, True]
    assert either.outside(cells).tolist() == [False, False, True, False, True, False, True]


def test_artifacts_are_written_read_and_checked(tmp_path):
    records = tmp_path / "r.tsv"
    image = (np.arange(12, dtype=np.uint8) * 20).reshape(3, 4)
    cols = save_artifacts(records, 5, {"map": image})
    assert artifact_path(records, "map", 5).is_file()
    np.testing.assert_array_equal(read_artifact(records, "map", 5, cols["map_sha256"]), image)
    with pytest.raises(SmoothcertError, match="SHA-256 differs"):
        read_artifact(records, "map", 5, "0" * 64)
    with pytest.raises(SmoothcertError, match="cannot read the map of example 6"):
        read_artifact(records, "map", 6)
    assert save_artifacts(None, 5, {"map": image}) == cols  # no file: the hash alone


class PixelNet(nn.Module):
    task, num_classes, input_shape = "segmentation", 3, (1, 4, 4)

    def forward(self, x):
        return x.repeat(1, 3, 1, 1)


def test_a_classification_certifier_refuses_a_segmentation_model_in_one_line():
    data = [(torch.rand(1, 4, 4), torch.zeros(4, 4, dtype=torch.long))]
    with pytest.raises(SmoothcertError, match="is a segmentation model but dataset"):
        certify_dataset(PixelNet(), data, sigma=0.25, n0=10, n=20)
    data = [(torch.rand(1, 4, 4), 0)]
    with pytest.raises(SmoothcertError, match="is a segmentation model but dataset"):
        certify_dataset(PixelNet(), data, sigma=0.25, n0=10, n=20)
