"""`dcoco train`'s run folders: a run is never overwritten by accident, a recipe's stages each have their own
folder and are all checked before any work, a rerun skips what is finished and resumes what was interrupted, and
log.jsonl holds each step once. On the tiny random target (dcoco.testing.tiny), through the CLI as users run it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="training needs the demo extra (pip install '.[demo]')")

from dcoco import cli  # noqa: E402
from dcoco.testing import tiny  # noqa: E402


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
    with pytest.raises(SystemExit, match=r"holds another run \(steps \(2 saved, 3 now\)\).*--overwrite"):
        cli.main(["train", "--config", str(r), "--no-progress"])
    assert _steps(out) == [1, 2]
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 3, "out": str(out), "stop_at": 1}])
    assert cli.main(["train", "--config", str(r), "--overwrite", "--no-progress"]) == 0
    assert _steps(out) == [1]
    _recipe(r, tiny_dirs, [{"mode": "drafter", "steps": 3, "out": str(out)}])
    capsys.readouterr()
    assert cli.main(["train", "--config", str(r), "--no-progress"]) == 0  # interrupted, same settings: resumed
    assert "resumed" in capsys.readouterr().out and _steps(out) == [1, 2, 3]


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
    files = lambda: {f.name: f.read_bytes() for f in out.iterdir() if f.is_file() and f.name != ".lock"}  # noqa: E731
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
