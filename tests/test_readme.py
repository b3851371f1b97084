"""The README runs as written (CI keeps the docs honest): its shell commands top to bottom, each
using what an earlier one made, and its Python examples."""

import dataclasses
import glob
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smoothcert.cli.app import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NEEDS = "# needs:"  # a bash block holding this line uses what a reader brings: not run here
USES_FMNIST = "# uses: Fashion-MNIST"  # a block run (sizes shrunk) where its files are here
FMNIST = Path("/usr/share/datasets/fashion-mnist")


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (example,) = [b for b in blocks if "smoothed.certify(" in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, str(README), "exec"), {"__name__": "__readme__"})
    assert "certified L2 radius" in capsys.readouterr().out


# The Python API of the other noises and certificates (issue 45): each block as written, in
# seconds (the DSRS one trains the Python section's digits model, ~2 s, unless it is there).
API_BLOCKS = {
    "Laplace(0.5).radius(": ["0.5690222308904", "'linf'"],
    'certifier="dsrs"': ["image 0, label 5: predicted", "(P alone: "],
    "certify_median(": ["0.168622437549", "[ 0  1 -1 -1]"],
}


@pytest.mark.parametrize("marker", list(API_BLOCKS))
def test_readme_python_api_examples_run(marker, tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (example,) = [b for b in blocks if marker in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, str(README), "exec"), {"__name__": "__readme__"})
    said = capsys.readouterr().out
    assert all(text in said for text in API_BLOCKS[marker]), said


def test_readme_opens_with_the_two_commands():
    first_block = README.read_text().split("```")[1]
    assert "make demo" in first_block and "make test" in first_block


def test_readme_image_folder_example_runs(tmp_path, monkeypatch, capsys):
    """The certify_dataset example, on a folder of two classes of two images each, with its
    Monte Carlo budget shrunk (n0 = 100 → 2, n = 100,000 → 4: a ResNet-18 at 224×224 costs
    ~50 ms a draw on a CPU core) so that it runs in a second."""
    import numpy as np
    from PIL import Image

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (example,) = [b for b in blocks if "ImageFolder(" in b]
    small = example.replace("n0=100,", "n0=2,").replace("n=100_000,", "n=4,")
    assert small.count("n0=2,") == 1 and small.count(" n=4,") == 1
    for c, name in enumerate(("cats", "dogs")):
        folder = tmp_path / "my_images" / "val" / name
        folder.mkdir(parents=True)
        for i in range(2):
            pixels = np.random.default_rng(10 * c + i).integers(0, 256, (40, 30, 3), np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.jpg")
    monkeypatch.chdir(tmp_path)
    exec(compile(small, str(README), "exec"), {"__name__": "__readme__"})
    assert "certified at r=0.5" in capsys.readouterr().out
    assert len((tmp_path / "runs" / "my_images.tsv").read_text().splitlines()) == 5


# --------------------------------------------------------------------------- shell commands
# How the README's commands are shrunk to run here in seconds, on the embedded data (nothing
# else is changed; the rules are checked to have applied, so a README edit cannot dodge them):
#   --dataset fashion-mnist → digits and --arch lenet → digits_cnn (a --config recipe of
#       fashion-mnist gets both flags appended; one of a denoiser, a DDPM or ablation smoothing
#       keeps its arch, which takes 8×8 digits too): digits needs no download;
#   --epochs → 1 (a command without one keeps its recipe's: HEAT's 1);
#   --n → 200 (appended to certify and attack commands without one), --n0 → 20;
#   --max → 4 (the README's --skip 100 takes at most 4 of the 359 digits test images anyway);
#   --test-size → 100 (the test images a log's test columns are measured on);
#   --noise discrete-gaussian → discrete-gaussian-quantized: digits' 1/16 steps are not 8-bit;
#   train commands get --train-size 200 (a class-balanced subset of the 1,438 digits), and the
#       data-dependent certifier --opt num_steps=5 (OptimizeSigma's gradient steps per input).
# The commands run in a temporary folder with a link configs/ to the repository's recipes;
# `printf` lines run in bash. The first block's `make demo` runs first, as a newcomer's does: the
# Makefile's demo recipe, its sizes (smoothcert.cli.demo's TRAIN, N0, N, MAX) shrunk by the same
# rules; `make test` is what CI itself runs. Its activation line (`. .venv/bin/activate`) runs
# in a newcomer's fresh shell, a bash whose PATH lacks the venv (FRESH_PATH), in that folder with
# a link .venv to the venv running the tests: `smoothcert` must then be on PATH, from that venv
# (test_readme_activates_the_venv_in_a_fresh_shell); the smoothcert commands themselves run
# in-process, shrunk.
SHRUNK = {"--epochs": "1", "--n": "200", "--n0": "20", "--max": "4", "--test-size": "100"}
RENAMED = {("--dataset", "fashion-mnist"): "digits", ("--arch", "lenet"): "digits_cnn",
           ("--noise", "discrete-gaussian"): "discrete-gaussian-quantized"}
APPENDED = {"certify": ("--n",), "attack": ("--n",)}
ADDED = {"train": ["--train-size", "200"]}  # to a command
ADDED_CERTIFIER = {"data-dependent": ["--opt", "num_steps=5"]}  # to a --certifier
ACTIVATE = (".", "source")  # a line that sources a script: the README's activation
FRESH_PATH = "/usr/bin:/bin"  # a newcomer's shell: no venv, no ~/.local/bin, no /usr/local/bin


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def block_commands(block: str) -> list[tuple[str, list[str]]]:
    """(line, words) of every command of a block: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    lines = [(line.strip(), shlex.split(line, comments=True)) for line in joined.splitlines()]
    return [(line, words) for line, words in lines if words]


def runnable_commands() -> list[tuple[str, list[str]]]:
    """The commands of the blocks not marked ``# needs:``; a block marked :data:`USES_FMNIST`
    only where Fashion-MNIST's files are installed (Debian's dataset-fashion-mnist, which
    ``.ci/run`` installs where apt is usable)."""
    return [c for block in bash_blocks() if NEEDS not in block
            and (USES_FMNIST not in block or FMNIST.is_dir()) for c in block_commands(block)]


def shrunk(words: list[str]) -> list[str]:
    """A smoothcert command's arguments with the rules above applied."""
    out = list(words)
    for i, word in enumerate(out[:-1]):
        if word in SHRUNK:
            out[i + 1] = SHRUNK[word]
        elif (word, out[i + 1]) in RENAMED:
            out[i + 1] = RENAMED[word, out[i + 1]]
        elif word == "--config" and "/fashion-mnist/" in out[i + 1]:
            out += ["--dataset", "digits"] + (["--arch", "digits_cnn"]
                                              if recipe_arch(out[i + 1]) == "lenet" else [])
    for flag in APPENDED.get(out[0], ()):
        if flag not in out:
            out += [flag, SHRUNK[flag]]
    # a run on a record file's examples takes no subset (train refuses --train-size there)
    out += [] if "--label-records" in out else ADDED.get(out[0], [])
    if "--certifier" in words:
        out += ADDED_CERTIFIER.get(words[words.index("--certifier") + 1], [])
    return out


