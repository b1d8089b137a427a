"""The intervals of stats.py: tau with its bootstrap CI, paired ratios (the same prompts resampled for both
methods), and Wilson intervals for rates."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("scipy", reason="the intervals need scipy")

from dcoco.specdec import stats
from dcoco.specdec.engine import KS, Result


def fake(committed: list[int]) -> Result:
    e = torch.zeros(0, len(KS), dtype=torch.long)
    return Result([0] * (1 + sum(committed)), committed, [c - 1 for c in committed], e, e[:, 0], 1.0)


def test_tau_table_paired_intervals():
    g = torch.Generator().manual_seed(0)
    base = [fake((1 + torch.randint(0, 3, (20,), generator=g)).tolist()) for _ in range(60)]
    better = [dataclasses.replace(r, committed=[c + (i % 2) for i, c in enumerate(r.committed)]) for r in base]
    t = stats.tau_table({"DFlash": base, "DCOCO": better, "same": base}, "DFlash")
    for row in t.values():
        assert row["tau_ci"][0] <= row["tau"] <= row["tau_ci"][1] and row["prompts"] == 60
    assert t["DFlash"]["ratio"] == 1 and t["DFlash"]["ratio_ci"] is None
    assert t["same"]["ratio_ci"] == [1.0, 1.0]  # paired: the same prompts resampled for both
    lo, hi = t["DCOCO"]["ratio_ci"]
    assert 1 < lo <= t["DCOCO"]["ratio"] <= hi < 1.5
    assert hi - lo < (t["DCOCO"]["tau_ci"][1] - t["DCOCO"]["tau_ci"][0]) / t["DFlash"]["tau"]  # pairing helps
    with pytest.raises(ValueError, match="same prompts"):
        stats.tau_table({"a": base, "b": base[:3]}, "a")
    with pytest.raises(ValueError, match="base"):
        stats.tau_table({"a": base}, "b")


def test_wilson():
    lo, hi = stats.wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert stats.wilson(0, 0) is None and stats.wilson(0, 5)[0] == 0
