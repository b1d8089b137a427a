"""`dcoco demo`'s report: the headline keys of its JSON, what co-training changed, the printed table and the
plots, keyed on the method names below (demo.methods builds the methods under them)."""

from __future__ import annotations

from pathlib import Path

from .. import plots as figures  # report.plots draws the demo's figures
from ..jsonl import read_records
from ..specdec.evaluate import coverage_plot


DFLASH2 = "DFlash + DFlash2 selector (frozen drafter)"
FROZEN, ONLINE = "DCOCO, frozen drafter", "DCOCO online corrector (drafter not co-trained)"
BUDGET_CONTROL = "DFlash, trained on alone (the joint drafter's budget)"
ANCHOR = "DCOCO anchor-aware, frozen drafter (beyond the paper)"
DOMINO, DSPARK = "DFlash + Domino head (frozen drafter)", "DFlash + DSpark Markov head (frozen drafter)"
DOMINO_RECIPE = "Domino, its recipe (drafter co-trained)"
DSPARK_RECIPE = "DSpark, its recipe (drafter co-trained)"
JOINT_OFF = "DCOCO joint drafter, corrector off"
# the bases of the paired ratios in the JSON's sim.ratios, where evaluated (every ratio over DFlash is in sim.methods)
RATIO_BASES = (FROZEN, ONLINE, BUDGET_CONTROL, DFLASH2, DOMINO, DSPARK, DOMINO_RECIPE, DSPARK_RECIPE)


def joint_name(rules: tuple[str, ...]) -> str:
    return f"DCOCO joint {rules[0]}"


def headline(ev: dict, sim: dict, rules: tuple[str, ...], dcoco: str, joint: dict | None,
             provenance: dict) -> dict:
    """The headline keys and their CIs, for the methods evaluated. tau, ratios and coverage come from the simulated
    evaluation (sim, every method on the same prompts; ratios with paired 95% bootstrap CIs, over DFlash and, in
    sim["ratios"], over the frozen-drafter corrector, the budget control and the baselines); tokens/s and the
    losslessness check from real decoding (ev). tau_dcoco is the DCOCO named by dcoco: "joint", the joint stage's
    (co-adapted; joint: its settings, corr_grad and lr), or "frozen", the frozen-drafter corrector (also when there
    is no joint stage). The oracles are the DFlash run's; coverage is teacher-forced at every anchor (coverage_seen:
    samples; slot1_top1: the drafter's top-1 at the first drafted slot). provenance: the drafter's corpus_tokens and
    its convergence check (converged), None where unknown."""
    m, real = sim["methods"], ev["methods"]
    dfl, jn = m["DFlash"]["overall"], joint_name(rules)
    dco_name = jn if dcoco == "joint" and jn in m else FROZEN if FROZEN in m else None
    out = {"tau_target_only": 1.0, "tau_dflash": dfl["tau"], "tau_dflash_ci": dfl["tau_ci"], **provenance,
           "slot1_top1": dfl["coverage_tf"][1][0], "tau_oracle_prefix_first": dfl["tau_oracle_prefix_first"],
           "tau_oracle_walk": dfl["tau_oracle_walk"], "dcoco": dco_name}
    if dco_name is not None:
        out.update(_method_keys("dcoco", m[dco_name]["overall"], dfl, ratio_key="tau_ratio_ci"))
    if FROZEN in m:
        out.update(_method_keys("frozen", m[FROZEN]["overall"], dfl))
    if jn in m:
        out.update(_method_keys("joint", m[jn]["overall"], dfl), **{f"joint_{k}": v for k, v in (joint or {}).items()})
        out.update(_over(sim, jn, "joint", ((FROZEN, "frozen"), (ONLINE, "online"),
                                            (BUDGET_CONTROL, "budget_control"))))
    if BUDGET_CONTROL in m:
        out["tau_dflash_budget_control"] = m[BUDGET_CONTROL]["overall"]["tau"]
    if ONLINE in m:
        out["tau_dcoco_online"] = m[ONLINE]["overall"]["tau"]
    if DFLASH2 in m:
        out.update(_method_keys("dflash2", m[DFLASH2]["overall"], dfl))
    if ANCHOR in m:
        out.update(_method_keys("anchor", m[ANCHOR]["overall"], dfl),
                   **_over(sim, ANCHOR, "anchor", ((DFLASH2, "dflash2"), (FROZEN, "frozen"))))
    if DOMINO in m and DSPARK in m:
        out.update(baseline_keys(m, sim["ratios"]))
    if DOMINO_RECIPE in m and DSPARK_RECIPE in m and jn in m:
        out.update(recipe_keys(m, sim["ratios"], jn))
    tps = {k: real[name]["overall"]["tokens_per_s"] for k, name in (
        ("target_only", "target-only"), ("dflash", "DFlash"), ("dcoco", dco_name), ("dcoco_joint", jn),
        ("dcoco_frozen", FROZEN), ("dflash2", DFLASH2), ("dcoco_anchor", ANCHOR)) if name in real}
    out.update({f"tps_{k}": v for k, v in tps.items()})
    if "dcoco" in tps:
        out["speedup_dcoco_over_dflash"] = tps["dcoco"] / tps["dflash"]
    return {**out, "headroom_captured_walk": {name: walk_share(row["overall"]["tau"], dfl) for name, row in m.items()},
            "coverage": dfl["coverage_tf"], "coverage_seen": dfl["coverage_tf_seen"],
            "simulated_prompts": dfl["prompts"], "simulated_rounds": dfl["rounds"], "lossless": ev["lossless"]}


