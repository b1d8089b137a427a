"""`dcoco train`'s run folders: a run is never overwritten by accident, a recipe's stages each have their own
folder and are all checked before any work, a rerun skips what is finished and resumes what was interrupted, and
log.jsonl holds each step once. On the tiny random target (dcoco.testing.tiny), through the CLI as users run it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="training needs the demo extra (pip install '.[demo]')")

from dcoco import cli
from dcoco.testing import tiny


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny target's folder, a corpus cache shared by the module's runs)."""
    return tiny.save_target(tmp_path_factory.mktemp("target")), tmp_path_factory.mktemp("cache")


def _train(dirs, out, *extra) -> int:
    return cli.main(tiny.train_args(*dirs, out, "--save-dtype", "float32", *extra))


def _steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]


def test_a_finished_run_is_refused_then_overwritten_on_request(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "3") == 0
    weights = (out / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit) as e:
        _train(tiny_dirs, out, "--mode", "drafter", "--steps", "2")
    msg = str(e.value)
    assert msg.startswith("dcoco train: out: ") and str(out) in msg and "step 3 of 3" in msg
    assert "--resume" in msg and "--overwrite" in msg and "\n" not in msg
    assert (out / "model.safetensors").read_bytes() == weights and _steps(out) == [1, 2, 3]  # untouched
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "2", "--overwrite") == 0
    assert _steps(out) == [1, 2]  # the new run's log only


def test_an_out_that_is_a_file_is_named(tiny_dirs, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit, match=r"dcoco train: out: .*f is a file"):
        _train(tiny_dirs, tmp_path / "f", "--mode", "drafter", "--steps", "1")


def test_a_resumed_run_logs_each_step_once(tiny_dirs, tmp_path):
    out = tmp_path / "run"
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "5", "--stop-at", "3", "--save-every", "2",
                  "--log-every", "1") == 0
    assert _steps(out) == [1, 2, 3]  # saved at steps 2 and 3 (the stop)
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "5", "--resume", "--log-every", "1") == 0
    assert _steps(out) == [1, 2, 3, 4, 5]
    with pytest.raises(SystemExit, match="resume, overwrite: pick one"):
        _train(tiny_dirs, out, "--mode", "drafter", "--steps", "5", "--resume", "--overwrite")


def _recipe(path: Path, dirs, stages: list[dict], root: Path | None = None) -> Path:
    target, cache = dirs
    text = [f'target = "{target}"', f'prompts = "{target / "prompts.jsonl"}"', f'cache_dir = "{cache}"',
            "max_new_tokens = 24", "gen_batch = 4", "feat_batch = 4", "layers = 1",
            f"target_layers = {list(tiny.TAPS)}", "block_size = 8", "anchors = 8", "candidates = 32", "width = 16",
            "mlp_hidden = 32", 'save_dtype = "float32"'] + ([f'out = "{root}"'] if root else [])
    for st in stages:
        text.append("[[stages]]")
        text += [f"{k} = {json.dumps(v)}" for k, v in st.items()]
    path.write_text("\n".join(text) + "\n")
    return path


