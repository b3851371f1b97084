"""The README's Python example runs as written (CI keeps the docs honest)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (example,) = [b for b in blocks if "smoothed.certify(" in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, str(README), "exec"), {"__name__": "__readme__"})
    assert "certified L2 radius" in capsys.readouterr().out


def test_readme_opens_with_the_two_commands():
    first_block = README.read_text().split("```")[1]
    assert "make demo" in first_block and "make test" in first_block


def test_readme_image_folder_example_runs(tmp_path, monkeypatch, capsys):
    """The certify_dataset example, on a folder of two classes of two images each, with its
    Monte Carlo budget shrunk (n0 = 100 → 4, n = 100,000 → 16) so that it runs in seconds."""
    import numpy as np
    from PIL import Image

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (example,) = [b for b in blocks if "certify_dataset(" in b]
    small = example.replace("n0=100,", "n0=4,").replace("n=100_000,", "n=16,")
    assert small.count("=4,") == 1 and "n=16," in small
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
