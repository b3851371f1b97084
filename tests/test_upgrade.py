"""The one upgrade path (``smoothcert.upgrade``): every old format reads, resumes and loads.

The fixtures under ``tests/fixtures/upgrade`` are files of each old version, never rewritten:

- ``checkpoint_v1.pt``: a digits_cnn checkpoint (epoch 1 of a 2-epoch run) written by the trainer
  of commit 83ffdf8^ (config format 1 without σ mode, no ``num_hparams``, no
  ``per_example_sigma``); ``configs/v1_first_run.yaml`` is that run's config.yaml.
- ``records/v1_*``: record files (4 digits test images, n = 300, --batch 64) certified from that
  checkpoint by commit 7172e1a (manifest version 1: ``batch`` in the identity, Step 7's
  certifier names); ``records/v2_*``: the same runs by commit 867249f (version 2: ``chunk``);
  ``records/v3_*``: the same runs, and an attack, by commit 3412f4d (version 3: the identity's
  ``task`` and the manifest's ``kind``); ``records/v4_*``: the same runs by commit ef4edc6
  (version 4: ``certifier``; PREDICT's vote counts named ``count`` and ``runner_up``).
- ``corpus/``: manifests of the committed study records (with their first rows), the configs and
  the recipe of committed runs: every shape the corpus holds.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from smoothcert import certify_dataset
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.runs.records import manifest_path, read_manifest, read_records
from smoothcert.runs.runner import RunConfig, run_identity
from smoothcert.training.config import TrainConfig
from smoothcert.training.recipes import load_recipe
from smoothcert.upgrade import (
    _CHECKPOINT_STEPS,
    _CONFIG_STEPS,
    _MANIFEST_STEPS,
    CHECKPOINT_VERSION,
    CONFIG_VERSION,
    MANIFEST_VERSION,
    certifier_spelling,
    manifest_version,
    upgrade_checkpoint,
    upgrade_config,
    upgrade_manifest,
)

FIXTURES = Path(__file__).parent / "fixtures" / "upgrade"
CHECKPOINT = FIXTURES / "checkpoint_v1.pt"
MANIFESTS = sorted(FIXTURES.glob("*/*.manifest.json"))
RUNS = {  # record fixture -> (certifier, noise, options) of its run, in today's spelling
    "certify_gaussian": ("certify", "gaussian", {}),
    "certify_uniform": ("certify", "uniform", {}),
    "data_dependent_uniform": ("data-dependent", "uniform", {"num_steps": 3}),
    "predict_uniform": ("predict", "uniform", {}),
}
DEPRECATION = "smoothcert.upgrade"


def raw(path: Path) -> dict:
    return json.loads(path.read_text())


def timeless(rows) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


FLOAT32_EPS = float(torch.finfo(torch.float32).eps)
FLOAT64_EPS = float(torch.finfo(torch.float64).eps)


def assert_same_rows(rows, stored) -> None:
    """The rows a resumed run computed are the fixture's: counts and decisions exactly, what
    SciPy computes in float64 from them (p_lower, radii) to 16 float64 ulps, as SciPy versions
    differ in the last bit (1.7.3, the oldest supported: a p_lower of 0.7429205388406765 where
    1.17 gives ...764); a PGD ``distance`` (a float32 norm of a perturbation torch computed) to 8
    float32 ulps, as torch's CPU kernels round it differently by instruction set
    (ATEN_CPU_CAPABILITY default, avx2, avx512: 0.50000003100, 0.50000000728, 0.50000001844 for
    the fixture's 0.50000002678)."""
    rows, stored = timeless(rows), timeless(stored)
    assert [sorted(r) for r in rows] == [sorted(r) for r in stored]
    for row, want in zip(rows, stored, strict=True):
        assert row.pop("distance", 0.0) == pytest.approx(want.pop("distance", 0.0),
                                                        rel=8 * FLOAT32_EPS, abs=0.0)
        assert row == pytest.approx(want, rel=16 * FLOAT64_EPS, abs=16 * FLOAT64_EPS)


# --------------------------------------------------------------------------- record manifests
def test_the_fixtures_hold_every_manifest_version():
    versions = {manifest_version(raw(p)) for p in MANIFESTS
                if raw(p).get("kind") != "grad-norms"}
    assert versions == set(range(1, MANIFEST_VERSION))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name.removesuffix(".manifest.json"))
