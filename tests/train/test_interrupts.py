"""A training run stopped by SIGTERM or SIGINT at a random step, or killed in the middle of writing a checkpoint,
then rerun with --resume, ends bit for bit where an uninterrupted run ends. `dcoco train` in a subprocess on
the tiny random target (dcoco.testing.tiny), float32 checkpoints so the comparison is exact."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="training needs the demo extra (pip install '.[demo]')")

from safetensors.torch import load_file

from dcoco.testing import tiny

STEPS = 40

# `dcoco train` whose checkpoint writer kills the process (SIGKILL) in the middle of its save at step KILL_AT:
# the serving files of that step are in place, its train_state.pt not yet
KILL_MID_SAVE = """
import os, signal, sys
from dcoco import cli
from dcoco.train import runs
KILL_AT = int(sys.argv[1])
replace = os.replace
def dying(src, dst):
    replace(src, dst)
    if str(dst).endswith("model.safetensors") and f".tmp{KILL_AT}" in str(src):
        os.kill(os.getpid(), signal.SIGKILL)
runs.os.replace = dying
sys.exit(cli.main(sys.argv[2:]))
"""

pytestmark = pytest.mark.slow  # each test runs dcoco train in a subprocess, twice


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return tiny.save_target(tmp_path_factory.mktemp("target")), tmp_path_factory.mktemp("cache")


def _argv(dirs, out: Path, *extra: str) -> list[str]:
    return tiny.train_args(*dirs, out, "--mode", "joint", "--steps", str(STEPS), "--save-every", "1",
                           "--log-every", "1", "--save-dtype", "float32", *extra)


def _default_sigint() -> None:
    # a job started in the background by a non-interactive shell (CI) inherits SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: give the run the default a terminal user's run has
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run(argv: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "dcoco.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint, **kw)


def _logged(out: Path) -> int:
    try:
        return max((json.loads(x)["step"] for x in (out / "log.jsonl").read_text().splitlines() if x), default=0)
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def uninterrupted(dirs, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("whole") / "run"
    p = _run(_argv(dirs, out))
    assert p.wait(timeout=600) == 0, p.stderr.read()
    return load_file(str(out / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_run_resumes_to_the_uninterrupted_end(dirs, tmp_path, uninterrupted, sig):
    out = tmp_path / "run"
    at = random.Random(sig).randint(3, STEPS // 2)  # a step of this test's own choosing, the same every run
    p = _run(_argv(dirs, out))
    deadline = time.monotonic() + 600
    while _logged(out) < at and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    p.send_signal(sig)
    assert p.wait(timeout=120) != 0
    stopped = _logged(out)
    assert stopped < STEPS  # it really stopped part-way
    p = _run(_argv(dirs, out, "--resume"))
    assert p.wait(timeout=600) == 0, p.stderr.read()
    assert _same(load_file(str(out / "model.safetensors")), uninterrupted)
    steps = [json.loads(x)["step"] for x in (out / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # each step logged once


def test_a_kill_during_a_save_leaves_a_resumable_run(dirs, tmp_path, uninterrupted):
    out = tmp_path / "run"
    script = tmp_path / "kill.py"
    script.write_text(KILL_MID_SAVE)
    p = subprocess.run([sys.executable, str(script), "5", *_argv(dirs, out)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == -signal.SIGKILL
    import torch
    state = torch.load(out / "train_state.pt", weights_only=False)
    assert state["step"] == 4  # the previous save's state, whole
    p = _run(_argv(dirs, out, "--resume"))
    assert p.wait(timeout=600) == 0, p.stderr.read()
    assert _same(load_file(str(out / "model.safetensors")), uninterrupted)
