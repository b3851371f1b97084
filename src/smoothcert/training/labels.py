"""Training ACES' selection model: the training split relabelled from a record file.

ACES (Horváth et al. 2022, "Robust and Accurate – Compositional Architectures for Randomized
Smoothing", arXiv 2204.00487; :mod:`smoothcert.certifiers.aces`) smooths a binary *selection*
model: class 1 ("robust") sends an input to the robust model's smoothed prediction, class 0
("core") to an accurate core model. ``smoothcert train --label-records R.tsv`` trains one with
any classifier method (e.g. ``--method gaussian`` at the robust model's σ): ``R.tsv`` is a
record file of the robust model on the *training* split (``smoothcert certify ROBUST --split
train --out R.tsv``, any certifier whose rows have ``predict``, ``radius`` and ``correct``), and
the run trains on exactly the examples that have a row in it (their ``idx``, in index order),
example i labelled by ``label_rule`` at ``label_radius`` r:

* ``correct`` (the default): 1 where the robust model is certified *and correct* at r
  (``predict`` ≠ −1, ``correct`` = 1, ``radius`` ≥ r: the rows certified accuracy at r counts),
  else 0 — the selection learns where picking the robust model keeps a certified right answer;
* ``certified``: 1 where it is certified at r, right or wrong (``predict`` ≠ −1, ``radius`` ≥
  r), else 0 — where the robust model's answer is stable, whatever it is.

The file must come with its manifest (a file of Cohen et al.'s scripts has none), naming the
run's dataset (which fixes the input shape) and the split ``train``, for a split as large as
this one; anything else is one line before the run folder is written (a config given its
``label_sha256`` is checked when its run starts). Image folders are not supported (their
labels are read per file). ``train_size`` is refused: certify fewer examples instead
(``--max``, ``--skip``).

The checkpoint has 2 classes, ``classes`` ["core", "robust"], and ``meta["selection_labels"]``:
the file, its SHA-256, r, the rule, the robust checkpoint's fingerprint and the count of each
label. The config holds ``label_sha256``, the file's SHA-256 (computed when not given), so a run
resumed with another or a changed file (say, one extended by a resumed certify) is refused.

The log's test columns need labels of test examples: ``label_test_records`` is a record file of
the same robust model on the test split, relabelled by the same rule (e.g. the file the ACES
evaluation certifies anyway); without it the test columns are NaN (not measured).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re

import numpy as np
import torch

from ..data.datasets import ImageDataset, balanced_subset, load_dataset
from ..data.registry import DATASETS
from ..errors import SmoothcertError
from ..io import file_sha256
from ..runs.records import Records, manifest_path, read_manifest, read_records

log = logging.getLogger(__name__)

LABEL_RULES = {
    "correct": "class 1 (robust) where the robust model is certified and correct at "
               "--label-radius r (predict != -1, correct, radius >= r), else 0 (core)",
    "certified": "class 1 (robust) where the robust model is certified at r (predict != -1, "
                 "radius >= r), right or wrong, else 0 (core)",
}
SELECTION_CLASSES = ("core", "robust")  # ACES' classes 0 and 1 (certifiers/aces.py)
_FIELDS = ("label_records", "label_test_records", "label_radius", "label_rule", "label_sha256")
_UNSET = {"label_records": None, "label_test_records": None, "label_radius": 0.0,
          "label_rule": "correct", "label_sha256": None}


class SelectionData(ImageDataset):
    """A split's examples with ACES' selection labels: 0 core, 1 robust."""

    classes = SELECTION_CLASSES


# --------------------------------------------------------------------------- the config's fields
def check_label_fields(config, method) -> dict:
    """The checked label fields of a ``TrainConfig`` (``label_*``): all at their defaults
    without ``label_records``; with it, a classifier method, a dataset in memory, no
    ``train_size``, and ``label_sha256`` the file's (computed, with its manifest checked, when
    not given; a given one is checked when the run reads the file)."""
    values = {name: getattr(config, name) for name in _FIELDS}
    if values["label_records"] is None:
        given = [f"--{n.replace('_', '-')}" for n in _FIELDS if values[n] != _UNSET[n]]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise SmoothcertError(f"{', '.join(given)} {verb} --label-records (the record file "
                                  "that labels ACES' selection model)")
        return values
    _check_labelled_run(config, method)
    values["label_records"] = _path("label_records", values["label_records"])
    if values["label_test_records"] is not None:
        values["label_test_records"] = _path("label_test_records", values["label_test_records"])
    values["label_radius"] = _radius(values["label_radius"])
    if values["label_rule"] not in LABEL_RULES:
        raise SmoothcertError(f"unknown label_rule {values['label_rule']!r}; known: "
                              f"{', '.join(LABEL_RULES)}")
    if values["label_sha256"] is None:
        for key, split in (("label_records", "train"), ("label_test_records", "test")):
            if values[key] is not None:
                _checked_manifest(values[key], config.dataset, split)
        values["label_sha256"] = _sha256(values["label_records"])
    elif not (isinstance(values["label_sha256"], str)
              and re.fullmatch(r"[0-9a-f]{64}", values["label_sha256"])):
        raise SmoothcertError(f"label_sha256 must be 64 lowercase hex digits, got "
                              f"{values['label_sha256']!r}")
    return values


def _check_labelled_run(config, method) -> None:
    if method.trains != "classifier":
        raise SmoothcertError(f"--label-records trains ACES' selection classifier; method "
                              f"{method.name} trains a {method.trains}")
    if config.train_size is not None:
        raise SmoothcertError("--train-size and --label-records exclude each other: the "
                              "training set is the label file's rows (certify fewer examples, "
                              "--max or --skip, for a smaller one)")
    if DATASETS[config.dataset].streamed:  # (the name is checked before)
        raise SmoothcertError(f"--label-records needs a dataset held in memory; {config.dataset} "
                              "is an image folder")


def _path(name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise SmoothcertError(f"{name} must be a record file's path, got {value!r}")
    return value


def _radius(value) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise SmoothcertError(f"label_radius must be a finite number >= 0, got {value!r}")
    return float(value)


def _sha256(path: str) -> str:
    try:
        return file_sha256(path)
    except OSError as e:
        raise SmoothcertError(f"cannot read label records {path}: {e.strerror or e}") from e


def _checked_manifest(path: str, dataset: str, split: str) -> dict:
    """The manifest of the record file ``path``, which must be of ``dataset``'s ``split``."""
    manifest = read_manifest(path)
    if manifest is None:
        raise SmoothcertError(f"label records {path} have no manifest ({manifest_path(path)}); "
                              "their dataset and split cannot be checked: use a file written "
                              "by smoothcert certify")
    identity = manifest.get("identity") or {}
    if (identity.get("dataset"), identity.get("split")) != (dataset, split):
        raise SmoothcertError(
            f"label records {path} hold {identity.get('dataset')!r} split "
            f"{identity.get('split')!r}; this run needs {dataset!r} split {split!r} (certify "
            f"the robust model with --split {split})")
    return manifest


