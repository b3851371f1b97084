"""``shift-enumeration``: every integer shift of the image tried, shortest first (TSS's
translation with black padding, by enumeration). The radius must be exactly the length of the
shortest shift that changes the base classifier's prediction, found here by a plain loop over
the authors' own shift (``BlackTranslational.proc``, ported) and ``torch.roll``."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from smoothcert.certifiers.shift_enumeration import black_shift, shift_shells
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import read_records


def authors_black(x: torch.Tensor, nx: int, ny: int) -> torch.Tensor:
    """The authors' ``BlackTranslational.proc`` for |nx| < H and |ny| < W (their slices)."""
    out = torch.zeros_like(x)
    rows_out = slice(0, -nx) if nx > 0 else slice(-nx, None)
    rows_in = slice(nx, None) if nx > 0 else slice(0, nx if nx < 0 else None)
    cols_out = slice(0, -ny) if ny > 0 else slice(-ny, None)
    cols_in = slice(ny, None) if ny > 0 else slice(0, ny if ny < 0 else None)
    out[:, rows_out, cols_out] = x[:, rows_in, cols_in]
    return out


@pytest.mark.parametrize("nx, ny", [(0, 0), (2, 0), (0, -3), (1, 2), (-4, 3), (-2, -5), (6, 6)])
def test_black_shift_is_the_authors(nx, ny):
    x = torch.rand(2, 7, 8, generator=torch.Generator().manual_seed(0))
    ours = black_shift(x, torch.tensor([[nx, ny]]))[0]
    torch.testing.assert_close(ours, authors_black(x, nx, ny), rtol=0, atol=0)


def test_shells_hold_every_shift_once_by_length():
    shells = shift_shells(3)
    flat = np.concatenate(shells)
    assert len(flat) == 49 and len({tuple(s) for s in flat}) == 49
    lengths = [int((s**2).sum(axis=1).max()) for s in shells]
    assert lengths == sorted(set(lengths)) and shells[0].tolist() == [[0, 0]]
    assert all(len(set((s**2).sum(axis=1).tolist())) == 1 for s in shells)


class Corner(nn.Module):
    """Class 1 when the mass in the top-left 3×3 corner exceeds ``t`` (else 0): a dot moves
    in and out of the corner as the image shifts."""

    num_classes = 2

    def __init__(self, t=0.5):
        super().__init__()
        self.t = t

    def forward(self, x):
        mass = x[:, :, :3, :3].sum(dim=(1, 2, 3))
        return torch.stack([torch.zeros_like(mass), mass - self.t], dim=1)


def oracle_radius(model, x, padding, m):
    """The shortest shift (|dx|, |dy| <= m) whose prediction differs from f(x), by a loop."""
    def shifted(dx, dy):
        if padding == "cyclic":
            return torch.roll(x, (-dx, -dy), (1, 2))
        return authors_black(x, dx, dy) if abs(dx) < x.shape[1] and abs(dy) < x.shape[2] \
            else torch.zeros_like(x)
    with torch.no_grad():
        clean = int(model(x[None]).argmax())
        best = m + 1.0
        for dx in range(-m, m + 1):
            for dy in range(-m, m + 1):
                if int(model(shifted(dx, dy)[None]).argmax()) != clean:
                    best = min(best, math.hypot(dx, dy))
    return clean, best


@pytest.mark.parametrize("padding", ["black", "cyclic"])
def test_the_radius_is_the_shortest_shift_that_changes_the_prediction(padding):
    g = torch.Generator().manual_seed(1)
    images = torch.zeros(5, 1, 9, 9)
    for k, (i, j) in enumerate([(1, 1), (4, 4), (0, 2), (7, 8), (2, 6)]):
        images[k, 0, i, j] = 0.95
    images += 0.02 * torch.rand(images.shape, generator=g)
    data = torch.utils.data.TensorDataset(images, torch.tensor([1, 0, 1, 0, 0]))
    rows = certify_dataset(Corner(), data, certifier="shift-enumeration",
                           options={"padding": padding}, batch=50, num_classes=2)
    for row, x in zip(rows, images):
        clean, radius = oracle_radius(Corner(), x, padding, 9)
        assert (row["predict"], row["n"]) == (clean, 19 * 19)
        assert row["radius"] == pytest.approx(radius, abs=1e-12), (row, radius)


def test_no_changed_prediction_gives_the_box_bound_and_max_shift_limits_it():
    data = torch.utils.data.TensorDataset(torch.zeros(1, 1, 6, 6), torch.tensor([0]))
    rows = certify_dataset(Corner(), data, certifier="shift-enumeration",
                           options={"max_shift": 2}, num_classes=2)
    assert rows[0]["radius"] == 3.0 and rows[0]["n"] == 25 and rows[0]["predict"] == 0


def test_bad_options_are_one_line():
    with pytest.raises(SmoothcertError, match="max_shift must be an integer >= 1"):
        certify_dataset(Corner(), torch.utils.data.TensorDataset(
            torch.zeros(1, 1, 6, 6), torch.tensor([0])), certifier="shift-enumeration",
            options={"max_shift": 0}, num_classes=2)
    with pytest.raises(SmoothcertError, match="padding"):
        certify_dataset(Corner(), torch.utils.data.TensorDataset(
            torch.zeros(1, 1, 6, 6), torch.tensor([0])), certifier="shift-enumeration",
            options={"padding": "reflect"}, num_classes=2)


def test_the_command_line_runs_it_and_report_reads_pixels(tmp_path, capsys):
    from conftest import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "c.pt")
    out = tmp_path / "r.tsv"
    assert main(["certify", str(ckpt), "--certifier", "shift-enumeration", "--max", "2",
                 "--no-progress", "--device", "cpu", "--out", str(out)]) == 0
    records = read_records(out)
    assert len(records) == 2 and set(records["n"]) == {17 * 17}
    capsys.readouterr()
    assert main(["report", str(out), "--radii", "0:2:1"]) == 0
    assert "shift, pixels" in capsys.readouterr().out
    assert main(["certify", str(ckpt), "--certifier", "shift-enumeration", "--opt",
                 "max_shift=9", "--out", str(tmp_path / "s.tsv")]) == 2
    assert "max_shift 9 is beyond the 8x8 image" in capsys.readouterr().err
    assert not (tmp_path / "s.tsv").exists()