def test_stages_live_under_the_command_line_out(tiny_dirs, tmp_path, capsys):
    """--out on the command line is the root: each stage in its own folder under it (never every stage in one,
    which used to skip stage 2 as 'done' and leave no corrector)."""
    r = _recipe(tmp_path / "r.toml", tiny_dirs, [{"mode": "drafter", "steps": 2, "out": "runs/x/drafter"},
                                                 {"mode": "corrector", "steps": 2, "out": "runs/x/corrector"}])
    root = tmp_path / "root"
    assert cli.main(["train", "--config", str(r), "--out", str(root), "--no-progress"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["corrector", "drafter"]
    assert (root / "corrector" / "model.safetensors").is_file()
    from dcoco.modeling import checkpoint
    assert checkpoint.load(root / "corrector")[1] is not None
    capsys.readouterr()
    assert cli.main(["train", "--config", str(r), "--out", str(root), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("done, skipped") == 2


def test_stages_are_checked_before_any_work(tiny_dirs, tmp_path):
    same = _recipe(tmp_path / "same.toml", tiny_dirs, [{"mode": "drafter", "steps": 1, "out": str(tmp_path / "a")},
                                                       {"mode": "corrector", "steps": 1, "out": str(tmp_path / "a")}])
    with pytest.raises(SystemExit, match=r"\[\[stages\]\] 1 and 2 both write to"):
        cli.main(["train", "--config", str(same), "--no-progress"])
    typo = _recipe(tmp_path / "typo.toml", tiny_dirs, [{"mode": "drafter", "steps": 1, "out": str(tmp_path / "b")},
                                                       {"mode": "corector", "steps": 1, "out": str(tmp_path / "c")}])
    with pytest.raises(SystemExit, match=r"\[\[stages\]\] 2: mode"):
        cli.main(["train", "--config", str(typo), "--no-progress"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing ran


def test_an_edited_single_stage_recipe_is_refused_not_restarted(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "one"
    r = _recipe(tmp_path / "r.toml", tiny_dirs, [{"mode": "drafter", "steps": 2, "out": str(out)}])
    assert cli.main(["train", "--config", str(r), "--no-progress"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--config", str(r), "--no-progress"]) == 0
    assert "done, skipped" in capsys.readouterr().out  # one stage skips as many do
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 3, "out": str(out)}])
    with pytest.raises(SystemExit, match=r"holds a stage finished with another recipe \(steps \(2 saved, 3 now\)\)"
                                         r".*--overwrite"):
        cli.main(["train", "--config", str(r), "--no-progress"])
    assert _steps(out) == [1, 2]
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 3, "out": str(out), "stop_at": 1}])
    assert cli.main(["train", "--config", str(r), "--overwrite", "--no-progress"]) == 0
    assert _steps(out) == [1]
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 3, "out": str(out)}])
    capsys.readouterr()
    assert cli.main(["train", "--config", str(r), "--no-progress"]) == 0  # interrupted, same settings: resumed
    assert "resumed" in capsys.readouterr().out and _steps(out) == [1, 2, 3]


def test_a_stage_records_its_lineage_and_a_stopped_stage_ends_the_recipe(tiny_dirs, tmp_path, capsys):
    """done.json carries the recipe of the stage a stage started from: a retrained first stage makes the second one
    another stage (refused, then redone with --overwrite). A stage stopped before its end ends the recipe there."""
    from dcoco.train import stages

    a, b = tmp_path / "a", tmp_path / "b"
    r = _recipe(tmp_path / "r.toml", tiny_dirs, [{"mode": "drafter", "steps": 2, "out": str(a)},
                                                 {"mode": "corrector", "steps": 2, "out": str(b)}])
    assert cli.main(["train", "--config", str(r), "--no-progress"]) == 0
    first, second = stages.read(a)["recipe"], stages.read(b)["recipe"]
    assert first["steps"] == 2 and first["from"] is None and second["from"] == first and second["mode"] == "corrector"
    b_log = (b / "log.jsonl").read_text()
    stages.write(a, {**first, "lr": 1e-3})  # as if the first stage had been trained again with another lr
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 2, "out": str(a), "lr": 1e-3},
                           {"mode": "corrector", "steps": 2, "out": str(b)}])
    with pytest.raises(SystemExit, match=r"b holds a stage finished with another recipe \(from\.lr"):
        cli.main(["train", "--config", str(r), "--no-progress"])
    assert (b / "log.jsonl").read_text() == b_log  # refused: nothing in it was touched
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 3, "out": str(a), "stop_at": 1},
                           {"mode": "corrector", "steps": 2, "out": str(b)}])
    capsys.readouterr()
    assert cli.main(["train", "--config", str(r), "--overwrite", "--no-progress"]) == 0
    assert "stage 1/2 stopped at step 1 of 3" in capsys.readouterr().out
    assert _steps(a) == [1] and stages.read(a) is None and stages.read(b)["recipe"] == second  # stage 2 not run
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 3, "out": str(a)},
                           {"mode": "corrector", "steps": 2, "out": str(b)}])
    with pytest.raises(SystemExit, match=r"from\.steps \(2 saved, 3 now\)"):  # stage 1 resumed and finished,
        cli.main(["train", "--config", str(r), "--no-progress"])                # then stage 2 refused
    assert _steps(a) == [1, 2, 3]
    assert cli.main(["train", "--config", str(r), "--overwrite", "--no-progress"]) == 0
    assert stages.read(b)["recipe"]["from"] == stages.read(a)["recipe"] and _steps(b) == [1, 2]


