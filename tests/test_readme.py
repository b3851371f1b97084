"""The README's Python example runs as written (CI keeps the docs honest)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "__readme__"})
    assert "certified L2 radius" in capsys.readouterr().out


def test_readme_opens_with_the_two_commands():
    first_block = README.read_text().split("```")[1]
    assert "make demo" in first_block and "make test" in first_block