def test_an_old_manifest_is_the_identity_a_rerun_computes(path):
    # A rerun (here with another --batch) of the file's run computes the upgraded identity, so
    # the file resumes; the old chunks (version 1: its batch) are kept.
    old = raw(path)
    if old.get("kind") == "grad-norms":  # an analysis cache with its own identity: version 1
        assert upgrade_manifest(old) == {**old, "format_version": 1}
        return
    new = upgrade_manifest(old)
    assert new["format_version"] == MANIFEST_VERSION and "kind" not in new
    named = old["identity"].get("task", old["identity"].get("certifier"))  # "task" until v4
    assert new["identity"]["certifier"] == named or named in \
        ("uniform", "data-dependent-uniform")  # Step 7's names: the upgrade renames them
    identity = new["identity"]
    fields = {**identity, "batch": 333}
    if fields["indices"] is not None:
        fields["indices"] = tuple(fields["indices"])
    assert run_identity(RunConfig(**fields)) == identity
    assert identity["chunk"] == old["identity"].get("batch", old["identity"].get("chunk"))
    assert raw(path) == old  # reading changes nothing on disk


@pytest.mark.parametrize("version, task, noise", [
    ("v1", "uniform", ("certify", "uniform")),
    ("v2", "data-dependent-uniform", ("data-dependent", "uniform")),
    ("v1", "certify", ("certify", "gaussian")),
    ("v2", "predict", ("predict", "uniform")),
])
def test_old_certifier_names_and_implicit_gaussian_become_explicit(version, task, noise):
    name = {"uniform": "certify_uniform", "data-dependent-uniform": "data_dependent_uniform",
            "certify": "certify_gaussian", "predict": "predict_uniform"}[task]
    path = FIXTURES / "records" / f"{version}_{name}.tsv"
    assert raw(manifest_path(path))["identity"]["task"] == task
    identity = read_manifest(path)["identity"]
    assert (identity["certifier"], identity["noise"]) == noise and "task" not in identity
    assert identity["engine"] == {} and identity["indices"] is None
    assert "batch" not in identity and "max_count" not in identity


def test_the_manifest_chain_composes_step_by_step():
    old = raw(FIXTURES / "records" / "v1_certify_uniform.tsv.manifest.json")
    two = _MANIFEST_STEPS[0](old)
    assert manifest_version(two) == 2 and two["identity"]["chunk"] == 64
    three = _MANIFEST_STEPS[1](two)
    assert three["kind"] == three["identity"]["task"] == "certify"
    four = _MANIFEST_STEPS[2](three)
    assert "kind" not in four and four["identity"]["certifier"] == "certify"
    assert "task" not in four["identity"]
    five = _MANIFEST_STEPS[3](four)
    assert five == four  # a CERTIFY file: its columns keep their names
    six = _MANIFEST_STEPS[4](five)
    assert six == five  # not a dsrs file: its options are unchanged
    assert upgrade_manifest(old) == {**six, "format_version": 6}
    assert upgrade_manifest({**two, "format_version": 2}) == upgrade_manifest(old)
    assert upgrade_manifest({**three, "format_version": 3}) == upgrade_manifest(old)
    assert upgrade_manifest({**four, "format_version": 4}) == upgrade_manifest(old)
    assert upgrade_manifest(upgrade_manifest(old)) == upgrade_manifest(old)  # current: unchanged


@pytest.mark.parametrize("change, match", [
    ({"format_version": 7}, "record manifest format version 7 is newer than this smoothcert"),
    ({"format_version": "3"}, "format_version must be an integer >= 1"),
    ({"identity": {"batch": 0, "task": "certify"}}, "identity batch must be an integer >= 1"),
])
def test_an_unreadable_manifest_version_is_one_clear_error(tmp_path, change, match):
    path = tmp_path / "r.tsv"
    path.write_text("idx\n")
    old = raw(FIXTURES / "records" / "v1_certify_gaussian.tsv.manifest.json")
    manifest_path(path).write_text(json.dumps({**old, **change}))
    with pytest.raises(SmoothcertError, match=match):
        read_manifest(path)