def test_a_stage_sets_the_corrector_and_its_gradient_into_the_drafter(tiny_dirs, tmp_path):
    """A recipe's joint control arm: corr_grad and anchor_transition are stage settings, recorded in done.json."""
    from dcoco.modeling import checkpoint
    from dcoco.train import stages

    a, b = tmp_path / "a", tmp_path / "b"
    r = _recipe(tmp_path / "r.toml", tiny_dirs, [
        {"mode": "drafter", "steps": 1, "out": str(a)},
        {"mode": "joint", "steps": 1, "out": str(b), "corr_grad": 0.0, "anchor_transition": True}])
    assert cli.main(["train", "--config", str(r), "--no-progress"]) == 0
    first, second = stages.read(a)["recipe"], stages.read(b)["recipe"]
    assert (first["corr_grad"], first["anchor_transition"]) == (1.0, False)
    assert (second["corr_grad"], second["anchor_transition"]) == (0.0, True)
    assert checkpoint.load(b)[1].anchor_transition


def test_a_dry_run_plans_a_stage_that_starts_from_an_earlier_stages_folder(tiny_dirs, tmp_path):
    """A control arm names its start (init = an earlier stage's out), which a dry run cannot read yet."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    r = _recipe(tmp_path / "r.toml", tiny_dirs, [{"mode": "drafter", "steps": 1, "out": str(a)},
                                                 {"mode": "joint", "steps": 1, "out": str(b)},
                                                 {"mode": "joint", "steps": 1, "out": str(c), "init": str(a)}])
    plans = tmp_path / "plans.json"
    assert cli.main(["train", "--config", str(r), "--dry-run", "--plan-json", str(plans), "--no-progress"]) == 0
    assert [p["mode"] for p in json.loads(plans.read_text())["stages"]] == ["drafter", "joint", "joint"]
    assert not a.exists() and not b.exists() and not c.exists()


def _holder(out: Path):
    """Another process holding out's run lock (as a running `dcoco train` does) until its stdin closes."""
    import subprocess
    import sys

    code = ("import sys; from dcoco.train.runs import RunLock; lock = RunLock(sys.argv[1]).acquire(); print('held', "
            "flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_writer_is_refused_and_a_dead_ones_lock_never_blocks(tiny_dirs, tmp_path):
    out = tmp_path / "run"
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "4", "--stop-at", "2") == 0
    files = lambda: {f.name: f.read_bytes() for f in out.iterdir() if f.is_file() and f.name != ".lock"}
    before = files()
    holder = _holder(out)
    try:
        for extra in (["--resume"], ["--overwrite"]):
            with pytest.raises(SystemExit) as e:
                _train(tiny_dirs, out, "--mode", "drafter", "--steps", "4", *extra)
            msg = str(e.value)
            assert msg == f"dcoco train: out: {out} is in use by another run (pid {holder.pid}); wait for it to end " \
                          f"or pass another out"
        assert files() == before  # nothing of the first run changed
    finally:
        holder.kill()  # killed, not closed: the OS drops its lock all the same
        holder.wait()
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "4", "--resume") == 0
    assert _steps(out) == [1, 2, 3, 4]


def test_recipes_that_cannot_be_read_are_named(tiny_dirs, tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('mode = "drafter"\n# caf\xe9\n'.encode("latin-1"))
    with pytest.raises(SystemExit, match=rf"dcoco train: --config: cannot read {bad} as UTF-8 TOML"):
        cli.main(["train", "--config", str(bad), "--no-progress"])
    five = _recipe(tmp_path / "five.toml", tiny_dirs, [])
    five.write_text("stages = 5\n" + five.read_text())
    with pytest.raises(SystemExit, match=r"--config .*five.toml: stages: expected \[\[stages\]\] tables, got 5"):
        cli.main(["train", "--config", str(five), "--no-progress"])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not a state"])
def test_a_broken_train_state_is_named(tiny_dirs, tmp_path, damage):
    import torch

    out = tmp_path / "run"
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "3", "--stop-at", "1") == 0
    state = out / "train_state.pt"
    if damage == "truncated":
        state.write_bytes(state.read_bytes()[:1000])
    elif damage == "garbage":
        state.write_bytes(b"\x00not a zip" * 50)
    else:
        torch.save({"step": 1}, state)
    for extra in (["--resume"], []):  # resuming, and the refusal that names the run's progress
        with pytest.raises(SystemExit) as e:
            _train(tiny_dirs, out, "--mode", "drafter", "--steps", "3", *extra)
        assert str(e.value).startswith(f"dcoco train: {state}: not a ") and "--overwrite" in str(e.value)
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "3", "--overwrite") == 0


def test_a_log_cut_mid_line_resumes_and_a_broken_line_is_named(tiny_dirs, tmp_path):
    out = tmp_path / "run"
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "4", "--stop-at", "2", "--log-every", "1") == 0
    log = out / "log.jsonl"
    good = log.read_text()
    log.write_text(good + '{"step": 3, "lo')  # a kill mid-write
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "4", "--resume", "--log-every", "1") == 0
    assert _steps(out) == [1, 2, 3, 4]
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:1] + ["{oops"] + lines[1:]) + "\n")
    with pytest.raises(SystemExit, match=rf"dcoco train: {log}: line 2 is not JSON; remove it to resume"):
        _train(tiny_dirs, out, "--mode", "drafter", "--steps", "4", "--resume")


