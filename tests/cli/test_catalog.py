"""The command line answers without torch: ``--help``, ``--version``, every ``CMD --help`` and
argparse's one-line errors read the names they offer from ``smoothcert/cli/catalog.json``, a
snapshot of the registries that these tests hold equal to them (regenerate it with
``python -m smoothcert.cli.catalog``), and give the same help as the registries themselves."""

import contextlib
import io
import json
import subprocess
import sys

import pytest

from smoothcert.cli import catalog
from smoothcert.cli.app import main

REGENERATE = "regenerate it with: python -m smoothcert.cli.catalog"
HELPS = [[], ["train"], ["certify"], ["predict"], ["attack"], ["analyze"],
         ["analyze", "grad-norms"], ["analyze", "easy-hard"], ["report"], ["merge"],
         ["import-checkpoint"], ["demo"]]
# (argv, what its one line on stderr says): argparse's own refusals, each exit code 2
REFUSED = [
    (["certify", "c.pt", "--out", "r.tsv", "--sigmaa", "0.25"], "unrecognized arguments"),
    (["certify", "c.pt", "--out", "r.tsv", "--noise", "nope"], "invalid choice: 'nope'"),
    (["certify", "c.pt", "--certifier", "nope", "--out", "r.tsv"], "invalid choice: 'nope'"),
    (["certify", "c.pt"], "the following arguments are required: --out"),
    (["train", "--out", "o", "--epochs", "two"], "invalid int value: 'two'"),
    (["attack", "c.pt", "--out", "r.tsv"], "one of the arguments --epsilon --min-distance"),
    (["report", "r.tsv", "--norm", "l3"], "invalid choice: 'l3'"),
    (["import-checkpoint", "f.pth", "--format", "nope", "--out", "o"], "invalid choice"),
    (["nope"], "invalid choice: 'nope'"),
]


@pytest.mark.parametrize("section", sorted(catalog.SECTIONS))
def test_the_snapshot_is_the_registries(section):
    """Each section of catalog.json is what the registries give now: a plug-in added, renamed
    or redocumented (or a TrainConfig field) without regenerating it fails here."""
    assert catalog.snapshot()[section] == catalog.live()[section], \
        f"catalog.json's {section!r} differs from the registries; {REGENERATE}"


def test_the_snapshot_file_is_as_written():
    """Byte for byte what ``python -m smoothcert.cli.catalog`` writes, with no other section."""
    assert set(catalog.snapshot()) == set(catalog.SECTIONS), REGENERATE
    assert catalog.main(["--check"]) == 0, REGENERATE


def helps() -> dict[str, str]:
    """Every command's and analysis' --help (and the top level's), 250 columns wide."""
    out = {}
    for argv in HELPS:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert main([*argv, "--help"]) == 0
        out[" ".join(argv)] = text.getvalue()
    return out


def test_help_from_the_snapshot_is_the_help_from_the_registries(monkeypatch):
    """The help a process without torch prints (from the snapshot) is the one the registries
    give: every certifier with its options, every method, noise, dataset and architecture."""
    monkeypatch.setenv("COLUMNS", "250")
    live = helps()
    monkeypatch.setattr(catalog, "registries_loaded", lambda: False)
    assert helps() == live
    assert "--certifier NAME" in live["certify"] and "--method NAME" in live["train"]


SCRIPT = """
import contextlib, io, json, sys
from smoothcert.cli import main  # as the console script: the package first
assert "torch" not in sys.modules, "import smoothcert.cli"
runs = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    runs.append([argv, code, err.getvalue(), "torch" in sys.modules])
print(json.dumps(runs))
"""


def test_help_version_and_usage_errors_do_not_import_torch():
    """In a fresh process (the console script's imports): --version, --help, every
    ``CMD --help`` and argparse's refusals import no torch; each refusal is one line on
    stderr and exit code 2."""
    argvs = [["--version"], *([*argv, "--help"] for argv in HELPS), *(a for a, _ in REFUSED)]
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(argvs)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)
    assert [argv for argv, _, _, torch in runs if torch] == []
    assert all(code == 0 for _, code, _, _ in runs[: 1 + len(HELPS)])
    for (argv, code, err, _), (_, said) in zip(runs[1 + len(HELPS):], REFUSED):
        assert code == 2 and err.count("\n") == 1 and said in err, (argv, err)


def test_the_package_imports_torch_only_for_its_public_names():
    """``import smoothcert`` is lazy (PEP 562): its public names import their modules on first
    use, and ``__all__`` names each one."""
    script = ("import sys, smoothcert; assert 'torch' not in sys.modules; "
              "from smoothcert import Smoothed, __version__; assert 'torch' in sys.modules; "
              "assert all(getattr(smoothcert, n) is not None for n in smoothcert.__all__); "
              "assert set(smoothcert.__all__) <= set(dir(smoothcert))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