@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_old_record_file_resumes_with_the_rows_its_version_drew(tmp_path, version, name):
    # The fixture's last two rows are dropped and recomputed by today's runner (another
    # --batch, today's spelling): they equal the rows the old version wrote.
    source = FIXTURES / "records" / f"{version}_{name}.tsv"
    out = tmp_path / source.name
    out.write_text("".join(source.read_text().splitlines(keepends=True)[:3]))
    shutil.copy(manifest_path(source), manifest_path(out))
    certifier, noise, options = RUNS[name]
    rows = certify_dataset(str(CHECKPOINT), load_dataset("digits", "test"), certifier=certifier,
                           noise=noise, options=options, n0=20, n=300, batch=1000, skip=90,
                           max_count=4, out=out)
    assert len(rows) == 4
    assert_same_rows(rows, read_records(source).rows())
    assert manifest_path(out).read_bytes() == manifest_path(source).read_bytes()  # not rewritten


@pytest.mark.parametrize("version", ["v3", "v4"])
def test_an_old_attack_file_resumes_as_the_attack_certifier(tmp_path, version):
    # Version 3 named the attack an evaluation: manifest kind "attack", identity task "attack";
    # version 4 names it certifier "attack".
    source = FIXTURES / "records" / f"{version}_attack.tsv"
    old = raw(manifest_path(source))
    named = (old.get("kind"), old["identity"].get("task", old["identity"].get("certifier")))
    assert named == (("attack", "attack") if version == "v3" else (None, "attack"))
    assert old["format_version"] == int(version[1])
    out = tmp_path / source.name
    out.write_text("".join(source.read_text().splitlines(keepends=True)[:3]))
    shutil.copy(manifest_path(source), manifest_path(out))
    rows = certify_dataset(str(CHECKPOINT), load_dataset("digits", "test"), certifier="attack",
                           options=old["identity"]["options"], n=100, batch=1000, skip=90,
                           max_count=4, out=out)
    assert len(rows) == 4
    assert_same_rows(rows, read_records(source).rows())
    assert manifest_path(out).read_bytes() == manifest_path(source).read_bytes()  # not rewritten


def test_a_version_3_attack_file_reports(capsys):
    from smoothcert.cli import main

    assert main(["report", str(FIXTURES / "records" / "v3_attack.tsv")]) == 0
    assert "v3_attack" in capsys.readouterr().out


def test_a_version_5_dsrs_file_reads_and_resumes_with_version_6_options(tmp_path, capsys):
    """Step 20 replaced dsrs's ``search`` and ``unit`` by ``tol`` and added options: the old
    file reads (its cost too, which builds the certifier from its options), and resumed with
    one more image it keeps its rows and computes the new one as a fresh run would."""
    path = FIXTURES / "records" / "v5_dsrs.tsv"
    identity = read_manifest(path)["identity"]
    assert "search" not in identity["options"] and identity["options"]["th"] == "x"
    assert identity["options"]["q"] == "ball" and identity["options"]["count"] == "selection"
    assert main(["report", str(path), "--cost"]) == 0
    assert "v5_dsrs" in capsys.readouterr().out
    out = tmp_path / "v5_dsrs.tsv"
    for suffix in ("", ".manifest.json"):
        shutil.copy(str(path) + suffix, str(out) + suffix)
    args = [str(CHECKPOINT), "--certifier", "dsrs", "--opt", "th=x", "--n0", "20", "--n", "300",
            "--batch", "64", "--skip", "90", "--no-progress", "--device", "cpu"]
    assert main(["certify", *args, "--max", "4", "--out", str(out)]) == 0
    fresh = tmp_path / "fresh.tsv"
    assert main(["certify", *args, "--max", "4", "--out", str(fresh)]) == 0
    old, new = read_records(out), read_records(fresh)
    assert len(old) == 4 and list(old["nA"]) == list(new["nA"])
    np.testing.assert_allclose(old["radius"], new["radius"], rtol=1e-12, atol=0)


