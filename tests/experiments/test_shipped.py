"""`dcoco demo`, the main job: the shipped drafters of a release (release.toml) evaluated, and a corrector trained
here on the shipped drafter's frozen outputs; the release manifest, its provenance keys and its bad input."""

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
GIVEN = REPO / "tests" / "data" / "smollm2-dcoco"  # a trained SmolLM2 drafter with its corrector


def stage(root: Path, name: str, step: int, total: int, taus: list[float]) -> None:
    """A trained stage folder as `dcoco train` leaves it: the checkpoint, progress.json and eval.jsonl."""
    shutil.copytree(GIVEN, root / name)
    (root / name / "progress.json").write_text(json.dumps({"step": step, "total": total, "config": {
        "corr_grad": 1.0, "lr": 3e-4}}))
    (root / name / "eval.jsonl").write_text("".join(json.dumps({"step": (i + 1) * 10, "eval_tau_dflash": t}) + "\n"
                                                    for i, t in enumerate(taus)))


def release(root: Path, roles: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "release.toml").write_text("".join(f'{r} = "{n}"\n' for r, n in roles.items()))
    return root


def test_the_committed_release_names_known_roles_and_a_trained_drafter():
    from dcoco.experiments import release as rel_mod

    rel = rel_mod.load(REPO / "checkpoints" / "smollm2-scale")
    assert rel.stages["drafter"].step > 0 and set(rel.stages) | set(rel.missing) <= set(rel_mod.ROLES)
    assert rel_mod.corpus_tokens() > 10 ** 6


def test_convergence_and_provenance(tmp_path):
    from dcoco.experiments import release as rel_mod

    root = release(tmp_path / "r", {"drafter": "d", "parent": "p", "joint": "j"})
    stage(root, "p", 20, 20, [1.5, 1.8])
    stage(root, "d", 30, 30, [1.7, 1.83])
    rel = rel_mod.load(root)
    assert set(rel.stages) == {"drafter", "parent"} and rel.missing == {"joint": root / "j"}
    c = rel_mod.converged(rel)
    assert c["ratio"] == pytest.approx(1.83 / 1.8) and c["holds"] and (c["steps"], c["total"]) == (30, 30)
    assert rel_mod.provenance(root / "d") == {"corpus_tokens": rel_mod.corpus_tokens(), "converged": c}
    assert rel_mod.provenance(root / "p") == {"corpus_tokens": None, "converged": None}  # not the release's drafter
    stage(root, "d2", 10, 30, [1.83])  # unfinished, or moved by more than the tolerance: not converged
    release(root, {"drafter": "d2", "parent": "p"})
    assert not rel_mod.converged(rel_mod.load(root))["holds"]
    (root / "d2" / "progress.json").write_text(json.dumps({"step": 30, "total": 30}))
    (root / "d2" / "eval.jsonl").write_text(json.dumps({"step": 30, "eval_tau_dflash": 1.9}) + "\n")
    assert not rel_mod.converged(rel_mod.load(root))["holds"]


@pytest.mark.parametrize("manifest, match", [
    (None, "no release.toml in"), ('drafter = "d"\nmystery = "x"\n', "expected a folder name for each of"),
    ('parent = "p"\n', "drafter required"), ('drafter = "nowhere"\n', "holds no trained checkpoint"),
    ('drafter = [1\n', "release.toml")])
def test_a_bad_release_is_named(tmp_path, manifest, match):
    from dcoco.experiments import release as rel_mod

    if manifest is not None:
        (tmp_path / "release.toml").write_text(manifest)
    with pytest.raises(ValueError, match=match):
        rel_mod.load(tmp_path)


@pytest.mark.slow
def test_demo_evaluates_the_shipped_drafters(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="the demo extra is not installed (pip install '.[demo]')")
    import dataclasses

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DCOCO_CACHE", str(tmp_path / "cache"))
    from dcoco import cli
    from dcoco.experiments import release as rel_mod
    from dcoco.experiments import report, shipped

    monkeypatch.setattr(shipped, "SIZE", dataclasses.replace(
        shipped.SIZE, sequences=4, corrector_steps=2, suites=("gsm8k", "mbpp"), sim_rows=2, sim_tokens=12,
        max_new_tokens=8, frozen_anchors=8, frozen_batch=16, cost_repeats=2))
    root = release(tmp_path / "r", {"drafter": "d", "parent": "p", "corrector": "c", "anchor": "a", "joint": "j",
                                    "control": "k"})
    for name, taus in (("p", [1.2]), ("d", [1.21]), ("c", [1.3]), ("j", [1.4]), ("k", [1.2])):
        stage(root, name, 5, 5, taus)
    args = ["demo", "--no-progress", "--release", str(root), "--out", str(tmp_path / "out")]
    assert cli.main(args) == 0
    res = json.loads((tmp_path / "out" / "demo-smollm2-shipped.json").read_text())
    h, sim = res["headline"], res["sim"]["methods"]
    assert h["lossless"] is True and h["corpus_tokens"] == rel_mod.corpus_tokens()
    assert h["converged"]["ratio"] == pytest.approx(1.21 / 1.2) and h["converged"]["holds"]
    assert 0 <= h["slot1_top1"] <= 1 and h["tau_dflash_budget_control"] >= 1
    assert set(sim) == {"DFlash", report.FROZEN, shipped.HERE, "DCOCO joint greedy", report.JOINT_OFF,
                        report.ONLINE, report.BUDGET_CONTROL}  # the anchor role's folder is missing
    assert res["release"]["missing"] == {"anchor": str(root / "a")}
    for ratio, ci in (("frozen_over_dflash", "frozen_ci"), ("joint_over_dflash", "joint_ci"),
                      ("joint_over_frozen", "joint_over_frozen_ci"),
                      ("joint_over_budget_control", "joint_over_budget_control_ci")):
        assert h[f"tau_ratio_{ci}"][0] <= h[f"tau_ratio_{ratio}"] <= h[f"tau_ratio_{ci}"][1]
    assert h["joint_steps"] == 5 and res["training"]["corrector (trained here)"]["steps"] == 2
    # the same drafter, its corrector and the joint stage's: the same walk, so the same tau
    assert sim[report.FROZEN]["overall"]["tau"] == sim["DCOCO joint greedy"]["overall"]["tau"]
    assert (tmp_path / "out" / "demo-smollm2-shipped-tau.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="--drafter: builds a rebuilt demo"):
        cli.main(args + ["--drafter", str(GIVEN)])
