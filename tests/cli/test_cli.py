"""End-to-end CLI tests on the embedded digits data: train → certify → report, resume, shards,
and every bad input of the step-1 issue (one line on stderr, exit code 2, no half-written file)."""

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import dying_writer, write_checkpoint
from smoothcert.cli.app import main
from smoothcert.runs.records import read_records

RUN = ["--n0", "20", "--n", "200", "--batch", "64", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "run"
    assert main(["train", "--dataset", "digits", "--arch", "digits_cnn", "--method", "gaussian",
                 "--sigma", "0.25", "--epochs", "6", "--batch", "64", "--lr", "0.05",
                 "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    return out / "checkpoint.pt"


def certify(checkpoint, out, *extra):
    return main(["certify", str(checkpoint), *RUN, "--max", "12", "--out", str(out), *extra])


def rows_without_time(path):
    rec = read_records(path)
    return [{k: v for k, v in r.items() if k != "time"} for r in rec.rows()]


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for name in ("train", "certify", "predict", "report", "merge", "demo"):
        assert name in text


def test_train_certify_report_smoke(checkpoint, tmp_path, capsys):
    out = tmp_path / "c.tsv"
    assert certify(checkpoint, out, "--sigma", "0.25") == 0
    rec = read_records(out)
    assert list(rec["idx"]) == list(range(12))
    assert rec.columns_order[:6] == ("idx", "label", "predict", "radius", "correct", "time")
    assert rec.manifest["identity"]["n"] == 200 and rec.manifest["provenance"]["versions"]
    assert rec["correct"].mean() > 0.5  # a trained digits model, even after 2 epochs
    capsys.readouterr()
    assert main(["report", str(out), "--radii", "0:0.5:0.25", "--format", "csv",
                 "--plot", str(tmp_path / "p.png")]) == 0
    assert "r=0.25" in capsys.readouterr().out
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_predict_writes_records(checkpoint, tmp_path):
    out = tmp_path / "p.tsv"
    assert main(["predict", str(checkpoint), "--n", "100", "--alpha", "0.01", "--batch", "50",
                 "--max", "5", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    rec = read_records(out)
    assert len(rec) == 5 and "pvalue" in rec and "radius" not in rec


def test_interrupted_then_resumed_equals_uninterrupted(checkpoint, tmp_path, monkeypatch):
    full, cut = tmp_path / "full.tsv", tmp_path / "cut.tsv"
    assert certify(checkpoint, full) == 0
    restore = dying_writer(monkeypatch, rows=5, torn="5\t3\t3\t0.2")
    assert certify(checkpoint, cut) == 130
    restore()
    assert len(read_records(cut)) == 5
    assert certify(checkpoint, cut) == 0
    assert rows_without_time(cut) == rows_without_time(full)


def test_sigkill_then_rerun_gives_each_index_once(checkpoint, tmp_path):
    """The issue's acceptance check, with a real process and SIGKILL. Only the killed run needs
    a process of its own; the rerun and the reference run in this one (the same code). One
    torch thread in the child: two cost it 8× on this shared 2-core machine."""
    out = tmp_path / "k.tsv"
    args = ["certify", str(checkpoint), "--n0", "20", "--n", "3000", "--batch", "500",
            "--max", "40", "--no-progress", "--device", "cpu", "--out"]
    proc = subprocess.Popen([sys.executable, "-m", "smoothcert.cli", *args, str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 4:  # header + 3 rows
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"  # ~75 ms a row
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert main([*args, str(out)]) == 0
    reference = tmp_path / "ref.tsv"
    assert main([*args, str(reference)]) == 0
    assert list(read_records(out)["idx"]) == list(range(40))
    assert rows_without_time(out) == rows_without_time(reference)


def test_shards_then_merge_equal_one_run(checkpoint, tmp_path, monkeypatch):
    single = tmp_path / "one.tsv"
    assert certify(checkpoint, single) == 0
    for k in range(3):
        assert certify(checkpoint, tmp_path / "s.tsv", "--num-shards", "3", "--shard-index",
                       str(k)) == 0
    shards = sorted(tmp_path.glob("s.shard*-of-3.tsv"))
    assert len(shards) == 3
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "m.tsv")]) == 0
    assert rows_without_time(tmp_path / "m.tsv") == rows_without_time(single)
    # torchrun's environment picks the shard when the flags are absent
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert certify(checkpoint, tmp_path / "env.tsv") == 0
    assert list(read_records(tmp_path / "env.shard1-of-2.tsv")["idx"]) == [1, 3, 5, 7, 9, 11]


# --------------------------------------------------------------------------- bad input
def certify_bad(checkpoint, out, *extra):
    return main(["certify", str(checkpoint), *RUN, "--max", "3", "--out", str(out), *extra])


BAD_CERTIFY = {
    "sigma zero": (["--sigma", "0"], "sigma"),
    "sigma negative": (["--sigma", "-0.5"], "sigma"),
    "sigma nan": (["--sigma", "nan"], "sigma"),
    "sigma inf": (["--sigma", "inf"], "sigma"),
    "alpha zero": (["--alpha", "0"], "alpha"),
    "alpha one": (["--alpha", "1.5"], "alpha"),
    "n0 zero": (["--n0", "0"], "n0"),
    "n zero": (["--n", "0"], "n must"),
    "batch zero": (["--batch", "0"], "batch"),
    "unknown dataset": (["--dataset", "imagenet21k"], "unknown dataset 'imagenet21k'; known:"),
    "bad shard": (["--num-shards", "2", "--shard-index", "2"], "shard-index"),
    "not a number": (["--n", "many"], "invalid int value"),
}


@pytest.mark.parametrize("case", sorted(BAD_CERTIFY))
def test_bad_certify_input_one_line_exit_2(case, checkpoint, tmp_path, capsys):
    extra, match = BAD_CERTIFY[case]
    out = tmp_path / "bad.tsv"
    assert certify_bad(checkpoint, out, *extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err
    assert not out.exists()


def test_bad_checkpoints(tmp_path, capsys):
    out = tmp_path / "bad.tsv"
    good = write_checkpoint(tmp_path / "good.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    foreign = tmp_path / "foreign.pth.tar"
    torch.save({"arch": "cifar_resnet110", "state_dict": {"1.fc.weight": torch.zeros(2)}},
               foreign)
    for path, match in [(tmp_path / "missing.pt", "missing.pt"), (truncated, "truncated"),
                        (foreign, "checkpoint")]:
        assert certify_bad(path, out) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err, err
    assert not out.exists()


def test_num_classes_and_input_shape_mismatch(tmp_path, capsys):
    out = tmp_path / "bad.tsv"
    five = write_checkpoint(tmp_path / "five.pt", num_classes=5)
    assert certify_bad(five, out) == 2
    assert "num_classes mismatch" in capsys.readouterr().err
    lenet = write_checkpoint(tmp_path / "lenet.pt", arch="lenet", input_shape=(1, 28, 28))
    assert certify_bad(lenet, out) == 2
    assert "shape" in capsys.readouterr().err
    assert not out.exists()


def test_resume_with_other_configuration_and_unwritable_output(checkpoint, tmp_path, capsys):
    out = tmp_path / "r.tsv"
    assert certify_bad(checkpoint, out) == 0
    before = out.read_bytes()
    assert certify_bad(checkpoint, out, "--alpha", "0.01") == 2
    assert "different configuration" in capsys.readouterr().err
    assert out.read_bytes() == before
    # a missing folder is created (as train creates its run folder); a file in the way is not
    assert certify_bad(checkpoint, tmp_path / "new" / "dir" / "r.tsv") == 0
    assert certify_bad(checkpoint, out / "r.tsv") == 2
    assert "a file is in the way" in capsys.readouterr().err
    if os.geteuid() != 0:  # root can write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert certify_bad(checkpoint, locked / "r.tsv") == 2


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--dataset", "nope"], "unknown dataset 'nope'; known:"),
        (["--arch", "nope"], "unknown arch"),
        (["--method", "nope"], "unknown method 'nope'; known:"),
        (["--sigma", "-1"], "sigma"),
        (["--epochs", "0"], "epochs"),
    ],
)
def test_bad_train_input(extra, match, tmp_path, capsys):
    args = ["train", "--dataset", "digits", "--arch", "digits_cnn", "--method", "gaussian",
            "--sigma", "0.25", "--epochs", "1", "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(args + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_report_and_merge_bad_input(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none.tsv")]) == 2
    assert main(["report", str(tmp_path / "none.tsv"), "--radii", "1:0:0.1"]) == 2
    assert main(["merge", str(tmp_path / "none.tsv"), "--out", str(tmp_path / "m.tsv")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith("smoothcert ") for line in lines)


def test_console_script_exit_code(tmp_path):
    script = Path(sys.executable).parent / "smoothcert"
    exe = [str(script)] if script.exists() else [sys.executable, "-m", "smoothcert.cli"]
    done = subprocess.run(exe + ["certify", str(tmp_path / "x.pt"), "--out", "o.tsv"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1


# --------------------------------------------------------------------------- help
def subparsers():
    from smoothcert.cli.app import build_parser

    (action,) = [a for a in build_parser()._actions if a.dest == "command"]
    return action.choices  # name -> the subcommand's parser


def test_every_command_and_analysis_is_in_the_registry_that_builds_the_parser():
    from smoothcert.cli.analyze import ANALYSES
    from smoothcert.cli.common import COMMANDS, Command
    from smoothcert.registry import Registry

    assert isinstance(COMMANDS, Registry) and isinstance(ANALYSES, Registry)
    assert list(subparsers()) == list(COMMANDS)
    assert all(isinstance(c, Command) for c in [*COMMANDS.values(), *ANALYSES.values()])
    with pytest.raises(Exception, match="unknown command 'nope'; known: analyze, attack"):
        COMMANDS["nope"]


def train_help(capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "250")  # one line per listed name
    assert main(["train", "--help"]) == 0
    return capsys.readouterr().out


def listed_names(text: str) -> dict[str, dict[str, str]]:
    """Per listing after the options (``--flag NAME``), its rows ``  NAME  DESCRIPTION``."""
    listings: dict[str, dict[str, str]] = {}
    rows, name = {}, ""
    for line in text.split("\nnames", 1)[1].splitlines():
        if line.startswith("--"):
            rows = listings.setdefault(line.split()[0], {})
        elif line.startswith("   "):  # a long description's next line
            rows[name] += " " + line.strip()
        elif line.startswith("  "):
            name, *description = line.split(None, 1)
            rows[name] = description[0] if description else ""
    return listings


def test_train_help_lists_every_registered_name_with_a_description(capsys, monkeypatch):
    from smoothcert.data.registry import DATASETS
    from smoothcert.methods import METHODS
    from smoothcert.models import MODELS
    from smoothcert.noise.base import NOISES
    from smoothcert.registry import describe_options
    from smoothcert.training import SCHEDULES
    from smoothcert.training.sigma_modes import SIGMA_MODES

    listed = listed_names(train_help(capsys, monkeypatch))
    registries = {"--dataset": DATASETS, "--arch": MODELS, "--method": METHODS,
                  "--noise": NOISES, "--sigma-mode": SIGMA_MODES, "--lr-schedule": SCHEDULES}
    assert set(listed) == set(registries)
    for flag, registry in registries.items():
        assert list(listed[flag])[: len(registry)] == list(registry), flag
        assert all(listed[flag].values()), flag
    assert list(listed["--arch"])[len(MODELS):] == ["torchvision:NAME", "timm:NAME"]
    assert all(listed["--arch"][zoo] for zoo in ("torchvision:NAME", "timm:NAME"))
    method = listed["--method"]["gaussian"]
    assert method.startswith("Cohen, Rosenfeld & Kolter, ICML 2019: train")
    for name, cls in METHODS.items():  # every hyperparameter, its type, default and doc
        assert all(line in listed["--method"][name] for line in describe_options(cls.Options))
    assert method.endswith("num_noise (int, default 1): m: noise copies per input (1: Cohen "
                           "et al.)")
    for name, cls in SIGMA_MODES.items():  # and every σ mode's parameters
        assert all(line in listed["--sigma-mode"][name] for line in describe_options(cls.Options))
    assert listed["--noise"]["uniform"].startswith("Uniform noise δ ~ U[−λ, λ]^d")
    assert listed["--dataset"]["digits"] == "10 classes, 1×8×8 inputs, held in memory"


def test_certify_help_lists_every_certifier_with_its_options_and_every_noise(capsys,
                                                                             monkeypatch):
    from smoothcert.certifiers import CERTIFIERS, certifying
    from smoothcert.noise.base import NOISES
    from smoothcert.registry import describe_options

    monkeypatch.setenv("COLUMNS", "250")  # one line per listed name
    assert main(["certify", "--help"]) == 0
    listed = listed_names(capsys.readouterr().out)
    assert list(listed) == ["--certifier", "--noise", "--transform"]  # --transform: test_tss_cli
    assert "attack" in CERTIFIERS and not CERTIFIERS["attack"].certifies
    assert sorted(listed["--certifier"]) == certifying()  # the attack has its own command
    assert list(listed["--noise"]) == list(NOISES)
    assert all(listed["--certifier"].values()) and all(listed["--noise"].values())
    for name in certifying():  # every option, its type, default and doc
        assert all(line in listed["--certifier"][name]
                   for line in describe_options(CERTIFIERS[name].Options))
    assert "radii (str, default auto):" in listed["--certifier"]["sequential"]


def test_train_help_has_a_flag_for_every_config_field_with_its_default(capsys, monkeypatch):
    import dataclasses

    from smoothcert.cli.catalog import field_flag
    from smoothcert.training import TrainConfig

    text = train_help(capsys, monkeypatch)
    actions = {a.dest: a for a in subparsers()["train"]._actions}
    for f in dataclasses.fields(TrainConfig):
        action, flag = actions[f.name], field_flag(f)
        assert flag in action.option_strings and flag in text
        assert action.default is argparse.SUPPRESS  # unset: the recipe's value stands
        if f.name in ("dataset", "arch", "epochs"):  # sigma: not for methods without noise
            assert action.help.endswith("; required (flag or --config)"), action.help
        elif f.default_factory is dict:
            assert action.metavar == "KEY=VALUE" and re.search(r"\bdefaults?\b", action.help)
        else:
            assert len(re.findall(r"\bdefault\b", action.help)) == 1, action.help
            assert " ".join(action.help.split()) in " ".join(text.split())
    # the default each flag's help shows is its field's: passed as the value, it parses to it
    parser, checked = subparsers()["train"], []
    shown = shown_defaults(parser)
    for f in dataclasses.fields(TrainConfig):
        flag = field_flag(f)
        if f.default in (dataclasses.MISSING, None):
            continue
        if isinstance(f.default, bool):  # a switch: --nesterov / --no-nesterov
            assert shown[flag] == ("on" if f.default else "off"), flag
            continue
        parsed = parser.parse_args([flag, shown[flag], "--out", "o"])
        assert getattr(parsed, f.name) == f.default, (flag, shown[flag])
        checked.append(f.name)
    assert {"batch_size", "noise", "method", "lr_milestones", "sigma_mode", "seed"} <= set(checked)
    for old in ("--batch", "--init-from", "--param", "--arch-param", "--lr-milestones",
                "--nesterov", "--image-size", "--dd-steps", "--dd-step-size", "--dd-num-samples",
                "--dd-start-epoch", "--sigma-param", "--noise"):  # every spelling still parses
        assert any(old in a.option_strings for a in actions.values()), old


@pytest.mark.parametrize("name", ["certify", "predict", "attack", "report", "merge", "analyze",
                                  "import-checkpoint", "demo", "train"])
def test_every_help_states_each_default_once(name):
    from smoothcert.cli.common import HelpFormatter

    parser = subparsers()[name]
    formatter = HelpFormatter(parser.prog)
    for action in parser._actions:
        shown = action.default not in (None, False, [], argparse.SUPPRESS)
        if action.help in (None, argparse.SUPPRESS) or not action.option_strings or not shown:
            continue
        text = formatter._get_help_string(action) % {"default": action.default}
        assert len(re.findall(r"\bdefault\b", text, re.I)) == 1, (action.option_strings, text)


def shown_defaults(parser) -> dict[str, str]:
    """The default that each option's --help shows, ``(default: X)`` or ``(default X)``, by the
    option's first flag (a help wrapped over several lines is joined first)."""
    entries, flag = {}, None
    body = parser.format_help().split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    for line in body.splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = line
        elif flag is not None:
            entries[flag] += " " + line.strip()
    found = {f: re.search(r"\(default:? ([^()]*)\)", text) for f, text in entries.items()}
    return {f: m.group(1) for f, m in found.items() if m}


def required_args(parser) -> list[str]:
    """A value for every required argument (and the first of a required group of options): its
    first choice, else "1", which reads as a number or a path."""
    groups = [g._group_actions[0] for g in parser._mutually_exclusive_groups if g.required]
    args = []
    for action in [a for a in parser._actions if a.required] + groups:
        value = next(iter(action.choices)) if action.choices else "1"
        args += [*action.option_strings[:1], value]
    return args


@pytest.mark.parametrize("name", ["certify", "predict", "attack", "report", "demo"])
def test_each_default_the_help_shows_is_the_one_the_command_runs_with(name, monkeypatch):
    """Every option with a default shows one in --help, and passing that shown value gives the
    same arguments as leaving the option out. A shown default that is prose rather than a value
    (--certifier's "Cohen et al.'s CERTIFY") does not parse and is left out of the check."""
    monkeypatch.setenv("COLUMNS", "250")  # one help line per option, as a wide terminal
    parser = subparsers()[name]
    shown, required = shown_defaults(parser), required_args(parser)
    omitted, checked = parser.parse_args(required), []
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, [], argparse.SUPPRESS):
            continue
        flag = action.option_strings[0]
        assert flag in shown, f"{name} {flag}: its default {action.default!r} is not shown"
        try:
            explicit = parser.parse_args([*required, flag, shown[flag]])
        except SystemExit:  # prose
            continue
        assert explicit == omitted, (flag, shown[flag])
        checked.append(flag)
    assert checked  # the check ran on real values: e.g. certify's --alpha, --batch, --split


def test_report_runs_with_the_radii_its_help_shows(tmp_path, capsys, monkeypatch):
    """report's --radii defaults to None, resolved when it runs: the table without the flag is
    the table with the grid the help shows."""
    from conftest import COHEN_ROWS

    path = tmp_path / "cohen.tsv"
    lines = ["idx\tlabel\tpredict\tradius\tcorrect\ttime", *("\t".join(map(str, row))
                                                             for row in COHEN_ROWS)]
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("COLUMNS", "250")
    radii = shown_defaults(subparsers()["report"])["--radii"]
    assert main(["report", str(path)]) == 0
    plain = capsys.readouterr().out
    assert main(["report", str(path), "--radii", radii]) == 0
    assert capsys.readouterr().out == plain and "r=0.25" in plain


def test_discrete_gaussian_refuses_off_grid_digits_and_certifies_them_quantized(
        checkpoint, tmp_path, capsys):
    """digits' pixels are multiples of 1/16, not of 1/255: one line, exit 2, no file; the
    quantized noise certifies them and its name is in the record."""
    out = tmp_path / "d.tsv"
    assert certify(checkpoint, out, "--sigma", "0.25", "--noise", "discrete-gaussian") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "8-bit grid" in err[0] and not list(tmp_path.iterdir())
    assert certify(checkpoint, out, "--sigma", "0.25", "--noise",
                   "discrete-gaussian-quantized") == 0
    rec = read_records(out)
    assert rec.manifest["identity"]["noise"] == "discrete-gaussian-quantized"
    assert rec["correct"].mean() > 0.5