def test_a_new_manifest_names_the_certifier_once(tmp_path):
    out = tmp_path / "r.tsv"
    certify_dataset(str(CHECKPOINT), load_dataset("digits", "test"), n0=20, n=50, skip=90,
                    max_count=1, out=out)
    written = raw(manifest_path(out))
    assert written["format_version"] == MANIFEST_VERSION == 6 and "kind" not in written
    assert written["identity"]["certifier"] == "certify" and "task" not in written["identity"]


@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_an_old_predict_file_reads_its_vote_counts_as_nA_and_nB(version):
    # Until version 5 PREDICT named the two top counts ``count`` and ``runner_up``, while the
    # runner-up and L-bound certifiers' ``runner_up`` is a class: read through the upgrade,
    # they are Cohen et al.'s nA and nB (Algorithm PREDICT), the file on disk unchanged.
    source = FIXTURES / "records" / f"{version}_predict_uniform.tsv"
    before = source.read_bytes(), manifest_path(source).read_bytes()
    header, *lines = source.read_text().splitlines()
    assert "\tcount\trunner_up\t" in header
    raw_rows = [dict(zip(header.split("\t"), line.split("\t"))) for line in lines]
    records = read_records(source)
    assert records.columns_order[5:8] == ("nA", "nB", "pvalue")
    assert "count" not in records and "runner_up" not in records
    assert records.manifest["columns"] == list(records.columns_order)
    assert [int(v) for v in records["nA"]] == [int(r["count"]) for r in raw_rows]
    assert [int(v) for v in records["nB"]] == [int(r["runner_up"]) for r in raw_rows]
    assert (source.read_bytes(), manifest_path(source).read_bytes()) == before


def test_an_old_predict_file_grows_and_still_reads(tmp_path):
    # Dropping --max rewrites the manifest (its index list) in today's version, with today's
    # column names, above the file's old header, which is never rewritten: the file still
    # reads, and its last row, redone, sits under the old names' positions.
    source = FIXTURES / "records" / "v4_predict_uniform.tsv"
    out = tmp_path / source.name
    out.write_text("".join(source.read_text().splitlines(keepends=True)[:4]))
    shutil.copy(manifest_path(source), manifest_path(out))
    rows = certify_dataset(str(CHECKPOINT), load_dataset("digits", "test"), certifier="predict",
                           noise="uniform", n=300, batch=1000, skip=90, out=out)
    written = raw(manifest_path(out))
    assert written["format_version"] == MANIFEST_VERSION and written["indices"]["max_count"] is None
    assert written["columns"][5:7] == ["nA", "nB"]
    assert out.read_text().splitlines()[0] == source.read_text().splitlines()[0]  # old header
    assert timeless(read_records(out).rows()) == timeless(read_records(source).rows())
    assert timeless(rows) == timeless(read_records(source).rows())


def test_a_new_predict_file_names_its_counts_nA_and_nB(tmp_path):
    from smoothcert.certifiers.columns import RUNNER_UP
    from smoothcert.runs.schema import known_columns

    out = tmp_path / "p.tsv"
    rows = certify_dataset(str(CHECKPOINT), load_dataset("digits", "test"), certifier="predict",
                           n=100, skip=90, max_count=2, out=out)
    header = out.read_text().splitlines()[0].split("\t")
    assert header[5:8] == ["nA", "nB", "pvalue"] and "runner_up" not in header
    assert all(r["nA"] >= r["nB"] and r["nA"] + r["nB"] <= 100 for r in rows)
    columns = known_columns()
    assert columns["nB"].rule == "nB is a count, an integer >= 0"  # one rule: the runner-up's
    assert columns["runner_up"] is RUNNER_UP and "class" in RUNNER_UP.rule
    assert "count" not in RUNNER_UP.rule