def _method_keys(key: str, row: dict, dflash: dict, ratio_key: str | None = None) -> dict:
    """tau_{key} with its CI, its ratio over DFlash with the paired CI, and its share of the prefix-first oracle's
    headroom over DFlash."""
    oracle = dflash["tau_oracle_prefix_first"]
    name = "dcoco" if key == "dcoco" else f"dcoco_{key}" if key in ("frozen", "joint", "anchor") else key
    return {f"tau_{name}": row["tau"], f"tau_{name}_ci": row["tau_ci"],
            f"tau_ratio_{key}_over_dflash": row["ratio"], ratio_key or f"tau_ratio_{key}_ci": row["ratio_ci"],
            f"headroom_captured_{key}": (row["tau"] - dflash["tau"]) / (oracle - dflash["tau"])
            if oracle and oracle > dflash["tau"] else None}


def _over(sim: dict, name: str, key: str, bases: tuple[tuple[str, str], ...]) -> dict:
    """tau_ratio_{key}_over_{base} with its paired CI, for each base evaluated."""
    vs, out = sim["ratios"], {}
    for base, base_key in bases:
        if base in vs:
            out[f"tau_ratio_{key}_over_{base_key}"] = vs[base][name]["ratio"]
            out[f"tau_ratio_{key}_over_{base_key}_ci"] = vs[base][name]["ratio_ci"]
    return out


def baseline_keys(m: dict, vs: dict) -> dict:
    """The paper's own baselines on the same frozen drafter, one contract (Domino's and DSpark's heads): tau,
    DCOCO's frozen-drafter corrector over each (paired CIs), and the anchor-aware corrector over the stronger."""
    best = max((DOMINO, DSPARK), key=lambda n: m[n]["overall"]["tau"] or 0)
    return {"tau_domino": m[DOMINO]["overall"]["tau"], "tau_domino_ci": m[DOMINO]["overall"]["tau_ci"],
            "tau_dspark": m[DSPARK]["overall"]["tau"], "tau_dspark_ci": m[DSPARK]["overall"]["tau_ci"],
            "tau_ratio_dcoco_over_domino": vs[DOMINO][FROZEN]["ratio"],
            "tau_ratio_dcoco_over_domino_ci": vs[DOMINO][FROZEN]["ratio_ci"],
            "tau_ratio_dcoco_over_dspark": vs[DSPARK][FROZEN]["ratio"],
            "tau_ratio_dcoco_over_dspark_ci": vs[DSPARK][FROZEN]["ratio_ci"], "best_baseline": best,
            "tau_ratio_anchor_over_best_baseline": vs[best][ANCHOR]["ratio"],
            "tau_ratio_anchor_over_best_baseline_ci": vs[best][ANCHOR]["ratio_ci"]}


def recipe_keys(m: dict, vs: dict, joint_name: str) -> dict:
    """The paper's baselines on their published recipes (drafter and head trained together on the head's own
    objective, with DCOCO joint's budget from the same drafter): tau, and DCOCO joint over each (paired CIs)."""
    out = {}
    for key, name in (("domino", DOMINO_RECIPE), ("dspark", DSPARK_RECIPE)):
        row = m[name]["overall"]
        out.update({f"tau_{key}_recipe": row["tau"], f"tau_{key}_recipe_ci": row["tau_ci"],
                    f"tau_ratio_joint_over_{key}_recipe": vs[name][joint_name]["ratio"],
                    f"tau_ratio_joint_over_{key}_recipe_ci": vs[name][joint_name]["ratio_ci"]})
    return out


def walk_share(tau: float, dflash: dict) -> float | None:
    """The share of the any-candidate oracle's headroom over DFlash (its tau_oracle_walk) that tau captures."""
    oracle = dflash["tau_oracle_walk"]
    return (tau - dflash["tau"]) / (oracle - dflash["tau"]) if oracle and oracle > dflash["tau"] else None


