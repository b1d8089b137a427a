"""`dcoco demo`'s report: the headline keys of its JSON, what co-training changed, the printed table and the
plots, keyed on the method names below (demo.methods builds the methods under them)."""

from __future__ import annotations

from pathlib import Path

from .. import plots as figures  # report.plots draws the demo's figures
from ..jsonl import read_records
from ..specdec.evaluate import coverage_plot


DFLASH2 = "DFlash + DFlash2 selector (frozen drafter)"
FROZEN, ONLINE = "DCOCO, frozen drafter", "DCOCO online corrector (drafter not co-trained)"
CONTINUED = "DFlash, trained on alone (the joint drafter's budget)"
ANCHOR = "DCOCO anchor-aware, frozen drafter (beyond the paper)"
DOMINO, DSPARK = "DFlash + Domino head (frozen drafter)", "DFlash + DSpark Markov head (frozen drafter)"
DOMINO_RECIPE = "Domino, its recipe (drafter co-trained)"
DSPARK_RECIPE = "DSpark, its recipe (drafter co-trained)"


def headline(ev: dict, sim: dict, rules: tuple[str, ...], dcoco: str, joint_corr_grad: float,
             joint_lr: float) -> dict:
    """The headline keys and their CIs. tau, ratios and coverage come from the simulated evaluation (sim, every
    method on the same prompts; ratios with paired 95% bootstrap CIs, over DFlash and, in sim["ratios"], over the
    frozen-drafter corrector and the equal-budget DFlash); tokens/s and the losslessness check from real decoding
    (ev). tau_dcoco is the DCOCO named by dcoco (greedy rule): "joint", the joint stage's (co-adapted, trained at
    joint_corr_grad and joint_lr), or "frozen", the frozen-drafter corrector; both are reported. The oracles are
    the DFlash run's; coverage is teacher-forced at every anchor (coverage_seen: samples)."""
    m, real, vs = sim["methods"], ev["methods"], sim["ratios"]
    joint_name = f"DCOCO joint {rules[0]}"
    dfl, joint = m["DFlash"]["overall"], m[joint_name]["overall"]
    frozen, sel, online = m[FROZEN]["overall"], m[DFLASH2]["overall"], m[ONLINE]["overall"]
    dco_name = joint_name if dcoco == "joint" else FROZEN
    dco = m[dco_name]["overall"]
    tps = {k: real[name]["overall"]["tokens_per_s"] for k, name in (
        ("target_only", "target-only"), ("dflash", "DFlash"), ("dcoco", dco_name), ("dcoco_joint", joint_name),
        ("dcoco_frozen", FROZEN), ("dflash2", DFLASH2))}
    oracle = dfl["tau_oracle_prefix_first"]

    def captured(t):
        return (t - dfl["tau"]) / (oracle - dfl["tau"]) if oracle and oracle > dfl["tau"] else None

    return {"tau_target_only": 1.0, "tau_dflash": dfl["tau"], "tau_dflash_ci": dfl["tau_ci"],
            "dcoco": dco_name, "tau_dcoco": dco["tau"], "tau_dcoco_ci": dco["tau_ci"],
            "tau_ratio_dcoco_over_dflash": dco["ratio"], "tau_ratio_ci": dco["ratio_ci"],
            "tau_dcoco_frozen": frozen["tau"], "tau_dcoco_frozen_ci": frozen["tau_ci"],
            "tau_ratio_frozen_over_dflash": frozen["ratio"], "tau_ratio_frozen_ci": frozen["ratio_ci"],
            "tau_dcoco_joint": joint["tau"], "tau_dcoco_joint_ci": joint["tau_ci"], "joint_corr_grad": joint_corr_grad,
            "joint_lr": joint_lr, "tau_ratio_joint_over_dflash": joint["ratio"],
            "tau_ratio_joint_ci": joint["ratio_ci"],
            "tau_ratio_joint_over_frozen": vs[FROZEN][joint_name]["ratio"],
            "tau_ratio_joint_over_frozen_ci": vs[FROZEN][joint_name]["ratio_ci"],
            "tau_dcoco_online": online["tau"], "tau_ratio_joint_over_online": vs[ONLINE][joint_name]["ratio"],
            "tau_ratio_joint_over_online_ci": vs[ONLINE][joint_name]["ratio_ci"],
            "tau_dflash_continued": m[CONTINUED]["overall"]["tau"],
            "tau_ratio_joint_over_dflash_continued": vs[CONTINUED][joint_name]["ratio"],
            "tau_ratio_joint_over_dflash_continued_ci": vs[CONTINUED][joint_name]["ratio_ci"],
            "tau_oracle_prefix_first": oracle, "tau_oracle_walk": dfl["tau_oracle_walk"],
            **{f"tps_{k}": v for k, v in tps.items()},
            "tau_dflash2": sel["tau"], "tau_dflash2_ci": sel["tau_ci"], "tau_ratio_dflash2_over_dflash": sel["ratio"],
            "tau_ratio_dflash2_ci": sel["ratio_ci"],
            "headroom_captured_dcoco": captured(dco["tau"]), "headroom_captured_frozen": captured(frozen["tau"]),
            "headroom_captured_joint": captured(joint["tau"]),
            **anchor_keys(m, vs, real), **baseline_keys(m, vs), **recipe_keys(m, vs, joint_name),
            "headroom_captured_walk": {name: walk_share(row["overall"]["tau"], dfl) for name, row in m.items()},
            "speedup_dcoco_over_dflash": tps["dcoco"] / tps["dflash"], "coverage": dfl["coverage_tf"],
            "coverage_seen": dfl["coverage_tf_seen"], "simulated_prompts": dfl["prompts"],
            "simulated_rounds": dfl["rounds"], "lossless": ev["lossless"]}


