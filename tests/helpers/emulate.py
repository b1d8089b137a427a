"""Builds the emulated CUDA runners of tests/emulate with g++: the kernels' real host launchers and device code on
fake devices, the tensor-core instructions emulated when asked."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT


def toolkit_includes() -> list[str]:
    """The CUDA toolkit's headers (cuda_runtime.h, libcu++): the emulated launchers compile against the real runtime
    header, its functions defined for a fake device in tests/emulate/fake_runtime.h."""
    nvcc = shutil.which("nvcc")
    homes = [os.environ.get("CUDA_HOME", ""), str(Path(nvcc).resolve().parents[1]) if nvcc else "", "/usr/local/cuda"]
    inc = next((Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda_runtime.h").exists()), None)
    if inc is None:
        pytest.skip("needs the CUDA toolkit's headers (nvcc on PATH or CUDA_HOME) to build the emulated launchers")
    return [f"-I{inc}", f"-I{inc / 'cccl'}"]


def cutlass_include() -> str:
    spec = importlib.util.find_spec("cutlass_library")
    inc = Path(spec.submodule_search_locations[0]) / "source" / "include" if spec else None
    if inc is None or not (inc / "cute").exists():
        pytest.skip("needs the nvidia-cutlass wheel's CuTe headers to emulate the tensor-core paths")
    return f"-I{inc}"


def build(tmp_path_factory, name: str, mma: bool = False) -> Path:
    """The emulated runner `name` (with the tensor-core instructions emulated when mma); DCOCO_EMU_FLAGS replaces
    -O2 (scripts/cuda_coverage.sh builds with -O1 --coverage -fprofile-update=single into DCOCO_EMU_DIR)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("needs g++ to build the emulated kernels")
    folder = Path(os.environ["DCOCO_EMU_DIR"]) if os.environ.get("DCOCO_EMU_DIR") else tmp_path_factory.mktemp("emu")
    exe = folder / (name + "-mma" if mma else name)
    flags = os.environ.get("DCOCO_EMU_FLAGS", "-O2").split()
    extra = ["-DDCOCO_EMULATE_MMA", cutlass_include(), "-Wno-deprecated-declarations"] if mma else []
    includes = [f"-I{ROOT / inc}" for inc in ("tests/emulate", "cuda", "cpp/include", "cpp/shared")]
    subprocess.run([cxx, "-std=c++20", *flags, *extra, "-pthread", *includes, *toolkit_includes(),
                    str(ROOT / f"tests/emulate/{name}.cpp"), "-o", str(exe)], check=True, cwd=folder)
    return exe
