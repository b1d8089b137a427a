"""`dcoco demo --smoke` end to end on the embedded SmolLM2-135M target: every stage of the real demo with a few
steps (offline), then a second run that only evaluates."""

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the demo extra is not installed (pip install '.[demo]')")

KEYS = ("tau_target_only", "tau_dflash", "tau_dcoco", "tau_dcoco_frozen", "tau_dcoco_joint", "tau_oracle_prefix_first",
        "tps_target_only", "tps_dflash", "tps_dcoco", "coverage")


@pytest.mark.slow
def test_demo_smoke_trains_evaluates_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DCOCO_CACHE", str(tmp_path / "cache"))
    from dcoco.modeling import checkpoint
    from dcoco import cli
    from dcoco.experiments import demo

    assert cli.main(["demo", "--smoke", "--no-progress", "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "demo-smollm2-smoke.json").read_text())
    h = res["headline"]
    assert all(h[k] is not None for k in KEYS) and h["lossless"] is True
    assert set(h["coverage"]) == {"1", "2", "4", "8", "16"} and len(h["coverage"]["16"]) == demo.BLOCK - 1
    assert h["tau_dflash"] >= 1 and h["tau_oracle_prefix_first"] >= h["tau_dflash"]
    lo, hi = h["tau_ratio_ci"]  # paired bootstrap over the simulated prompts
    assert lo <= h["tau_ratio_dcoco_over_dflash"] <= hi and h["simulated_prompts"] == 2 * demo.SIZES["smoke"].sim_rows
    assert h["tau_dflash2"] >= 1 and h["coverage_seen"][0] >= h["coverage_seen"][-1] > 0
    assert h["corpus_tokens"] == res["config"]["corpus_response_tokens"] and h["converged"] is None  # not checked
    assert h["slot1_top1"] == h["coverage"]["1"][0] and h["tau_dflash_budget_control"] >= 1
    for suffix in ("tau", "coverage", "training"):
        assert (tmp_path / "out" / f"demo-smollm2-smoke-{suffix}.png").stat().st_size > 0
    work = tmp_path / "cache" / "demo-smoke"
    assert {s: v["steps"] for s, v in res["training"].items()} == \
        {"dflash": 3, "dflash-long": 2, "corrector": 2, "anchor": 2, "dflash2": 2, "domino": 2, "dspark": 2,
         "dcoco-drafter": 2, "online": 2, "domino-recipe": 2, "dspark-recipe": 2}
    # a "joint" row co-trains its drafter; the corr_grad 0 control is named the online corrector it is
    joint, online = res["training"]["dcoco-drafter"]["recipe"], res["training"]["online"]["recipe"]
    assert joint["corr_grad"] == h["joint_corr_grad"] > 0 and online["corr_grad"] == 0
    assert joint["from"] == online["from"] == res["training"]["dflash-long"]["recipe"]  # warm: the baseline drafter
    assert joint["corrector_from"] == res["training"]["corrector"]["recipe"]           # and the frozen corrector
    assert h["dcoco"] == ("DCOCO joint greedy" if demo.HEADLINE == "joint" else demo.FROZEN)
    for ratio, ci in (("frozen_over_dflash", "frozen_ci"), ("joint_over_dflash", "joint_ci"),
                      ("joint_over_frozen", "joint_over_frozen_ci"), ("joint_over_online", "joint_over_online_ci"),
                      ("joint_over_budget_control", "joint_over_budget_control_ci"),
                      ("anchor_over_dflash", "anchor_ci"),
                      ("anchor_over_dflash2", "anchor_over_dflash2_ci"),
                      ("anchor_over_frozen", "anchor_over_frozen_ci"),
                      ("dcoco_over_domino", "dcoco_over_domino_ci"), ("dcoco_over_dspark", "dcoco_over_dspark_ci"),
                      ("anchor_over_best_baseline", "anchor_over_best_baseline_ci"),
                      ("joint_over_domino_recipe", "joint_over_domino_recipe_ci"),
                      ("joint_over_dspark_recipe", "joint_over_dspark_recipe_ci")):
        assert h[f"tau_ratio_{ci}"][0] <= h[f"tau_ratio_{ratio}"] <= h[f"tau_ratio_{ci}"][1]
    assert h["tau_dcoco_anchor"] >= 1 and demo.ANCHOR in res["costs"] and demo.ANCHOR in h["headroom_captured_walk"]
    assert demo.load_frozen(work / "anchor").anchor_transition  # the stage reloads as what it was trained as
    assert h["tau_domino"] >= 1 and h["tau_dspark"] >= 1 and {demo.DOMINO, demo.DSPARK} <= set(res["costs"])
    assert type(demo.load_frozen(work / "domino")).__name__ == "DominoHead"
    assert type(demo.load_frozen(work / "dspark")).__name__ == "DSparkHead"
    # each baseline's published recipe: its head's own objective, drafter co-trained, from the same drafter and
    # its frozen-trained head, with DCOCO joint's budget
    for method, kind in (("domino", "DominoHead"), ("dspark", "DSparkHead")):
        r = res["training"][f"{method}-recipe"]["recipe"]
        assert r["method"] == method and r["steps"] == joint["steps"] and r["lr"] == joint["lr"]
        assert r["from"] == joint["from"] and r["corrector_from"] == res["training"][method]["recipe"]
        assert type(checkpoint.load(work / f"{method}-recipe")[1]).__name__ == kind
        assert h[f"tau_{method}_recipe"] >= 1
    assert {demo.DOMINO_RECIPE, demo.DSPARK_RECIPE} <= set(res["costs"])
    assert set(res["co_adaptation"]) == {"frozen drafter (dflash-long)", "joint drafter (dcoco-drafter)",
                                         "budget control's drafter (online)"}
    assert all(len(r["top1_per_slot"]) == demo.BLOCK - 1 for r in res["co_adaptation"].values())
    assert "tau_shortlist" in json.loads((work / "dflash" / "log.jsonl").read_text().splitlines()[0])
    assert {v["mode"] for v in res["training"].values()} == {"drafter", "joint", "frozen drafter, cached outputs"}
    drafter, corrector = checkpoint.load(work / "dcoco-drafter")  # the serving layout, corrector included
    assert corrector is not None and drafter.config.block_size == demo.BLOCK
    assert checkpoint.load(work / "dflash")[1] is None

    # a second run finds every stage done and only evaluates
    monkeypatch.setattr(demo, "train", lambda *a, **k: pytest.fail("a finished stage was trained again"))
    monkeypatch.setattr(demo.corpus, "generate", lambda *a, **k: pytest.fail("the corpus was rebuilt"))
    assert cli.main(["demo", "--smoke", "--no-progress", "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "demo-smollm2-smoke.json").read_text())
    assert again["training"] == res["training"]
    assert again["headline"]["tau_dflash"] == h["tau_dflash"]  # greedy decoding: the same rounds


def test_demo_builds_on_a_given_drafter(tmp_path, monkeypatch):
    """--drafter: the given checkpoint (its corrector left out) is the DFlash every method builds on and is compared
    with; its stages live apart, named by its weights' sha256; a drafter for another target is refused."""
    import hashlib

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DCOCO_CACHE", str(tmp_path / "cache"))
    from dcoco import cli
    from helpers.tiny_models import small_checkpoint

    given = Path(__file__).parents[1] / "data" / "smollm2-dcoco"
    assert cli.main(["demo", "--smoke", "--no-progress", "--drafter", str(given), "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "demo-smollm2-smoke-smollm2-dcoco.json").read_text())
    digest = hashlib.sha256((given / "model.safetensors").read_bytes()).hexdigest()
    t = res["training"]
    assert "dflash" not in t and t["dflash-long"] == {"mode": "given drafter", "path": str(given),
                                                      "recipe": {"drafter": digest}}
    assert t["corrector"]["recipe"]["from"] == t["dcoco-drafter"]["recipe"]["from"] == {"drafter": digest}
    assert res["config"]["drafter"] == str(given) and res["config"]["layers"] == 3
    assert res["headline"]["lossless"] is True and res["headline"]["tau_dflash"] >= 1
    work = tmp_path / "cache" / "demo-smoke" / f"drafter-{digest[:12]}"
    assert (work / "corrector" / "done.json").is_file() and not (work / "dflash").exists()
    assert (tmp_path / "out" / "demo-smollm2-smoke-smollm2-dcoco-training.png").stat().st_size > 0
    small_checkpoint(tmp_path / "small")
    with pytest.raises(SystemExit, match="drafter: .*small is for vocab_size 96"):
        cli.main(["demo", "--smoke", "--no-progress", "--drafter", str(tmp_path / "small")])


def test_demo_rejects_a_missing_suites_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE", str(tmp_path))
    from dcoco import cli

    with pytest.raises(SystemExit, match="suites"):
        cli.main(["demo", "--smoke", "--suites", str(tmp_path / "nowhere")])


def test_demo_corpus_ships_as_token_ids():
    from importlib import resources

    from dcoco.target import corpus
    from dcoco.experiments import demo

    f = resources.files("dcoco") / "data" / demo.CORPUS_FILE
    assert f.stat().st_size < 2 * 2 ** 20
    seqs = corpus.load_sequences(f)
    assert len(seqs) >= 300 and all(p and r for p, r in seqs)
    assert all(0 <= t < 49152 for p, r in seqs[:50] for t in p + r)


def test_a_stage_of_another_recipe_is_redone(tmp_path):
    from dcoco.train import stages
    from dcoco.train.config import TrainConfig

    want = stages.recipe(TrainConfig(mode="drafter", steps=5, loss_vocab=4096), upstream=None)
    stage = tmp_path / "dflash"
    stage.mkdir()
    stages.write(stage, want, steps=5)
    assert stages.redo_unless_done(stage, want)["steps"] == 5
    assert stages.redo_unless_done(stage, stages.recipe(TrainConfig(mode="drafter", steps=5), None)) is None
    assert not stage.exists()  # a different loss: removed, so it is trained again
    assert stages.redo_unless_done(stage, want) is None