def anchor_keys(m: dict, vs: dict, real: dict) -> dict:
    """The anchor-aware corrector's keys: tau, its paired CIs over DFlash, DFlash2's selector and the paper's
    frozen-drafter corrector (all four on the same frozen drafter), tokens/s."""
    a = m[ANCHOR]["overall"]
    return {"tau_dcoco_anchor": a["tau"], "tau_dcoco_anchor_ci": a["tau_ci"],
            "tau_ratio_anchor_over_dflash": a["ratio"], "tau_ratio_anchor_ci": a["ratio_ci"],
            "tau_ratio_anchor_over_dflash2": vs[DFLASH2][ANCHOR]["ratio"],
            "tau_ratio_anchor_over_dflash2_ci": vs[DFLASH2][ANCHOR]["ratio_ci"],
            "tau_ratio_anchor_over_frozen": vs[FROZEN][ANCHOR]["ratio"],
            "tau_ratio_anchor_over_frozen_ci": vs[FROZEN][ANCHOR]["ratio_ci"],
            "tps_dcoco_anchor": real[ANCHOR]["overall"]["tokens_per_s"]}


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
    """What co-training changed, the joint drafter beside the frozen one (and the online control's): per-slot
    teacher-forced top-1 and top-16 coverage on the evaluation prompts, the corrector's transition hit rate, and
    the final DFlash loss on the training batches."""
    m = sim["methods"]
    rows = {"frozen drafter (dflash-long)": ("DFlash", FROZEN, "dflash-long"),
            "joint drafter (dcoco-drafter)": ("DCOCO joint drafter, corrector off", f"DCOCO joint {rules[0]}",
                                              "dcoco-drafter"),
            "online control's drafter (online)": (CONTINUED, ONLINE, "online")}
    out = {}
    for label, (plain, corrected, stage) in rows.items():
        cov = m[plain]["overall"]["coverage_tf"]
        out[label] = {"top1_per_slot": cov[1], "top16_per_slot": cov[16],
                      "transition_hit_rate": m[corrected]["overall"]["transition_hit_rate"],
                      "final_dflash_loss": training[stage].get("final_dflash")}
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
                 f"tokens.\nPrefix-first oracle tau (DFlash rounds): {h['tau_oracle_prefix_first']:.3f}; "
                 f"DCOCO ({h['dcoco']}) / DFlash {h['tau_ratio_dcoco_over_dflash']:.3f}x{_ci(h['tau_ratio_ci'])}; "
                 f"frozen-drafter corrector {h['tau_ratio_frozen_over_dflash']:.3f}x{_ci(h['tau_ratio_frozen_ci'])}, "
                 f"joint (corr_grad {h['joint_corr_grad']:g}) {h['tau_ratio_joint_over_dflash']:.3f}x"
                 f"{_ci(h['tau_ratio_joint_ci'])}, joint / frozen {h['tau_ratio_joint_over_frozen']:.3f}x"
                 f"{_ci(h['tau_ratio_joint_over_frozen_ci'])}, joint / its online control "
                 f"{h['tau_ratio_joint_over_online']:.3f}x{_ci(h['tau_ratio_joint_over_online_ci'])}, DFlash2 selector "
                 f"{h['tau_ratio_dflash2_over_dflash']:.3f}x{_ci(h['tau_ratio_dflash2_ci'])}; "
                 f"anchor-aware corrector {h['tau_ratio_anchor_over_dflash']:.3f}x{_ci(h['tau_ratio_anchor_ci'])} "
                 f"(/ DFlash2 selector {h['tau_ratio_anchor_over_dflash2']:.3f}x"
                 f"{_ci(h['tau_ratio_anchor_over_dflash2_ci'])}, / frozen corrector "
                 f"{h['tau_ratio_anchor_over_frozen']:.3f}x{_ci(h['tau_ratio_anchor_over_frozen_ci'])}); "
                 f"DCOCO frozen / Domino {h['tau_ratio_dcoco_over_domino']:.3f}x"
                 f"{_ci(h['tau_ratio_dcoco_over_domino_ci'])}, / DSpark {h['tau_ratio_dcoco_over_dspark']:.3f}x"
                 f"{_ci(h['tau_ratio_dcoco_over_dspark_ci'])}, anchor-aware / the stronger ({h['best_baseline']}) "
                 f"{h['tau_ratio_anchor_over_best_baseline']:.3f}x{_ci(h['tau_ratio_anchor_over_best_baseline_ci'])}; "
                 f"DCOCO joint / Domino's recipe {h['tau_ratio_joint_over_domino_recipe']:.3f}x"
                 f"{_ci(h['tau_ratio_joint_over_domino_recipe_ci'])}, / DSpark's recipe "
                 f"{h['tau_ratio_joint_over_dspark_recipe']:.3f}x{_ci(h['tau_ratio_joint_over_dspark_recipe_ci'])}; "
                 f"any-candidate oracle tau {h['tau_oracle_walk']:.3f}; lossless: {h['lossless']}")
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
    paths = [out / f"{prefix}-tau.png", out / f"{prefix}-coverage.png", out / f"{prefix}-training.png"]
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
    fig, ax = plt.subplots(figsize=(6, 4))
    t = res["training"]  # continued stages are drawn from the step where their drafter's training left off
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
