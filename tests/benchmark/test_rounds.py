"""bench/rounds.py, what the serving benchmarks report: rotated orders, medians over rounds, each pair's ratio of
medians with the ratio of every round's two cells of the same round, and the figure."""

from __future__ import annotations

import importlib.util
import random
import statistics
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the serving benchmarks plot with matplotlib")

_spec = importlib.util.spec_from_file_location("rounds", Path(__file__).parents[2] / "bench" / "rounds.py")
assert _spec is not None and _spec.loader is not None
rounds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rounds)

SYSTEMS = ["no-spec", "dflash", "dcoco"]


def _runs(seed: int, group: str | None = None) -> list[dict]:
    rng = random.Random(seed)
    return [{"round": r, "system": s, "concurrency": c, "tps": rng.uniform(5, 50),
             "tau": None if s == "no-spec" else rng.uniform(1, 3), **({group: g} if group else {})}
            for g in (("f32", "q4_1") if group else ("",)) for r in range(3) for s in SYSTEMS for c in (1, 4)]


def test_each_round_rotates_the_order_so_every_system_leads_once():
    orders = [rounds.rotated(SYSTEMS, r) for r in range(3)]
    assert [o[0] for o in orders] == SYSTEMS
    assert all(sorted(o) == sorted(SYSTEMS) for o in orders)
    assert rounds.rotated(SYSTEMS, 3) == SYSTEMS


@pytest.mark.parametrize("group", [None, "target"])
def test_medians_and_ratios_match_the_runs(group):
    runs = _runs(1, group)
    table = rounds.summarize(runs, SYSTEMS, {"dcoco/dflash": ("dcoco", "dflash")}, group=group)
    g = "q4_1/" if group else ""
    sel = [x for x in runs if x["system"] == "dcoco" and x["concurrency"] == 4 and (not group or x[group] == "q4_1")]
    base = [x for x in runs if x["system"] == "dflash" and x["concurrency"] == 4 and (not group or x[group] == "q4_1")]
    cell = table[f"{g}dcoco@4"]
    assert cell["tps_median"] == statistics.median(x["tps"] for x in sel)
    assert cell["tau"] == statistics.median(x["tau"] for x in sel)
    assert table[f"{g}no-spec@4"]["tau"] is None
    pair = table[f"{g}dcoco/dflash@4"]
    assert pair["tps_ratio"] == pytest.approx(cell["tps_median"] / table[f"{g}dflash@4"]["tps_median"])
    assert pair["per_round"] == [round(a["tps"] / b["tps"], 3) for a, b in zip(sel, base)]


def test_a_pair_with_a_missing_system_is_left_out():
    runs = [x for x in _runs(2) if x["system"] != "dflash"]
    table = rounds.summarize(runs, SYSTEMS, {"dcoco/dflash": ("dcoco", "dflash")})
    assert "dcoco/dflash@1" not in table and "dflash@1" not in table and "dcoco@1" in table


def test_the_figure_is_written(tmp_path):
    rounds.plot(_runs(3), SYSTEMS, tmp_path / "serving.png", "title")
    assert (tmp_path / "serving.png").stat().st_size > 1000
