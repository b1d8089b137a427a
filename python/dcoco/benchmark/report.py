"""`dcoco bench`'s tables and plots: a run's table in the paper's form (rows = suites; output tokens/s and tau per
setting) and `dcoco bench compare`, which joins runs (no-spec, DFlash, DCOCO, ...) with speedups over the no-spec
one."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from .. import plots
from ..suites import SUITES, order

MODES = ("greedy", "sampling")


def _fmt(x: float | None, std: float | None = None, spec: str = ".1f") -> str:
    if x is None:
        return "-"
    return format(x, spec) + (f" ± {format(std, spec)}" if std is not None else "")


def _label(suite: str) -> tuple[str, str]:
    return SUITES.get(suite, ("Other", suite))


def _cells(res: dict) -> dict:
    """{(suite, mode, concurrency): row} of a run's summary."""
    return {(r["suite"], r["mode"], r["concurrency"]): r for r in res["summary"]["rows"]}


def _t(mode: str, temperature: float) -> str:
    return "T=0" if mode == "greedy" else f"T={temperature:g}"


def _mode(res: dict, mode: str) -> str:
    """The column title of a mode in a run's table."""
    seeds = [s for s in res["config"]["seeds"] if s is not None]
    t = _t(mode, res["config"]["temperature"])
    if mode == "greedy":
        return t
    return f"{t} (seed {seeds[0]})" if len(seeds) == 1 else f"{t} (mean ± std, {len(seeds)} seeds)"


def _what(c: int) -> str:
    return "output tokens/s per stream (median over requests)" if c == 1 else "aggregate output tokens/s"


def _avg(xs: Sequence[float | None]) -> float | None:
    """Unweighted mean over the suites, as the paper's Average row; None when a suite has no figure."""
    if not xs or any(x is None for x in xs):
        return None
    return statistics.fmean(x for x in xs if x is not None)


def _domain_rows(suites: Sequence[str]) -> list[tuple[str, str, str]]:
    """(domain shown on its first row only, suite shown, suite) per suite."""
    out, last = [], None
    for s in suites:
        dom, name = _label(s)
        out.append(("" if dom == last else dom, name, s))
        last = dom
    return out


