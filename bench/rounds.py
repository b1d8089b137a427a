"""Serving systems measured in interleaved rounds (the machines these run on drift by 10-15% over minutes): each
round's order, the median of each cell over the rounds, each pair's ratio with every round's own ratio beside it,
and the figure. Used by the serving benchmarks beside this file."""

from __future__ import annotations

import statistics
from pathlib import Path

from dcoco import plots


def rotated(names: list[str], r: int) -> list[str]:
    """Round r's order: the systems rotated by r, so drift favours none."""
    k = r % len(names)
    return names[k:] + names[:k]


def _key(run: dict, group: str | None) -> str:
    return f"{run[group]}/" if group else ""


def summarize(runs: list[dict], systems: list[str], pairs: dict[str, tuple[str, str]],
              group: str | None = None) -> dict:
    """The table of runs (dicts with round, system, concurrency, tps, tau and, with group, that field): per
    [group/]system@c the median tok/s, each round's and the median tau; per [group/]pair@c the ratio of the medians
    and each round's ratio (the two systems of one round, side by side)."""
    table = {}
    cells = sorted({(_key(x, group), x["concurrency"]) for x in runs}, key=lambda gc: (gc[0], gc[1]))
    for g, c in cells:
        for s in systems:
            cs = [x for x in runs if (_key(x, group), x["system"], x["concurrency"]) == (g, s, c)]
            if not cs:
                continue
            taus = [x["tau"] for x in cs if x["tau"] is not None]
            table[f"{g}{s}@{c}"] = {"tps_median": statistics.median(x["tps"] for x in cs),
                                    "tps": [round(x["tps"], 2) for x in cs],
                                    "tau": statistics.median(taus) if taus else None}
        for pair, (a, b) in pairs.items():
            if f"{g}{a}@{c}" not in table or f"{g}{b}@{c}" not in table:
                continue
            by_round = {(x["round"], x["system"]): x["tps"] for x in runs
                        if (_key(x, group), x["concurrency"]) == (g, c)}
            per_round = [by_round[r, a] / by_round[r, b] for r in sorted({r for r, _ in by_round})
                         if (r, a) in by_round and (r, b) in by_round]
            table[f"{g}{pair}@{c}"] = {"tps_ratio": table[f"{g}{a}@{c}"]["tps_median"] /
                                       table[f"{g}{b}@{c}"]["tps_median"],
                                       "per_round": [round(v, 3) for v in per_round]}
    return table


def plot(runs: list[dict], systems: list[str], path: str | Path, title: str) -> None:
    """Median tok/s per system at each concurrency (bars), every round's figure as a dot."""
    plt = plots.pyplot()
    concurrency = sorted({x["concurrency"] for x in runs})
    fig, axes = plt.subplots(1, len(concurrency), figsize=(3.2 * len(concurrency) + 1, 3.6), squeeze=False)
    for ax, c in zip(axes[0], concurrency):
        for i, s in enumerate(systems):
            tps = [x["tps"] for x in runs if (x["system"], x["concurrency"]) == (s, c)]
            if tps:
                ax.bar(i, statistics.median(tps), color=f"C{i}")
                ax.plot([i] * len(tps), tps, "k.", markersize=4)
        ax.set_xticks(range(len(systems)), systems, rotation=30, ha="right")
        ax.set_title(f"concurrency {c}")
        ax.set_ylabel("tokens/s (all requests)")
    fig.suptitle(title)
    plots.save(fig, path)
