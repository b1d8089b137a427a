"""Shared fixtures: output poisoning and both backends (the helpers they build on live in tests/helpers/)."""

from __future__ import annotations

import pytest

import dcoco
from dcoco.ops import fused


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every op output starts as NaN / -1, so an element the core fails to write shows up."""
    monkeypatch.setattr(fused, "POISON", True)


def pytest_collection_modifyitems(config, items):
    """@pytest.mark.fused_only tests (the raw compiled ops) run only under the fused parameter of each_backend."""
    drop = [i for i in items if i.get_closest_marker("fused_only") and getattr(i, "callspec", None)
            and i.callspec.params.get("each_backend") == "native"]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]


@pytest.fixture(params=["fused", "native"])
def each_backend(request):
    """Runs a test once per backend (a module opts in with pytestmark = pytest.mark.usefixtures("each_backend"))."""
    with dcoco.use_backend(request.param):
        yield request.param
