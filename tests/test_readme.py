"""The README's API example runs as written."""

import re
from pathlib import Path


def test_readme_api_example_runs():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["scores"].shape == (4, 14, 16, 16)
    assert scope["ranks"].shape == scope["tokens"].shape == scope["ranks_geo"].shape == (4, 15)
