"""The tensor-core policies' instructions emulated on the CPU (tests/emulate/emu_<arch>.h, from the PTX ISA's fragment
and descriptor layouts), each policy run by tests/emulate/unit_<arch>.cpp through the real mainloop in one emulated
block against a float64 product of its 16-bit planes, plus negative checks (a wrong smem layout or swizzle must give
a wrong product; a missing fence must be reported). The whole fused kernel with these policies is
tests/test_cuda_emulated.py::test_tensor_core_paths_match_reference. Needs g++ (C++20), the CUDA toolkit's headers and
the nvidia-cutlass wheel's CuTe headers."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from test_cuda_emulated import cutlass_include, toolkit_includes

ROOT = Path(__file__).parents[1]


def build_unit(tmp_path_factory, arch: str) -> Path:
    """tests/emulate/unit_<arch>.cpp with the instructions emulated; DCOCO_EMU_FLAGS replaces -O2 and DCOCO_EMU_DIR is
    the build folder (scripts/cuda_coverage.sh), as for tests/test_cuda_emulated.py's runners."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("needs g++ to build the emulated kernels")
    folder = Path(os.environ["DCOCO_EMU_DIR"]) if os.environ.get("DCOCO_EMU_DIR") else tmp_path_factory.mktemp("emu")
    exe = folder / f"unit_{arch}"
    flags = os.environ.get("DCOCO_EMU_FLAGS", "-O2").split()
    subprocess.run([cxx, "-std=c++20", *flags, "-DDCOCO_EMULATE_MMA", cutlass_include(), "-Wno-deprecated-declarations",
                    "-pthread", f"-I{ROOT / 'tests/emulate'}", f"-I{ROOT / 'cuda'}", f"-I{ROOT / 'cpp/include'}",
                    *toolkit_includes(), str(ROOT / f"tests/emulate/unit_{arch}.cpp"), "-o", str(exe)],
                   check=True, cwd=folder)
    return exe


@pytest.mark.parametrize("arch", ["sm80", "sm90", "sm100"])
def test_emulated_tensor_core_policy(tmp_path_factory, arch):
    run = subprocess.run([str(build_unit(tmp_path_factory, arch))], capture_output=True, text=True)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