def test_an_old_record_file_resumes_under_its_old_certifier_name(tmp_path, caplog):
    source = FIXTURES / "records" / "v1_certify_uniform.tsv"
    out = tmp_path / source.name
    out.write_text("".join(source.read_text().splitlines(keepends=True)[:4]))
    shutil.copy(manifest_path(source), manifest_path(out))
    with caplog.at_level(logging.WARNING, logger=DEPRECATION):
        rows = certify_dataset(str(CHECKPOINT), load_dataset("digits", "test"),
                               certifier="uniform", n0=20, n=300, batch=64, skip=90,
                               max_count=4, out=out)
    assert timeless(rows) == timeless(read_records(source).rows())
    assert len(caplog.records) == 1 and "--certifier certify --noise uniform" in caplog.text


def test_old_record_files_report(capsys):
    from smoothcert.cli import main

    files = sorted(str(p) for p in FIXTURES.glob("*/*.tsv") if "grad_norms" not in p.name
                   and "predict" not in p.name and "sequential" not in p.name
                   and "lbound" not in p.name and "attack" not in p.name)
    uniform = [f for f in files if "uniform" in Path(f).name]  # ℓ1 radii: a report of their own
    for group in (uniform, [f for f in files if f not in uniform]):
        assert main(["report", *group, "--radii", "0:2:0.25", "--format", "csv"]) == 0
        table = capsys.readouterr().out
        assert all(Path(f).stem in table for f in group)


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_an_old_uniform_certify_file_plots_with_its_l1_certificate(version):
    # Its manifest said task "uniform" and no noise; read as Gaussian, it was plotted on an L2
    # axis without the n-limited radius. Upgraded, it is CERTIFY with uniform noise.
    from smoothcert.evaluation.plots import _radius_norm, n_limited_radius
    from smoothcert.noise import Uniform

    records = read_records(FIXTURES / "records" / f"{version}_certify_uniform.tsv")
    assert _radius_norm([records]) == "L1"
    assert n_limited_radius(records) == Uniform(0.25).radius(0.001 ** (1 / 300))


# --------------------------------------------------------------------------- checkpoints
def test_an_old_checkpoint_loads_in_the_current_format():
    before = CHECKPOINT.read_bytes()
    checkpoint = load_checkpoint(CHECKPOINT)
    assert checkpoint.meta["num_hparams"] == 1
    assert checkpoint.train_state["per_example_sigma"] is None
    assert checkpoint.meta["config"]["format_version"] == CONFIG_VERSION
    stored = TrainConfig.from_dict(checkpoint.meta["config"])
    assert stored == TrainConfig.from_dict(
        yaml.safe_load((FIXTURES / "configs" / "v1_first_run.yaml").read_text()))
    assert (stored.noise, stored.sigma_mode, stored.train_size) == ("gaussian", "fixed", None)
    assert CHECKPOINT.read_bytes() == before


def test_an_old_checkpoint_resumes_training():
    from smoothcert.training.loop import _check_same_config
    from smoothcert.training.trainer import Trainer

    checkpoint = load_checkpoint(CHECKPOINT)
    config = TrainConfig.from_dict(checkpoint.meta["config"])
    _check_same_config(config, checkpoint.meta, CHECKPOINT)  # the run it was is the run asked
    trainer = Trainer(config)
    trainer.load(checkpoint)
    assert trainer.epoch == 1


def test_the_checkpoint_chain_composes_and_refuses_a_newer_version():
    import torch

    obj = torch.load(CHECKPOINT, weights_only=True)
    assert obj["format_version"] == 1
    once = upgrade_checkpoint(obj)
    assert once["format_version"] == CHECKPOINT_VERSION
    assert upgrade_checkpoint(once) == once
    stepped = _CHECKPOINT_STEPS[0](obj)
    assert stepped["meta"]["num_hparams"] == 1 and "format_version" not in stepped["meta"]
    with pytest.raises(SmoothcertError, match="checkpoint format version 3 is newer"):
        upgrade_checkpoint({**obj, "format_version": 3})


def test_an_imported_checkpoints_config_is_left_as_imported():
    obj = {"format": "smoothcert-checkpoint", "format_version": 1, "state_dict": {},
           "train_state": None, "meta": {"imported_from": {"format": "cohen"}, "method": {
               "name": "gaussian", "hparams": {}}, "config": {"format": "cohen", "sigma": 0.25}}}
    assert upgrade_checkpoint(obj)["meta"]["config"] == {"format": "cohen", "sigma": 0.25}


