"""The README's API example runs as written, at a small hidden size and vocabulary (the shapes it prints stay)."""

import re
from pathlib import Path

SIZES = "R, B, K, d, V = 4, 15, 16, 4096, 151936"


def test_readme_api_example_runs():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    assert SIZES in code  # the example's sizes, replaced below by a small d and V
    scope: dict = {}
    exec(compile(code.replace(SIZES, "R, B, K, d, V = 4, 15, 16, 64, 1000"), "README.md", "exec"), scope)
    assert scope["scores"].shape == (4, 14, 16, 16)
    assert scope["ranks"].shape == scope["tokens"].shape == scope["ranks_geo"].shape == (4, 15)