def test_resuming_a_finished_run_mends_its_serving_checkpoint(tiny_dirs, tmp_path):
    """A finished run resumed over a hand-broken config.json exited 0 leaving a checkpoint that does not load;
    now it warns and writes the serving files again from train_state.pt, the same bytes as before."""
    from dcoco.modeling import checkpoint

    out = tmp_path / "run"
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "2") == 0
    before = {f: (out / f).read_bytes() for f in ("config.json", "model.safetensors")}
    (out / "config.json").write_text('{"architectures": ')
    with pytest.warns(UserWarning, match=r"config.json: cannot read it as JSON .* writing .* serving checkpoint "
                                         r"again from its train_state.pt"):
        assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "2", "--resume") == 0
    assert {f: (out / f).read_bytes() for f in before} == before
    checkpoint.load(out)
    assert _steps(out) == [1, 2]


def test_a_save_killed_mid_write_leaves_nothing_behind_on_the_next_run(tiny_dirs, tmp_path):
    out = tmp_path / "run"
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "3", "--stop-at", "1") == 0
    (out / ".tmp2").mkdir()
    (out / ".tmp2" / "model.safetensors").write_bytes(b"half")
    assert _train(tiny_dirs, out, "--mode", "drafter", "--steps", "3", "--resume") == 0
    assert not (out / ".tmp2").exists()


def _lrs(out: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())}


def test_a_run_kept_without_its_optimizer_resumes_from_its_weights(tiny_dirs, tmp_path, capsys):
    """What a repository keeps of an unfinished run: its weights, progress.json and logs, not train_state.pt.
    --resume, and a recipe's rerun, continue it at the saved step with a fresh optimizer: the same schedule, its LR
    warmed up again over the warm-up's length; weights that progress.json does not describe are refused."""
    args = ("--mode", "drafter", "--steps", "8", "--save-every", "2", "--log-every", "1", "--warmup", "0.25")
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert _train(tiny_dirs, whole, *args) == 0
    assert _train(tiny_dirs, out, *args, "--stop-at", "4") == 0
    (out / "train_state.pt").unlink()
    progress = json.loads((out / "progress.json").read_text())
    assert (progress["step"], progress["total"], progress["restart"]) == (4, 8, None)
    with pytest.raises(SystemExit, match=r"holds a run at step 4 of 8; pass resume \(--resume\) to continue it, "):
        _train(tiny_dirs, out, *args)
    assert _train(tiny_dirs, out, *args, "--resume") == 0
    assert _steps(out) == list(range(1, 9))
    lr, want = _lrs(out), _lrs(whole)
    assert all(lr[s] == want[s] for s in range(1, 5))  # the first four steps' records are kept
    # warm-up of 2 steps: step 5 (schedule index 4) at half the schedule's LR, then the schedule itself
    assert lr[5] == pytest.approx(want[5] / 2, rel=1e-9) and lr[6] == pytest.approx(want[6], rel=1e-9)
    assert json.loads((out / "progress.json").read_text())["restart"] == 4
    # a save cut between its renames: progress.json no longer names these weights
    ahead = tmp_path / "ahead"
    assert _train(tiny_dirs, ahead, *args, "--stop-at", "2") == 0
    (ahead / "train_state.pt").unlink()
    (ahead / "progress.json").write_text(json.dumps({**json.loads((ahead / "progress.json").read_text()),
                                                     "weights_sha256": "0" * 64}))
    with pytest.raises(SystemExit, match=r"progress.json: describes other weights than .*model.safetensors"):
        _train(tiny_dirs, ahead, *args, "--resume")
    # a recipe's stage kept that way resumes too
    kept = tmp_path / "kept"
    r = _recipe(tmp_path / "r.toml", tiny_dirs, [{"mode": "drafter", "steps": 4, "out": str(kept), "stop_at": 2}])
    assert cli.main(["train", "--config", str(r), "--no-progress"]) == 0
    (kept / "train_state.pt").unlink()
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 4, "out": str(kept)}])
    capsys.readouterr()
    assert cli.main(["train", "--config", str(r), "--no-progress"]) == 0
    assert "resumed" in capsys.readouterr().out and _steps(kept) == [1, 2, 3, 4]