def co_adaptation(sim: dict, rules: tuple[str, ...], training: dict) -> dict:
    """What co-training changed, the joint drafter beside the frozen one and its budget control's, where evaluated:
    per-slot teacher-forced top-1 and top-16 coverage on the evaluation prompts, the corrector's transition hit rate,
    and the final DFlash loss on the training batches (training: {stage: info}, where recorded)."""
    m = sim["methods"]
    rows = {"frozen drafter (dflash-long)": ("DFlash", FROZEN, "dflash-long"),
            "joint drafter (dcoco-drafter)": (JOINT_OFF, joint_name(rules), "dcoco-drafter"),
            "budget control's drafter (online)": (BUDGET_CONTROL, ONLINE, "online")}
    out = {}
    for label, (plain, corrected, stage) in rows.items():
        if plain in m and corrected in m:
            cov = m[plain]["overall"]["coverage_tf"]
            out[label] = {"top1_per_slot": cov[1], "top16_per_slot": cov[16],
                          "transition_hit_rate": m[corrected]["overall"]["transition_hit_rate"],
                          "final_dflash_loss": training.get(stage, {}).get("final_dflash")}
    return out


def _ci(ci) -> str:
    return "" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def table(res: dict) -> str:
    """Per method: simulated tau [95% CI], tau / DFlash [paired 95% CI], tau per suite; tokens/s and speedup over
    target-only from real decoding."""
    sim, real = res["sim"]["methods"], res["eval"]["methods"]
    suites = list(sim["DFlash"]["suites"])
    tps0 = real["target-only"]["overall"]["tokens_per_s"]
    w = max(map(len, real)) + 2
    head = (f"{'method':<{w}}{'tau [95% CI]':>22}{'vs DFlash [95% CI]':>24}{'tok/s':>8}{'speedup':>9}" +
            "".join(f"{s[:9]:>10}" for s in suites))
    lines = [head, "-" * len(head)]
    for name in real:
        tps = real[name]["overall"]["tokens_per_s"]
        if name not in sim:
            lines.append(f"{name:<{w}}{'1':>22}{'':>24}{tps:>8.1f}{tps / tps0:>8.2f}x")
            continue
        o = sim[name]["overall"]
        ratio = f"{o['ratio']:.3f}{_ci(o.get('ratio_ci'))}"
        lines.append(f"{name:<{w}}{o['tau']:>6.3f}{_ci(o['tau_ci']):>16}{ratio:>24}{tps:>8.1f}{tps / tps0:>8.2f}x" +
                     "".join(f"{sim[name]['suites'][s]['tau']:>10.3f}" for s in suites))
    h = res["headline"]
    lines.append(f"tau simulated exactly (greedy) on {h['simulated_prompts']} prompts x up to "
                 f"{res['sim']['max_new_tokens']} tokens ({h['simulated_rounds']} DFlash rounds); tokens/s from real "
                 f"decoding of {res['config']['rows']} prompt(s) per suite x {res['config']['max_new_tokens']} "
                 f"tokens; lossless: {h['lossless']}.")
    lines.append(f"oracle tau: prefix-first {h['tau_oracle_prefix_first']:.3f}, any-candidate "
                 f"{h['tau_oracle_walk']:.3f}; drafter's slot-1 top-1 {h['slot1_top1']:.3f} (teacher-forced)")
    if h.get("corpus_tokens") is not None:
        c = h.get("converged")
        check = "" if c is None else (f"; convergence check, {c['drafter']} ({c['steps']:,} of {c['total']:,} "
                                      f"steps) over {c['parent']}: held-out tau x{c['ratio']:.3f}, "
                                      f"{'converged' if c['holds'] else 'not converged'} (within {c['tolerance']:.0%})")
        lines.append(f"drafter trained on {h['corpus_tokens']:,} response tokens{check}")
    ratios = [(label, key) for label, key in (
        ("joint / frozen", "joint_over_frozen"), ("joint / its online control", "joint_over_online"),
        ("joint / DFlash trained on alone", "joint_over_budget_control"),
        ("anchor-aware / DFlash2 selector", "anchor_over_dflash2"), ("anchor-aware / frozen", "anchor_over_frozen"),
        ("DCOCO frozen / Domino", "dcoco_over_domino"), ("DCOCO frozen / DSpark", "dcoco_over_dspark"),
        ("anchor-aware / the stronger baseline", "anchor_over_best_baseline"),
        ("joint / Domino's recipe", "joint_over_domino_recipe"),
        ("joint / DSpark's recipe", "joint_over_dspark_recipe")) if f"tau_ratio_{key}" in h]
    if ratios:
        lines.append("; ".join(f"{label} {h[f'tau_ratio_{key}']:.3f}x{_ci(h[f'tau_ratio_{key}_ci'])}"
                               for label, key in ratios))
    for name, c in res.get("costs", {}).items():
        lines.append(f"  {name}: {c['parameters'] / 1e3:.0f}k parameters, {c['flops_per_round']['greedy'] / 1e6:.1f} "
                     f"MFLOP per round (walk; {c['flops_per_round']['grid'] / 1e6:.1f} for the full grid), selection "
                     f"{c['select_ms_per_round']:.2f} ms per round vs {c['argmax_ms_per_round']:.2f} ms for the argmax")
    return "\n".join(lines)


