"""`dcoco demo` end to end on the embedded SmolLM2-135M target (offline; about 45 s on 2 cores)."""

import json

import pytest

pytest.importorskip("transformers", reason="the demo extra is not installed (pip install '.[demo]')")


@pytest.mark.slow
def test_demo_runs_offline_and_keeps_the_argmax_at_init(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from dcoco import cli

    out = tmp_path / "demo.json"
    assert cli.main(["demo", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["shapes"] == {"R": 1, "B": 15, "K": 16, "d": 576, "V": 49152}
    assert res["identity_at_init"] and res["corrected"] == res["draft"]
    assert res["top1_hit"][0]  # slot 1 sees the real context: the target's own next token
    assert len(res["truth"]) == 15