def recipe_arch(path: str) -> str | None:
    """The architecture a recipe trains (a denoiser's, a DDPM's or ablation_cnn is kept: each
    fits digits)."""
    from smoothcert.training.recipes import load_recipe

    return load_recipe(ROOT / path).get("arch")


def expanded(words: list[str]) -> list[str]:
    """Glob patterns expanded in the current folder, as the shell would."""
    return [m for w in words for m in (sorted(glob.glob(w)) if "*" in w else [w])]


def make_demo_args() -> list[str]:
    """The smoothcert arguments of `make demo`, read from the Makefile's demo recipe."""
    recipe = re.search(r"^demo:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    words = shlex.split(recipe.group(1))
    assert words[0] == "$(BIN)/smoothcert", f"make demo runs {recipe.group(1)!r}"
    return words[1:]


def shrink_demo(monkeypatch) -> None:
    """The demo's sizes, shrunk by the rules above (its train also gets ``ADDED["train"]``)."""
    import smoothcert.cli.demo as demo

    train_size = int(ADDED["train"][ADDED["train"].index("--train-size") + 1])
    monkeypatch.setattr(demo, "TRAIN", dataclasses.replace(
        demo.TRAIN, epochs=int(SHRUNK["--epochs"]), train_size=train_size))
    for name, flag in (("N", "--n"), ("N0", "--n0"), ("MAX", "--max")):
        monkeypatch.setattr(demo, name, int(SHRUNK[flag]))


def run_command(line: str, args: list[str], capsys) -> None:
    tic = time.perf_counter()
    code = main(args)
    print(f"{time.perf_counter() - tic:6.1f} s  {' '.join(args)}")
    assert code == 0, f"{line}\n→ smoothcert {' '.join(args)}\n{capsys.readouterr().err}"


def test_readme_commands_run_top_to_bottom(tmp_path, monkeypatch, capsys):
    """`make demo`, then every command of every runnable bash block exits 0, in order, in an
    empty folder: so each uses only what an earlier command made (runs/fmnist-g025 from the
    first train, ...), and no report takes the demo's digits records for the README's runs."""
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    shrink_demo(monkeypatch)
    demo = make_demo_args()
    demo_out = Path(demo[demo.index("--out") + 1])
    start, ran = time.perf_counter(), []
    for line, words in runnable_commands():
        if words == ["make", "demo"]:
            run_command(line, demo, capsys)
            ran.append("demo")
        if words[0] == "make":
            continue
        if words[0] == "printf":
            subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True)
            continue
        if words[0] in ACTIVATE:  # run in a fresh shell by the test below
            continue
        assert words[0] == "smoothcert", f"README runs {line!r}: mark its block {NEEDS!r}"
        args = expanded(shrunk(words[1:]))
        demos = [a for a in args[1:] if args[0] == "report" and Path(a).is_relative_to(demo_out)]
        assert not demos, f"{line!r} also reports make demo's {demos}: name the files it means"
        run_command(line, args, capsys)
        ran.append(args[0] if args else "--help")
    print(f"{len(ran)} README commands in {time.perf_counter() - start:.1f} s")
    assert ran[0] == "demo" and (tmp_path / demo_out / "certify.tsv").is_file()
    assert {"train", "certify", "attack", "report", "analyze"} <= set(ran)
    assert (tmp_path / "curve.png").is_file() and (tmp_path / "pa.png").is_file()
    assert "| name |" in (tmp_path / "paper.md").read_text()


