"""Checkpoint files a careful user meets broken: damaged safetensors or config, values a checkpoint cannot hold, an
export that fails or is killed midway (the old checkpoint stays loadable), and the files' modes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dcoco import cli
from dcoco.modeling import checkpoint

from helpers.tiny_models import small_checkpoint, small_drafter as _drafter


@pytest.fixture
def saved(tmp_path):
    return small_checkpoint(tmp_path / "ck")


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


@pytest.mark.parametrize("anchor", [False, True])
def test_export_attaches_a_corrector_saved_alone_bit_for_bit(saved, tmp_path, anchor):
    """`dcoco export --corrector`: a corrector saved as its state_dict (as `dcoco demo`'s corrector and anchor
    stages write it, the anchor flag in the file's metadata) joins the checkpoint's drafter, replacing its own."""
    from dcoco.corrector import Corrector
    from helpers.tiny_models import SMALL_D

    torch.manual_seed(1)
    c = Corrector(SMALL_D, width=24, mlp_hidden=40, anchor_transition=anchor)
    for p in c.parameters():
        torch.nn.init.normal_(p)
    stage = tmp_path / "stage"
    stage.mkdir()
    save_file(c.state_dict(), str(stage / "model.safetensors"),
              metadata={"anchor_transition": str(anchor).lower(), "num_candidates": "12"})
    out = tmp_path / "out"
    assert cli.main(["export", str(saved), str(out), "--corrector", str(stage)]) == 0
    drafter, got = checkpoint.load(out, dtype=torch.float32)
    assert isinstance(got, Corrector) and got.anchor_transition == anchor
    assert (got.width, got.mlp_hidden, got.num_candidates) == (24, 40, 12)
    for k, v in c.state_dict().items():
        assert torch.equal(got.state_dict()[k], v), k
    for k, v in checkpoint.load(saved, dtype=torch.float32)[0].state_dict().items():
        assert torch.equal(drafter.state_dict()[k], v), k


def test_a_corrector_that_does_not_fit_is_named_and_nothing_is_written(saved, tmp_path):
    from dcoco.corrector import Corrector
    from helpers.tiny_models import SMALL_D

    wide = tmp_path / "wide.safetensors"
    save_file(Corrector(SMALL_D + 8).state_dict(), str(wide))
    save_file({"fc.weight": torch.randn(4, 4)}, str(tmp_path / "other.safetensors"))
    for extra, message in {("--corrector", str(wide)): f"corrector: hidden_size {SMALL_D + 8} differs",
                           ("--corrector", str(tmp_path / "other.safetensors")): "holds no dcoco.Corrector",
                           ("--corrector", str(tmp_path / "nowhere")): "no such file or folder",
                           ("--corrector", str(wide), "--drafter-only"): "leave out drafter_only",
                           ("--corrector", str(wide), "--format", "gguf"): "--corrector: attached with --format "
                                                                          "dflash only"}.items():
        with pytest.raises(SystemExit, match=message):
            cli.main(["export", str(saved), str(tmp_path / "out"), *extra])
        assert not (tmp_path / "out").exists()
