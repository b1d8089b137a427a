"""The CLI's early, one-line errors: `dcoco eval` checks its drafter and options before it loads the target,
`dcoco bench`'s preflight waits the user's --timeout, and every --timeout is a finite number of seconds."""

from __future__ import annotations

import json

import pytest

from dcoco import cli

from helpers.tiny_models import small_checkpoint


@pytest.fixture
def saved(tmp_path):
    return small_checkpoint(tmp_path / "ck")


def test_eval_checks_its_drafter_and_options_before_loading_the_target(saved, tmp_path, monkeypatch):
    from dcoco.train import recipe

    monkeypatch.setattr(recipe, "load_target", lambda *a, **k: pytest.fail("the target was loaded first"))
    (tmp_path / "s.jsonl").write_text(json.dumps({"turns": ["hi"]}) + "\n")
    base = ["eval", "--suites", str(tmp_path / "s.jsonl"), "--no-progress", "--out", str(tmp_path / "ev")]
    with pytest.raises(SystemExit, match="dcoco eval: num_candidates: expected an integer in"):
        cli.main([*base, "--drafter", str(saved), "--candidates", "0"])
    with pytest.raises(SystemExit, match="dcoco eval: lam: expected a finite number"):
        cli.main([*base, "--drafter", str(saved), "--lam", "inf"])
    with pytest.raises(SystemExit, match="dcoco eval: path: no config.json"):
        cli.main([*base, "--drafter", str(tmp_path / "nowhere")])


def test_bench_preflight_waits_the_users_timeout(tmp_path, monkeypatch):
    """The preflight's requests wait --timeout (when under 30 s), not a fixed 30 s: recorded, not timed."""
    import httpx

    waits = []

    async def get(self, url, timeout=None, **kw):
        waits.append(timeout)
        raise httpx.ReadTimeout("no answer")
    monkeypatch.setattr(httpx.AsyncClient, "get", get)
    (tmp_path / "s.jsonl").write_text(json.dumps({"turns": ["hi"]}) + "\n")
    with pytest.raises(SystemExit, match="cannot reach --endpoint"):
        cli.main(["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / "b"),
                  "--suites", str(tmp_path / "s.jsonl"), "--timeout", "3", "--no-progress"])
    assert waits and all(w == 3.0 for w in waits)


@pytest.mark.parametrize("command", [["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m"],
                                     ["data", "generate", "--endpoint", "http://127.0.0.1:9", "--model", "m"],
                                     ["data", "prompts", "--endpoint", "http://127.0.0.1:9", "--model", "m"]])
@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-3", "soon"])
def test_a_timeout_is_a_finite_number_of_seconds(command, timeout, capsys):
    with pytest.raises(SystemExit):
        cli.main([*command, "--timeout", timeout])
    assert "argument --timeout: expected a" in capsys.readouterr().err