# --------------------------------------------------------------------------- the data
def selection_labels(records: Records, rule: str, radius: float) -> np.ndarray:
    """ACES' selection label of each row of ``records`` (int64, 1 robust, 0 core) by ``rule``
    (:data:`LABEL_RULES`) at ``radius``."""
    needed = ("predict", "radius") + (("correct",) if rule == "correct" else ())
    missing = [c for c in needed if c not in records]
    if missing:
        raise SmoothcertError(f"label records {records.path} have no column "
                              f"{', '.join(missing)}: use the records of a certifier")
    label = (records["predict"] != -1) & (records["radius"] >= radius)
    if rule == "correct":
        label &= records["correct"].astype(bool)
    return label.astype(np.int64)


def labelled_split(config, split: str) -> SelectionData | None:
    """``split``'s examples that have a row in the run's label records of that split, in index
    order, with their selection labels (None: no test records given)."""
    path = config.label_records if split == "train" else config.label_test_records
    if path is None:
        return None
    if split == "train" and _sha256(path) != config.label_sha256:
        raise SmoothcertError(f"label records {path} changed since the run started (SHA-256 "
                              f"{config.label_sha256[:12]}…, now another); use the run's file")
    manifest = _checked_manifest(path, config.dataset, split)
    data = load_dataset(config.dataset, split, config.data_root, image_size=config.image_size)
    size = (manifest.get("indices") or {}).get("dataset_size")
    if size is not None and size != len(data):
        raise SmoothcertError(f"label records {path} were written for a {split} split of {size} "
                              f"examples; this one has {len(data)}")
    records = read_records(path)
    if len(records) == 0:
        raise SmoothcertError(f"label records {path} hold no rows")
    order = np.argsort(records["idx"], kind="stable")
    idx = torch.as_tensor(records["idx"][order].astype(np.int64))
    labels = torch.as_tensor(selection_labels(records, config.label_rule,
                                              config.label_radius)[order])
    _warn_one_class(path, labels)
    _warn_other_noise(path, manifest, config)
    kept = data.subset(idx)
    spec = dataclasses.replace(data.spec, num_classes=len(SELECTION_CLASSES),
                               class_names=SELECTION_CLASSES)
    return SelectionData(**{f.name: getattr(kept, f.name) for f in dataclasses.fields(kept)}
                         | {"spec": spec, "labels": labels.to(kept.labels.device)})