def plots(res: dict, work: Path, out: Path, prefix: str) -> list[Path]:
    """tau per suite per method with 95% CIs, DFlash teacher-forced coverage per slot with counts and Wilson CIs,
    teacher-forced tau while training."""
    plt = figures.pyplot()

    sim = res["sim"]["methods"]
    paths = [out / f"{prefix}-tau.png", out / f"{prefix}-coverage.png"]
    names = list(sim)
    suites = [*sim["DFlash"]["suites"], "overall"]
    fig, ax = plt.subplots(figsize=(1.5 * len(suites) + 4, 4.5))  # + the legend's width, right of the bars
    w = 0.8 / len(names)
    colors = plt.get_cmap("tab20").colors  # 20 distinct colours: the default cycle repeats after 10 methods
    for j, m in enumerate(names):
        rows = [sim[m]["overall"] if s == "overall" else sim[m]["suites"][s] for s in suites]
        ys = [r["tau"] for r in rows]
        err = [[y - r["tau_ci"][0] for y, r in zip(ys, rows)], [r["tau_ci"][1] - y for y, r in zip(ys, rows)]]
        ax.bar([i - 0.4 + w * (j + 0.5) for i in range(len(suites))], ys, width=w, yerr=err, capsize=2, label=m,
               color=colors[j % len(colors)])
    counts = [(sim["DFlash"]["overall"] if s == "overall" else sim["DFlash"]["suites"][s])["prompts"] for s in suites]
    ax.set_xticks(range(len(suites)), [f"{s}\n{n} prompts" for s, n in zip(suites, counts)], rotation=20,
                  ha="right")
    ax.set(ylabel="tau (tokens per round)",
           title="SmolLM2-135M: committed tokens per round\n(greedy, simulated exactly; 95% CIs over prompts)")
    ax.set_ylim(bottom=1.0)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside: it covered the overall bars
    figures.save(fig, paths[0])
    d = sim["DFlash"]["overall"]
    coverage_plot(d["coverage_tf"], d["coverage_tf_seen"], paths[1],
                  "DFlash drafter: target token in its top-k\n(teacher-forced, every anchor; Wilson 95% CIs)")
    t = res["training"]
    if "dflash-long" not in t:  # the shipped drafters: their training curves are in their folders' logs
        return paths
    paths.append(out / f"{prefix}-training.png")
    fig, ax = plt.subplots(figsize=(6, 4))  # continued stages: drawn from the step where their drafter's left off
    base = t["dflash"]["steps"] if "dflash" in t else 0  # a given drafter (demo --drafter): from 0
    warm = base + t["dflash-long"].get("steps", 0)
    for stage, key, label, x0 in (("dflash", "tau_shortlist", "DFlash drafter (top-1 of the shortlisted loss: "
                                                              "optimistic)", 0),
                                  ("dflash-long", "tau_dflash", "DFlash drafter, whole head (baseline)", base),
                                  ("online", "tau_dflash", "DFlash drafter trained on alone", warm),
                                  ("online", "tau_dcoco", "+ online corrector (drafter not co-trained)", warm),
                                  ("dcoco-drafter", "tau_dflash", "DCOCO joint drafter, argmax", warm),
                                  ("dcoco-drafter", "tau_dcoco", "DCOCO joint drafter + corrector", warm),
                                  ("domino-recipe", "tau_head", "Domino's recipe, drafter + head", warm),
                                  ("dspark-recipe", "tau_head", "DSpark's recipe, drafter + head", warm)):
        log = work / stage / "log.jsonl"
        if log.is_file():
            recs = [r for r in read_records(log) if key in r]
            n = max(1, len(recs) // 25)
            xs = [x0 + recs[i]["step"] for i in range(0, len(recs) - n + 1, n)]
            ys = [sum(r[key] for r in recs[i:i + n]) / n for i in range(0, len(recs) - n + 1, n)]
            ax.plot(xs, ys, label=label, linestyle=":" if key == "tau_shortlist" else "-")
    ax.set(xlabel="drafter step",
           ylabel="teacher-forced tau", title="training batches (moving mean)")
    ax.legend()
    figures.save(fig, paths[2])
    return paths
