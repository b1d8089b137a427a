"""Faults a careful user meets: broken checkpoint files, values a checkpoint cannot hold, a stale or
inference-mode vocabulary table, narrowed labels, out-of-vocabulary ids, and CLI errors that come early and in one
line. Each case is written here with its own inputs."""

from __future__ import annotations

import json
import pytest
import torch
from safetensors.torch import load_file, save_file

from dcoco import Corrector, cli, correction_loss
from dcoco.modeling import checkpoint
from dcoco.modeling.dflash import DFlashConfig, DFlashDrafter

V, D = 96, 32


def _drafter(seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    return DFlashDrafter(DFlashConfig(hidden_size=D, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=V, mask_token_id=V - 1, target_layer_ids=[0, 1],
                                      num_target_layers=2, block_size=4, rope_theta=10000.0))


@pytest.fixture
def saved(tmp_path):
    """A DCOCO checkpoint with a trained-looking corrector."""
    c = Corrector(D, num_candidates=8, width=16, mlp_hidden=32)
    torch.nn.init.normal_(c.mlp[2].weight)
    checkpoint.save(tmp_path / "ck", _drafter(), c)
    return tmp_path / "ck"


def _rewrite(path, edit) -> None:
    t = load_file(str(path / "model.safetensors"))
    edit(t)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_broken_safetensors_file_is_named_everywhere(saved, tmp_path, damage, capsys):
    f = saved / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x07" * 64)
    with pytest.raises(ValueError, match=rf"{f}: not a readable safetensors file"):
        checkpoint.load(saved)
    with pytest.raises(SystemExit) as e:  # the CLI: one line naming the file
        cli.main(["export", str(saved), str(tmp_path / "out")])
    assert str(e.value).startswith("dcoco export: ") and str(f) in str(e.value) and "\n" not in str(e.value)


def test_a_broken_config_is_named(saved):
    (saved / "config.json").write_text('{"architectures": [')
    with pytest.raises(ValueError, match=rf"{saved / 'config.json'}: cannot read it as JSON"):
        checkpoint.load(saved)
    (saved / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        checkpoint.load(saved)


@pytest.mark.parametrize("name", ["corrector.mlp.2.weight", "fc.weight"])
def test_non_finite_weights_are_refused_at_load_naming_the_tensor(saved, name):
    def poison(t):
        t[name] = t[name].clone()
        t[name].view(-1)[3] = float("nan")
    _rewrite(saved, poison)
    with pytest.raises(ValueError, match=rf"tensor {name} holds 1 non-finite value"):
        checkpoint.load(saved)


def test_an_integer_stored_weight_is_refused(saved):
    _rewrite(saved, lambda t: t.update({"corrector.pair_proj.weight": t["corrector.pair_proj.weight"].int()}))
    with pytest.raises(ValueError, match="corrector.pair_proj.weight is stored as int32; expected float32, bfloat16"):
        checkpoint.load(saved)


def test_export_refuses_what_the_narrower_dtype_cannot_hold(saved, tmp_path):
    d, c = checkpoint.load(saved)
    with torch.no_grad():
        c.mlp[0].bias[0] = 1e5  # beyond float16's 65504
    checkpoint.save(tmp_path / "big", d, c, dtype=torch.float32)
    with pytest.raises(SystemExit, match=r"dcoco export: tensor corrector.mlp.0.bias: .* do not fit float16"):
        cli.main(["export", str(tmp_path / "big"), str(tmp_path / "half"), "--dtype", "float16"])
    assert not (tmp_path / "half" / "model.safetensors").exists()
    assert cli.main(["export", str(tmp_path / "big"), str(tmp_path / "bf"), "--dtype", "bfloat16"]) == 0
    with torch.no_grad():
        c.mlp[0].bias[0] = float("inf")
    with pytest.raises(ValueError, match="non-finite values"):
        checkpoint.save(tmp_path / "inf", d, c)


def test_an_out_that_is_a_file_is_one_line(saved, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        cli.main(["export", str(saved), str(tmp_path / "file")])
    assert str(e.value).startswith("dcoco export: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("fault", ["tensors", "fsync", "swap"])
def test_a_failed_export_leaves_the_old_checkpoint_loading_bit_for_bit(saved, tmp_path, monkeypatch, fault):
    """An export over an existing checkpoint that fails at any step (the tensors half written on a full disk, the
    fsync, the swap) is one line naming the folder, and the old checkpoint is there as it was, nothing beside it."""
    from dcoco import files

    out = tmp_path / "served"
    checkpoint.save(out, _drafter(seed=1))  # the checkpoint an export would replace
    (out / "README.md").write_text("notes")  # not a checkpoint file: kept by any save
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    disk_full = OSError(28, "No space left on device")
    if fault == "tensors":
        def half_then_full(tensors, path, metadata=None):
            open(path, "wb").write(b"\0" * 100)
            raise disk_full
        monkeypatch.setattr("safetensors.torch.save_file", half_then_full)
    elif fault == "fsync":
        monkeypatch.setattr(files, "_fsync_tree", lambda folder: (_ for _ in ()).throw(disk_full))
    else:
        monkeypatch.setattr(files, "_exchange", lambda a, b: (_ for _ in ()).throw(disk_full))
    with pytest.raises(SystemExit) as e:
        cli.main(["export", str(saved), str(out)])
    msg = str(e.value)
    assert msg.startswith(f"dcoco export: OSError: {out}: writing the checkpoint failed") and "\n" not in msg
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "served"]  # no temporary left
    monkeypatch.undo()
    d, c = checkpoint.load(out)
    assert c is None and all(torch.equal(a, b) for a, b in zip(d.state_dict().values(),
                                                               _drafter(seed=1).state_dict().values()))
    assert cli.main(["export", str(saved), str(out)]) == 0  # the same export, unfaulted, replaces it whole
    assert checkpoint.load(out)[1] is not None and (out / "README.md").read_text() == "notes"


def test_checkpoint_files_get_the_umasks_mode(tmp_path):
    import os

    old = os.umask(0o027)
    try:
        checkpoint.save(tmp_path / "ck", _drafter())
    finally:
        os.umask(old)
    assert {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "ck").iterdir()} == {
        "config.json": 0o640, "model.safetensors": 0o640}


def test_an_export_killed_mid_write_leaves_the_old_checkpoint(saved, tmp_path):
    import signal
    import subprocess
    import sys

    out = tmp_path / "served"
    checkpoint.save(out, _drafter(seed=1))
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    code = ("import sys, time, safetensors.torch as st\n"
            "def stuck(tensors, path, metadata=None):\n"
            "    open(path, 'wb').write(b'partial'); print('writing', flush=True); time.sleep(600)\n"
            "st.save_file = stuck\n"
            "from dcoco import cli; cli.main(['export', sys.argv[1], sys.argv[2]])\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(saved), str(out)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    d, c = checkpoint.load(out)
    assert c is None and all(torch.equal(a, b) for a, b in zip(d.state_dict().values(),
                                                               _drafter(seed=1).state_dict().values()))


@pytest.mark.parametrize("made_inside", ["embedding", "corrector", "both"])
def test_prepare_inference_under_inference_mode(made_inside):
    torch.manual_seed(2)
    inside = torch.inference_mode()
    with inside if made_inside in ("corrector", "both") else torch.no_grad():
        c = Corrector(D, 8, 16, 32)
        torch.nn.init.normal_(c.mlp[2].weight)
    with inside if made_inside in ("embedding", "both") else torch.no_grad():
        E = torch.randn(V, D)
    h, ids, lg = torch.randn(2, 4, D), torch.randint(0, V, (2, 4, 8)), torch.randn(2, 4, 8)
    want = c(h, ids, lg, E)[0]
    with torch.inference_mode():
        c.prepare_inference(E)
        assert torch.equal(c(h, ids, lg, E)[0], want)


def test_labels_are_never_narrowed():
    """int64 labels of id + 2^32 must not match id among int32 candidates."""
    R, B, K = 2, 4, 6
    ids = torch.arange(R * B * K, dtype=torch.int32).view(R, B, K)
    labels = ids[..., 2].long()
    scores = torch.randn(R, B - 1, K, K)
    valid = torch.ones(R, B, dtype=torch.bool)
    hit = correction_loss(scores, ids, labels, valid)
    miss = correction_loss(scores, ids, labels + 2 ** 32, valid)
    assert float(hit) > 0 and float(miss) == 0  # no label in the top-K: no term


def test_an_out_of_vocabulary_anchor_is_named():
    d = _drafter()
    with pytest.raises(ValueError, match=rf"anchor_ids: expected token ids in \[0, {V}\)"):
        d.draft(torch.tensor([3, V]), torch.randn(2, 5, 2 * D), torch.randn(V, D))


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


def test_data_writes_are_the_documented_blind_spot_of_the_staleness_check():
    """`.data` writes bypass autograd's version counter, so the check cannot see them (docs/backends.md, "Documented
    edge cases"): the stale table stays in use until prepare_inference runs again, which then matches the unprepared
    result."""
    torch.manual_seed(3)
    c = Corrector(D, 8, 16, 32)
    torch.nn.init.normal_(c.mlp[2].weight)
    E, h = torch.randn(V, D), torch.randn(2, 4, D)
    ids, lg = torch.randint(0, V, (2, 4, 8)), torch.randn(2, 4, 8)
    with torch.no_grad():
        c.prepare_inference(E)
        c.cand_proj.weight.data.copy_(torch.randn_like(c.cand_proj.weight))  # behind the counter's back
        assert c.prepared  # not noticed
        fresh = Corrector(D, 8, 16, 32)
        fresh.load_state_dict(c.state_dict())
        want = fresh(h, ids, lg, E)[1]
        c.prepare_inference(E)
        assert torch.equal(c(h, ids, lg, E)[1], want)


def test_an_int64_anchor_is_never_narrowed_to_int32_candidates():
    """2^32 + 3 (int64) beside int32 cand_ids was cast to token 3; now it is checked as given, on both backends."""
    import dcoco

    torch.manual_seed(7)
    c = Corrector(D, 8, 16, 32, anchor_transition=True)
    E, h = torch.randn(V, D), torch.randn(2, 5, D)
    ids, lg = torch.randint(0, V, (2, 4, 8), dtype=torch.int32), torch.randn(2, 4, 8)
    for backend in ("fused", "native"):
        with dcoco.use_backend(backend), torch.no_grad():
            with pytest.raises(IndexError, match=rf"anchor_ids\[1\] = {2 ** 32 + 3} is outside \[0, V={V}\)"):
                c(h, ids, lg, E, anchor_ids=torch.tensor([3, 2 ** 32 + 3]))
            with pytest.raises(IndexError, match=r"anchor_ids\[0\] = -1 is outside"):
                c.score(h, ids, lg, E, anchor_ids=torch.tensor([-1, 3]))
            want = c(h, ids.long(), lg, E, anchor_ids=torch.tensor([3, 5]))
            got = c(h, ids, lg, E, anchor_ids=torch.tensor([3, 5], dtype=torch.int32))
            assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_anchor_corrector_refuses_an_empty_block_like_the_plain_one():
    E = torch.randn(V, D)
    for anchor, hidden in ((False, torch.randn(2, 0, D)), (True, torch.randn(2, 1, D))):
        c = Corrector(D, 8, 16, 32, anchor_transition=anchor)
        with pytest.raises(ValueError, match=r"hidden: expected at least one drafted slot \(B >= 1\), got B=0"):
            c(hidden, torch.zeros(2, 0, 8, dtype=torch.long), torch.zeros(2, 0, 8), E,
              anchor_ids=torch.tensor([1, 2]) if anchor else None)


def test_preparation_faults_are_named_or_handled():
    import warnings

    torch.manual_seed(8)
    c = Corrector(D, 8, 16, 32)
    torch.nn.init.normal_(c.mlp[2].weight)
    E, h = torch.randn(V, D), torch.randn(2, 4, D)
    ids, lg = torch.randint(0, V, (2, 4, 8)), torch.randn(2, 4, 8)
    with pytest.raises(TypeError, match="embed: expected a torch.Tensor, got NoneType"):
        c.prepare_inference(None)
    with torch.no_grad():
        want = c(h, ids, lg, E)
    with torch.inference_mode():  # prepared inside inference_mode, then again outside it
        c.prepare_inference(E)
    c.prepare_inference(E)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(c(h, ids, lg, E), want))
        c.prepare_inference(E, table_only=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same embedding again is not "stale"
            assert all(torch.equal(a, b) for a, b in zip(c(h, ids, lg, E), want))
        assert c.prepared and all(torch.equal(a, b) for a, b in zip(c(h, ids, lg), want))
    with pytest.raises(ValueError, match=r"embed: None reads the vocabulary table, which carries no gradient; "
                                         r"score under torch.no_grad\(\)"):
        c.score(h, ids, lg)


def test_checkpoint_dtypes_and_config_values_are_named(saved, tmp_path):
    t = load_file(str(saved / "model.safetensors"))
    name = next(iter(t))
    t[name] = t[name].to(torch.float8_e4m3fn)
    save_file(t, str(saved / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"model.safetensors: tensor {name} is stored as float8_e4m3fn; expected "
                                         r"float32, bfloat16, float16 or float64"):
        checkpoint.load(saved)
    with pytest.raises(TypeError, match="dtype: expected torch.float32, torch.bfloat16, torch.float16 or "
                                        "torch.float64, got torch.int8"):
        checkpoint.save(tmp_path / "i8", _drafter(), None, dtype=torch.int8)
    assert not (tmp_path / "i8").exists()
    checkpoint.save(tmp_path / "rt", _drafter(), None)
    cfg = json.loads((tmp_path / "rt" / "config.json").read_text())
    (tmp_path / "rt" / "config.json").write_text(json.dumps({**cfg, "rope_theta": "abc"}))
    with pytest.raises(ValueError, match=r"rt/config.json: rope_theta: expected a finite number > 0, got 'abc'"):
        checkpoint.load(tmp_path / "rt")


def test_an_export_killed_between_its_renames_is_undone_by_the_next(saved, tmp_path):
    """What a killed writer left beside a checkpoint: its temporary folder (removed by the next write) or, on a
    system without renameat2, the old checkpoint moved aside (put back)."""
    import subprocess
    import sys

    out = tmp_path / "out"
    checkpoint.export(saved, out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f".out.tmp{dead}").mkdir()
    (tmp_path / f".out.tmp{dead}" / "config.json").write_text("{")
    os_rename = __import__("os").rename
    os_rename(out, tmp_path / f".out.old{dead}")  # killed after moving the old one aside
    mine = tmp_path / ".other.tmp1"  # not this checkpoint's: left alone
    mine.mkdir()
    checkpoint.export(saved, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".other.tmp1", "ck", "out"])
    checkpoint.load(out)


@pytest.mark.parametrize("command", [["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m"],
                                     ["data", "generate", "--endpoint", "http://127.0.0.1:9", "--model", "m"],
                                     ["data", "prompts", "--endpoint", "http://127.0.0.1:9", "--model", "m"]])
@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-3", "soon"])
def test_a_timeout_is_a_finite_number_of_seconds(command, timeout, capsys):
    with pytest.raises(SystemExit):
        cli.main([*command, "--timeout", timeout])
    assert "argument --timeout: expected a" in capsys.readouterr().err