# --------------------------------------------------------------------------- configs and recipes
CONFIGS = {
    "v1_first_run": {},
    "v1_step4_fmnist_lenet": {},
    "v1_dd_keys_fixed": {},
    "v1_dd_keys_data_dependent": {"num_steps": 1, "step_size": 1e-4, "num_samples": 1,
                                  "start_epoch": 4},
    "v1_sigma_mode_params": {},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_an_old_config_yaml_reads_as_the_config_it_ran(name):
    old = yaml.safe_load((FIXTURES / "configs" / f"{name}.yaml").read_text())
    config = TrainConfig.from_dict(old)
    assert config.sigma_mode_params == CONFIGS[name]
    assert config.sigma_mode == ("data_dependent" if CONFIGS[name] else "fixed")
    current = config.to_dict()
    assert current["format_version"] == CONFIG_VERSION and not any(k.startswith("dd_")
                                                                   for k in current)
    assert TrainConfig.from_dict(current) == config
    for key, value in old.items():  # every other field as stored
        if not key.startswith("dd_") and key not in ("lr_milestones", "method_params"):
            assert current[key] == value, key


def test_the_config_chain_composes():
    old = yaml.safe_load((FIXTURES / "configs" / "v1_dd_keys_data_dependent.yaml").read_text())
    assert upgrade_config(old) == {**_CONFIG_STEPS[0](old), "format_version": 2}
    assert upgrade_config(upgrade_config(old)) == upgrade_config(old)
    with pytest.raises(SmoothcertError, match="config format version 3 is newer"):
        upgrade_config({**old, "format_version": 3})


def test_a_recipe_with_the_old_keys_loads(tmp_path):
    fields = load_recipe(FIXTURES / "recipes" / "gaussian_dd_s050.yaml")
    assert fields["format_version"] == CONFIG_VERSION and "dd_steps" not in fields
    assert fields["sigma_mode_params"] == {"num_steps": 1, "step_size": 1e-4, "num_samples": 1,
                                           "start_epoch": 4}
    config = TrainConfig.from_dict(fields)
    assert (config.sigma_mode, config.train_size, config.epochs) == ("data_dependent", 10000, 18)


def test_the_data_dependent_recipe_in_either_spelling(tmp_path):
    path = FIXTURES / "recipes" / "gaussian_dd_s050.yaml"
    old = TrainConfig.from_dict(load_recipe(path))
    text = "".join(line for line in path.read_text().splitlines(keepends=True)
                   if not line.startswith("dd_"))
    (tmp_path / "new.yaml").write_text(
        text.replace("base: _schedule.yaml", f"base: {path.parent / '_schedule.yaml'}")
        + "format_version: 2\nsigma_mode_params: {start_epoch: 4}\n")
    assert TrainConfig.from_dict(load_recipe(tmp_path / "new.yaml")) == old


def test_a_recipe_is_upgraded_from_the_oldest_version_in_its_chain(tmp_path):
    # the old keys in a base apply under the σ mode its (newer) child sets
    (tmp_path / "base.yaml").write_text("dataset: digits\narch: digits_cnn\nepochs: 3\n"
                                        "dd_steps: 2\n")
    (tmp_path / "run.yaml").write_text("base: base.yaml\nformat_version: 2\nsigma: 0.25\n"
                                       "sigma_mode: data_dependent\n")
    assert load_recipe(tmp_path / "run.yaml")["sigma_mode_params"] == {"num_steps": 2}
    (tmp_path / "new.yaml").write_text("format_version: 2\ndataset: digits\ndd_steps: 2\n")
    with pytest.raises(SmoothcertError, match="unknown config key.*dd_steps"):
        TrainConfig.from_dict({**load_recipe(tmp_path / "new.yaml"), "arch": "digits_cnn",
                               "sigma": 0.25, "epochs": 1})
    (tmp_path / "future.yaml").write_text("format_version: 9\ndataset: digits\n")
    with pytest.raises(SmoothcertError, match="future.yaml: config format version 9 is newer"):
        load_recipe(tmp_path / "future.yaml")


# --------------------------------------------------------------------------- old spellings
DIGITS = dict(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=3)


def test_old_certifier_names_warn_once_and_name_the_new_spelling(caplog):
    with caplog.at_level(logging.WARNING, logger=DEPRECATION):
        assert certifier_spelling("data-dependent-uniform", None) == ("data-dependent",
                                                                     "uniform")
        assert certifier_spelling("certify", "uniform") == ("certify", "uniform")
    assert len(caplog.records) == 1
    assert "--certifier data-dependent --noise uniform" in caplog.records[0].getMessage()
    with pytest.raises(SmoothcertError, match="'uniform' already implies noise 'uniform', not "
                                              "'discrete-gaussian'"):
        certifier_spelling("uniform", "discrete-gaussian")


def test_old_train_keywords_warn_once_and_equal_the_new_spelling(caplog):
    params = {"num_steps": 2, "step_size": 0.01, "num_samples": 1, "start_epoch": 1}
    with caplog.at_level(logging.WARNING, logger=DEPRECATION):
        old = TrainConfig(**DIGITS, sigma_mode="data_dependent", dd_steps=2, dd_step_size=0.01,
                          dd_start_epoch=1)
    assert old == TrainConfig(**DIGITS, sigma_mode="data_dependent", sigma_mode_params=params)
    assert len(caplog.records) == 1
    assert "TrainConfig(dd_steps=2), TrainConfig(dd_step_size=0.01)" in caplog.text
    assert "sigma_mode_params={'num_steps': 2}" in caplog.text
    with pytest.raises(SmoothcertError, match=r"disagree \(dd_steps=3 vs sigma_mode_params "
                                              r"num_steps=2\)"):
        TrainConfig(**DIGITS, sigma_mode="data_dependent", dd_steps=3,
                    sigma_mode_params={"num_steps": 2})


def test_old_train_keywords_under_another_sigma_mode_are_ignored_and_said_so(caplog):
    with caplog.at_level(logging.WARNING, logger=DEPRECATION):
        assert TrainConfig(**DIGITS, dd_steps=5) == TrainConfig(**DIGITS)
    assert "ignored: they apply to sigma_mode data_dependent only" in caplog.text


def test_the_cli_takes_an_old_certifier_name_with_one_line(tmp_path, caplog):
    from smoothcert.cli import main

    out = tmp_path / "r.tsv"
    with caplog.at_level(logging.WARNING, logger=DEPRECATION):
        assert main(["certify", str(CHECKPOINT), "--certifier", "uniform", "--n0", "20", "--n",
                     "300", "--skip", "90", "--max", "2", "--out", str(out), "--no-progress",
                     "--device", "cpu"]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == DEPRECATION]
    assert len(said) == 1 and "\n" not in said[0]
    assert "--certifier certify --noise uniform" in said[0]
    assert read_manifest(out)["identity"]["noise"] == "uniform"


def test_the_cli_takes_the_old_sigma_flags_with_one_line(tmp_path, caplog):
    from smoothcert.cli.app import build_parser
    from smoothcert.cli.train import _train_fields

    args = build_parser().parse_args([
        "train", "--out", str(tmp_path), "--dataset", "digits", "--arch", "digits_cnn",
        "--sigma", "0.25", "--epochs", "3", "--sigma-mode", "data_dependent", "--dd-steps", "4",
        "--dd-start-epoch", "1"])
    with caplog.at_level(logging.WARNING, logger=DEPRECATION):
        config = TrainConfig.from_dict(_train_fields({}, args))
    said = [r.getMessage() for r in caplog.records if r.name == DEPRECATION]
    assert len(said) == 1
    assert "--dd-steps 4, --dd-start-epoch 1" in said[0]
    assert "--sigma-param num_steps=4, --sigma-param start_epoch=1" in said[0]
    assert config.sigma_mode_params == {"num_steps": 4, "step_size": 1e-4, "num_samples": 1,
                                        "start_epoch": 1}