def test_readme_activates_the_venv_in_a_fresh_shell(tmp_path):
    """After `make demo` the README's commands run as written in a new shell: its lines before
    the first smoothcert command (but `make`'s) run in a bash with nothing on PATH but
    FRESH_PATH, where smoothcert is not found, and leave `smoothcert` on PATH, the console script
    of the venv `make` made (here: the one running the tests), which answers --help."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"the tests run outside a venv ({venv}): nothing for the README to activate")
    commands = runnable_commands()
    first = next(i for i, (_, words) in enumerate(commands) if words[0] == "smoothcert")
    setup = [line for line, words in commands[:first] if words[0] != "make"]
    assert any(words[0] in ACTIVATE for _, words in commands[:first]), \
        "nothing in the README puts smoothcert on PATH before its first smoothcert command"
    (tmp_path / ".venv").symlink_to(venv)
    script = "\n".join([
        "if command -v smoothcert; then echo 'smoothcert is on the fresh PATH' >&2; exit 3; fi",
        *setup, "command -v smoothcert", "smoothcert --help > /dev/null"])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={"HOME": str(tmp_path), "PATH": FRESH_PATH})
    assert done.returncode == 0, f"{setup} in a fresh shell, then smoothcert:\n{done.stderr}"
    found = Path(done.stdout.split()[-1])
    assert found.resolve() == (venv / "bin" / "smoothcert").resolve(), found


def test_readme_shrinking_rules_apply():
    commands = [words for _, words in runnable_commands() if words[0] == "smoothcert"]
    assert all(shrunk(w[1:]).count("fashion-mnist") == 0 for w in commands)
    assert any("--init-from" in w for w in commands)  # the heat fine-tune uses a model made above
    trains = [shrunk(w[1:]) for w in commands if w[1] == "train"]
    assert trains and all(t[t.index("--epochs") + 1] == "1" for t in trains if "--epochs" in t)


def test_readme_commands_that_need_data_still_parse():
    """The blocks marked ``# needs:`` are not run, but their smoothcert commands (also under
    torchrun, after its ``--``) must still be valid command lines of today's CLI."""
    needs = [block for block in bash_blocks() if NEEDS in block]
    assert len(needs) >= 4  # ImageNet and folders, torchrun train, torchrun certify, SLURM
    parsed = 0
    for block in needs:
        for line, words in block_commands(block):
            if words[0] == "torchrun":
                words = words[words.index("--") + 1:]
            elif words[0] == "smoothcert":
                words = words[1:]
            else:
                continue
            try:
                build_parser().parse_args(words)
            except SystemExit as e:
                pytest.fail(f"README command does not parse ({e.code}): {line}")
            parsed += 1
    assert parsed >= 8


def test_readme_states_the_learning_rates_standard_trains_with():
    """`standard`'s learning rate as the README states it, without a recipe (the method's
    default: Salman et al.'s CIFAR-10 classifier) and with the Fashion-MNIST recipe its commands
    use (that dataset's LeNet schedule), is the one TrainConfig resolves."""
    from smoothcert.training import TrainConfig
    from smoothcert.training.recipes import load_recipe

    text = " ".join(README.read_text(encoding="utf-8").split())
    stated = re.search(r"SGD at (\S+) for classifiers", text)
    recipe = "configs/fashion-mnist/standard.yaml"
    stated_recipe = re.search(rf"`{recipe}` trains [^.]*?SGD at ([0-9.e-]+)", text)
    assert stated and stated_recipe, "the README states both learning rates of standard"
    plain = TrainConfig.from_dict({"dataset": "fashion-mnist", "arch": "lenet",
                                   "method": "standard", "epochs": 1})
    assert float(stated.group(1)) == plain.lr
    assert float(stated_recipe.group(1)) == TrainConfig.from_dict(load_recipe(ROOT / recipe)).lr


def test_readme_names_every_log_column_of_the_methods():
    """The README's account of a run's log.tsv names the test columns every method logs (the
    denoisers' test MSE, the DDPM's test loss; not only a "noisy test accuracy")."""
    from smoothcert.methods import METHODS

    text = " ".join(README.read_text(encoding="utf-8").split())
    account = text.split("Every run folder has", 1)[1].split(". ", 1)[0]
    for name in METHODS:
        for column in METHODS[name].test_columns:
            assert f"`{column}`" in account, (name, column)