def _warn_one_class(path: str, labels: torch.Tensor) -> None:
    counts = torch.bincount(labels, minlength=2).tolist()
    if 0 in counts:
        log.warning("label records %s: every example is labelled %s; the selection model "
                    "learns one class", path, SELECTION_CLASSES[int(counts[0] == 0)])


def _warn_other_noise(path: str, manifest: dict, config) -> None:
    """ACES smooths the selection model with the robust model's noise: train it at that one."""
    identity = manifest.get("identity") or {}
    certified = (identity.get("noise"), identity.get("sigma"))
    if certified != (config.noise, config.sigma):
        log.warning("label records %s certify with noise %s at sigma %s, this run trains at %s "
                    "sigma %s; ACES smooths the selection model with the robust model's noise",
                    path, *certified, config.noise, config.sigma)


def evaluation_split(config):
    """The split the log's test columns measure: the test split; for a selection model its
    labelled test records (None without them: the columns are NaN)."""
    if config.label_records is not None:
        return labelled_split(config, "test")
    return sized_split(config, "test", config.test_size)


def sized_split(config, split: str, size: int | None):
    """The dataset's ``split``, whole (``size`` None) or its fixed class-balanced subset of
    ``size`` examples (:func:`~smoothcert.data.datasets.balanced_subset`: the same for every run
    and seed)."""
    data = load_dataset(config.dataset, split, config.data_root, image_size=config.image_size)
    return data if size is None else data.subset(balanced_subset(data.labels, size))


def labels_meta(config, train_data) -> dict:
    """The checkpoint's ``selection_labels`` (provenance of its labels), or nothing."""
    if config.label_records is None:
        return {}
    manifest = read_manifest(config.label_records) or {}
    counts = torch.bincount(train_data.labels.cpu(), minlength=2).tolist()
    return {"selection_labels": {
        "records": config.label_records, "sha256": config.label_sha256,
        "radius": config.label_radius, "rule": config.label_rule,
        "robust_checkpoint_sha256": (manifest.get("identity") or {}).get("checkpoint_sha256"),
        "counts": dict(zip(SELECTION_CLASSES, counts)),
        "test_records": config.label_test_records}}
