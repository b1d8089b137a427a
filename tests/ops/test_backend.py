"""Backend choice (backend.py): the setting, the decision for every kind of device, build_info, the log line."""

import logging
import os
import subprocess
import sys

import pytest
import torch

import dcoco
from dcoco.ops import backend

from helpers import ROOT
from helpers.cases import make_case


def test_set_get_and_context_manager():
    assert dcoco.get_backend() in backend.BACKENDS
    before = dcoco.get_backend()
    with dcoco.use_backend("native"):
        assert dcoco.get_backend() == "native"
        with dcoco.use_backend("fused"):
            assert dcoco.get_backend() == "fused"
        assert dcoco.get_backend() == "native"
    assert dcoco.get_backend() == before
    with pytest.raises(ValueError, match="backend: expected one of auto, fused, native, got 'triton'"):
        dcoco.set_backend("triton")
    assert dcoco.get_backend() == before


@pytest.mark.parametrize("value,want", [("native", "native"), ("FUSED", "fused"), ("", "auto")])
def test_environment_variable(value, want):
    env = {**os.environ, "DCOCO_BACKEND": value}
    out = subprocess.run([sys.executable, "-c", "import dcoco; print(dcoco.get_backend())"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == want


def test_bad_environment_variable_is_named():
    env = {**os.environ, "DCOCO_BACKEND": "cuda"}
    r = subprocess.run([sys.executable, "-c", "import dcoco"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "DCOCO_BACKEND: expected one of auto, fused, native, got 'cuda'" in r.stderr


BUILT = ("sm_80", "sm_90", "sm_100")


@pytest.mark.parametrize("setting,device,arch,built,validated,path,want,why", [
    ("auto", "cpu", None, True, (), None, "fused", "compiled CPU core"),
    ("native", "cpu", None, True, (), None, "native", "forced"),
    ("fused", "cpu", None, False, (), None, "fused", "forced"),
    ("auto", "cuda", "sm_90", False, (), None, "native", "nvcc was not found"),
    ("auto", "cuda", "sm_86", True, ("sm_86",), "sm80", "native",
     "no kernel for sm_86 (built for sm_80, sm_90, sm_100)"),
    ("auto", "cuda", "sm_90", True, (), "sm90", "native", "not validated on sm_90"),
    ("auto", "cuda", "sm_90", True, ("sm_90",), "sm90", "fused", "validated on sm_90 (sm90 path)"),
    ("auto", "cuda", "sm_100", True, ("sm_90",), "sm100", "native", "not validated on sm_100"),
    ("fused", "cuda", "sm_90", True, (), "sm90", "fused", "forced (sm90 path)"),
    ("fused", "cuda", "sm_103", True, (), "sm80", "fused", "forced (sm80 path)"),  # PTX JIT: mma.sync, no tcgen05
    ("fused", "cuda", "sm_75", True, (), None, "native", "none of this build's code runs on sm_75 (built for sm_80"),
    ("auto", "cuda", "sm_90", True, ("sm_90",), None, "native", "none of this build's code runs on sm_90"),
    ("native", "cuda", "sm_90", True, ("sm_90",), "sm90", "native", "forced"),
    ("auto", "mps", None, True, (), None, "native", "no fused kernel for mps"),
    ("auto", "xpu", None, True, (), None, "native", "no fused kernel for xpu"),
])
def test_decision_for_every_kind_of_device(setting, device, arch, built, validated, path, want, why):
    name, reason = backend.decide(setting, device, arch, built, BUILT if built else (), validated, path)
    assert name == want and why in reason


ARCHS = "80,90a,100a"  # the default DCOCO_CUDA_ARCHS


@pytest.mark.parametrize("major,minor,ptx,built,force,want", [
    (9, 0, 90, ARCHS, "", "sm90"),      # H100/H200: the sm_90a image, wgmma
    (10, 0, 100, ARCHS, "", "sm100"),   # B200: the sm_100a image, tcgen05
    (10, 3, 80, ARCHS, "", "sm80"),     # B300: no sm_103a image; the driver JITs compute_80 PTX (never the trap)
    (10, 3, 103, "80,103a", "", "sm100"),
    (12, 0, 80, ARCHS, "", "sm80"),     # RTX 5090: compute_80 PTX
    (8, 6, 80, ARCHS, "", "sm80"),      # A10 / RTX 3090: sm_80 SASS
    (9, 0, 80, "80", "", "sm80"),       # a build without 90a: mma.sync on an H100
    (9, 0, 90, "80,90", "", "sm80"),    # compute_90 without "a" has no wgmma
    (7, 5, None, ARCHS, "", None),      # T4: no image loads; the backend runs native
    (9, 0, 90, ARCHS, "simt", "simt"),
    (9, 0, 90, ARCHS, "sm80", "sm80"),
    (10, 0, 100, ARCHS, "sm100", "sm100"),
])
def test_arch_path_from_the_loaded_image(major, minor, ptx, built, force, want):
    assert dcoco._C.pick_cuda_path(major, minor, ptx, built, force) == want


@pytest.mark.parametrize("major,minor,ptx,force,match", [
    (10, 3, 80, "sm100", "has no sm100 path"),  # forcing tcgen05 where only PTX for sm_80 loaded
    (9, 0, 80, "sm90", "has no sm90 path"),
    (8, 0, 80, "sm90", "has no sm90 path"),
    (9, 0, 90, "wgmma", "expected simt, sm80, sm90 or sm100"),
])
def test_forced_path_the_image_lacks_is_refused(major, minor, ptx, force, match):
    with pytest.raises(ValueError, match=match):
        dcoco._C.pick_cuda_path(major, minor, ptx, ARCHS, force)


def test_fused_forced_where_no_kernel_exists_is_refused():
    with pytest.raises(ValueError, match="backend: 'fused' has no kernel for mps tensors"):
        backend.decide("fused", "mps")


def test_no_arch_is_validated_until_a_gpu_check_is_committed():
    """VALIDATED_CUDA_ARCHS grows only with a passing bench/gpu_check.sh JSON committed for that arch."""
    import json

    results = ROOT / "bench" / "results" / "gpu"
    passed = set()
    for f in results.glob("*.json") if results.exists() else []:
        data = json.loads(f.read_text())
        if data.get("passed"):
            passed.add(data["arch"])
    assert set(backend.VALIDATED_CUDA_ARCHS) <= passed


@pytest.fixture
def auto():
    with dcoco.use_backend("auto"):  # whatever DCOCO_BACKEND the suite runs under
        yield


def test_build_info_reports_every_visible_device(auto):
    info = dcoco.build_info()
    assert info["backend"] == "auto"
    assert info["devices"]["cpu"] == {"backend": "fused", "why": "the compiled CPU core"}
    assert info["validated_cuda_archs"] == list(backend.VALIDATED_CUDA_ARCHS)
    assert info["built_with_cuda"] == bool(info["cuda_archs"])
    with dcoco.use_backend("native"):
        assert dcoco.build_info()["devices"]["cpu"]["backend"] == "native"


def test_one_log_line_per_device(caplog, monkeypatch, auto):
    monkeypatch.setattr(backend, "_decided", {})
    with caplog.at_level(logging.WARNING, logger="dcoco"):
        for _ in range(3):
            assert backend.resolve("mps") == ("native", "no fused kernel for mps")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["dcoco: mps runs the native PyTorch backend: no fused kernel for mps"]


def test_the_setting_reaches_every_entry_point(monkeypatch):
    """Corrector.score / forward / prepare_inference and select call native.* exactly when the backend says."""
    from dcoco.ops import native

    calls = []
    for name in ("score", "correct", "cand_table", "select"):
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    case = make_case(2, 4, 4, 32, seed=3)
    m = case.corrector
    for setting, want in (("fused", []), ("native", ["score", "correct", "cand_table", "correct", "select"])):
        calls.clear()
        with dcoco.use_backend(setting):
            scores = m.score(*case.inputs)
            m(*case.inputs)
            m.prepare_inference(case.embed)
            m(*case.inputs)
            dcoco.select(scores, case.cand_logits[:, 0], "global")
        m.unprepare()
        assert calls == want, setting


def test_cpu_only_torch_has_no_cuda_to_decide_on():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert set(dcoco.build_info()["devices"]) <= {"cpu", "mps"} | {f"xpu:{i}" for i in range(8)}