def _md(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def _modes(res: dict) -> list[str]:
    return [m for m in MODES if any(r["mode"] == m for r in res["summary"]["rows"])]


def run_table(res: dict) -> str:
    """Markdown: per concurrency, a row per suite (the paper's order and domains) with tokens/s and tau per mode,
    and the unweighted Average; across concurrencies, the suite average per mode; failed requests listed."""
    cfg, cells = res["config"], _cells(res)
    suites, modes = list(cfg["suites"]), _modes(res)
    out = [f"# dcoco bench: {cfg['model']} at {cfg['endpoint']}", "",
           f"max {cfg['max_tokens']} new tokens, thinking {'on' if cfg['thinking'] else 'off'}, rows per suite: "
           f"{', '.join(f'{s} {len(r)}' for s, r in cfg['suites'].items())}. tau = 1 + accepted / drafts from the "
           f"server's counters ('-': none, no speculation)."]
    for c in cfg["concurrency"]:
        head = ["Domain", "Dataset"] + [f"{_mode(res, m)} {x}" for m in modes for x in ("tok/s", "τ")]
        rows = []
        for dom, name, s in _domain_rows(suites):
            rows.append([dom, name] + [f for m in modes for f in (
                _fmt(cells.get((s, m, c), {}).get("tps"), cells.get((s, m, c), {}).get("tps_std")),
                _fmt(cells.get((s, m, c), {}).get("tau"), cells.get((s, m, c), {}).get("tau_std"), ".2f"))])
        rows.append(["", "**Average**"] + [f for m in modes for f in (
            _fmt(_avg([cells.get((s, m, c), {}).get("tps") for s in suites])),
            _fmt(_avg([cells.get((s, m, c), {}).get("tau") for s in suites]), spec=".2f"))])
        out += ["", f"## Concurrency {c}: {_what(c)} and mean accepted length τ", "", *_md(head, rows)]
    if len(cfg["concurrency"]) > 1:
        rows = [[str(c)] + [_fmt(_avg([cells.get((s, m, c), {}).get("tps") for s in suites])) for m in modes]
                for c in cfg["concurrency"]]
        out += ["", "## Throughput as concurrency grows (output tokens/s, average over the suites; per stream at "
                "concurrency 1, aggregate above)", "", *_md(["Concurrency", *(_mode(res, m) for m in modes)], rows)]
    bad = [f"{r['suite']} {r['mode']} c={r['concurrency']}: {r['n_failed']}" for r in res["summary"]["rows"]
           if r["n_failed"]]
    if bad:
        out += ["", f"Failed requests (left out of the figures; rerun to retry): {'; '.join(bad)}."]
    return "\n".join(out) + "\n"


def _bars(ax, suites: Sequence[str], series: dict[str, list[float | None]], ylabel: str, title: str,
          errs: dict[str, list[float | None]] | None = None) -> None:
    """Grouped bars per suite, one series each; errs: std per bar (sampling seeds)."""
    nan = float("nan")
    w = 0.8 / max(1, len(series))
    for j, (name, ys) in enumerate(series.items()):
        err = [0 if e is None else e for e in errs[name]] if errs else None
        ax.bar([i + (j - (len(series) - 1) / 2) * w for i in range(len(suites))],
               [nan if y is None else y for y in ys], width=w, yerr=err, capsize=3 if err else 0, label=name)
    ax.set_xticks(range(len(suites)), [_label(s)[1] for s in suites], rotation=30, ha="right")
    ax.set(ylabel=ylabel, title=title)
    ax.margins(y=0.2)  # room above the bars for the legend
    ax.legend(fontsize=8)


def _sweep(ax, series: dict[str, list[tuple[int, float | None]]], ylabel: str) -> None:
    for name, pts in series.items():
        pts = [(c, y) for c, y in pts if y is not None]
        ax.plot([c for c, _ in pts], [y for _, y in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="concurrency", ylabel=ylabel, title="throughput vs concurrency (average over the suites)")
    ax.legend(fontsize=8)


def write_run(res: dict, out: Path) -> list[Path]:
    """table.md, tps.png (tokens/s and tau per suite at the first concurrency, std over seeds as error bars) and,
    with a sweep, concurrency.png under out; returns the paths."""
    plt = plots.pyplot()
    cfg, cells, modes = res["config"], _cells(res), _modes(res)
    suites, c = list(cfg["suites"]), cfg["concurrency"][0]
    paths = [out / "table.md", out / "tps.png"]
    paths[0].write_text(run_table(res))
    fig, axs = plt.subplots(1, 2, figsize=(max(9, 2.4 * len(suites)), 4))
    for ax, k, label in ((axs[0], "tps", "output tokens/s" + (" per stream" if c == 1 else "")),
                         (axs[1], "tau", "mean accepted length τ")):
        get = {m: [cells.get((s, m, c), {}) for s in suites] for m in modes}
        _bars(ax, suites, {_t(m, cfg["temperature"]): [x.get(k) for x in get[m]] for m in modes}, label,
              f"{label}, concurrency {c}", {_t(m, cfg["temperature"]): [x.get(f"{k}_std") for x in get[m]]
                                             for m in modes})
    plots.save(fig, paths[1])
    if len(cfg["concurrency"]) > 1:
        paths.append(out / "concurrency.png")
        fig, ax = plt.subplots(figsize=(6, 4))
        _sweep(ax, {_t(m, cfg["temperature"]): [(x, _avg([cells.get((s, m, x), {}).get("tps") for s in suites]))
                                     for x in cfg["concurrency"]] for m in modes}, "output tokens/s")
        plots.save(fig, paths[2])
    return paths


def load_run(path: str | Path) -> dict:
    """A run's run.json (or the run folder holding it)."""
    p = Path(path)
    p = p / "run.json" if p.is_dir() else p
    if not p.is_file():
        raise ValueError(f"RUN: {path} is neither a run folder of `dcoco bench` nor its run.json")
    try:
        res = json.loads(p.read_text())
        res["config"], res["summary"]["rows"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"RUN: {p} is not a run.json written by `dcoco bench`") from None
    return res


def compare(paths: Sequence[str | Path], labels: Sequence[str] | None = None, baseline: str | None = None) -> dict:
    """{labels, baseline, runs: {label: run}, notes}. Labels: given, else each run's folder name. Baseline: the
    labelled run, else the only run without spec-decode counters, else the first run (said in notes)."""
    runs = [load_run(p) for p in paths]
    if labels is None:
        labels = [(Path(p).parent if Path(p).is_file() else Path(p)).resolve().name for p in paths]
    if len(labels) != len(runs):
        raise ValueError(f"--labels: expected {len(runs)} names, one per run, got {len(labels)}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"--labels: runs need distinct names, got {list(labels)} (name them with --labels)")
    notes = []
    if baseline is not None:
        if baseline not in labels:
            raise ValueError(f"--baseline: {baseline!r} is none of the runs {list(labels)}")
    else:
        plain = [lb for lb, r in zip(labels, runs) if not r["summary"]["spec"]]
        if len(plain) > 1:
            raise ValueError(f"--baseline: several runs have no spec-decode counters ({', '.join(plain)}); name "
                             f"the no-spec one with --baseline")
        baseline = plain[0] if plain else labels[0]
        if not plain:
            notes.append(f"no run lacks spec-decode counters: speedups are over the first run, {baseline}")
    for k in ("max_tokens", "temperature", "thinking", "model"):
        vals = {lb: r["config"][k] for lb, r in zip(labels, runs)}
        if len(set(map(json.dumps, vals.values()))) > 1:
            notes.append(f"the runs differ in {k}: {vals}")
    return {"labels": list(labels), "baseline": baseline, "runs": dict(zip(labels, runs)), "notes": notes}


def _common(j: dict) -> tuple[list[str], list[str], list[int]]:
    runs = j["runs"].values()
    suites = order({s for r in runs for s in r["config"]["suites"]})
    modes = [m for m in MODES if any(m in _modes(r) for r in runs)]
    conc = sorted({c for r in runs for c in r["config"]["concurrency"]})
    return suites, modes, conc


def compare_table(j: dict) -> str:
    """Markdown in the paper's form: per mode, tokens/s (speedup over the baseline) per suite at the lowest
    concurrency with the Average; the companion tau table; with sweeps, the suite average per concurrency."""
    suites, modes, conc = _common(j)
    labels, base = j["labels"], j["baseline"]
    cells = {lb: _cells(r) for lb, r in j["runs"].items()}

    def tps(lb, s, m, c):
        return cells[lb].get((s, m, c), {}).get("tps")

    def cell(lb, x, std, b):
        sp = f" ({x / b:.2f}×)" if lb != base and x is not None and b else ""
        return _fmt(x, std) + sp

    temp = j["runs"][base]["config"]["temperature"]
    out = [f"# dcoco bench compare: {', '.join(labels)} (speedups over {base})"]
    out += [f"Note: {n}." for n in j["notes"]]
    c = conc[0]
    for m in modes:
        t = _t(m, temp) + ("" if m == "greedy" else " (mean ± std over seeds)")
        rows = []
        for dom, name, s in _domain_rows(suites):
            rows.append([dom, name] + [cell(lb, tps(lb, s, m, c), cells[lb].get((s, m, c), {}).get("tps_std"),
                                            tps(base, s, m, c)) for lb in labels])
        avg = {lb: _avg([tps(lb, s, m, c) for s in suites]) for lb in labels}
        rows.append(["", "**Average**"] + [cell(lb, avg[lb], None, avg[base]) for lb in labels])
        out += ["", f"## {t}, concurrency {c}: {_what(c)} (speedup over {base})", "",
                *_md(["Domain", "Dataset", *labels], rows)]
        rows = [[dom, name] + [_fmt(cells[lb].get((s, m, c), {}).get("tau"),
                                    cells[lb].get((s, m, c), {}).get("tau_std"), ".2f") for lb in labels]
                for dom, name, s in _domain_rows(suites)]
        rows.append(["", "**Average**"] + [_fmt(_avg([cells[lb].get((s, m, c), {}).get("tau") for s in suites]),
                                                spec=".2f") for lb in labels])
        out += ["", f"## {t}, concurrency {c}: mean accepted length τ ('-': no spec-decode counters)", "",
                *_md(["Domain", "Dataset", *labels], rows)]
    if len(conc) > 1:
        for m in modes:
            avg = {(lb, x): _avg([tps(lb, s, m, x) for s in suites]) for lb in labels for x in conc}
            rows = [[str(x)] + [cell(lb, avg[lb, x], None, avg[base, x]) for lb in labels] for x in conc]
            out += ["", f"## {_t(m, temp)}: throughput as concurrency grows (output tokens/s, "
                    f"average over the suites; speedup over {base})", "", *_md(["Concurrency", *labels], rows)]
    return "\n".join(out) + "\n"


def write_compare(j: dict, out: str | Path) -> list[Path]:
    """compare.md, compare.json, speedup.png (per suite, lowest concurrency) and, with sweeps, concurrency.png
    under out; returns the paths."""
    plt = plots.pyplot()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    suites, modes, conc = _common(j)
    base, others = j["baseline"], [lb for lb in j["labels"] if lb != j["baseline"]]
    cells = {lb: _cells(r) for lb, r in j["runs"].items()}
    temp = j["runs"][base]["config"]["temperature"]
    paths = [out / "compare.md", out / "compare.json", out / "speedup.png"]
    paths[0].write_text(compare_table(j))
    paths[1].write_text(json.dumps(j, indent=2))
    c = conc[0]
    fig, axs = plt.subplots(1, len(modes), figsize=(max(6, 1.4 * len(suites)) * len(modes), 4), squeeze=False)
    for ax, m in zip(axs[0], modes):
        def sp(lb, s):
            x, b = (cells[k].get((s, m, c), {}).get("tps") for k in (lb, base))  # noqa: B023 (called in this iteration)
            return x / b if x is not None and b else None
        _bars(ax, suites, {lb: [sp(lb, s) for s in suites] for lb in others}, f"speedup over {base}",
              f"{_t(m, temp)}, concurrency {c}")
        ax.axhline(1.0, color="grey", lw=0.8)
    plots.save(fig, paths[2])
    if len(conc) > 1:
        paths.append(out / "concurrency.png")
        fig, ax = plt.subplots(figsize=(6, 4))
        _sweep(ax, {f"{lb} {_t(m, temp)}":
                    [(x, _avg([cells[lb].get((s, m, x), {}).get("tps") for s in suites])) for x in conc]
                    for lb in j["labels"] for m in modes}, "output tokens/s")
        plots.save(fig, paths[3])
    return paths
