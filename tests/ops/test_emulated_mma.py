"""The tensor-core policies' instructions emulated on the CPU (tests/emulate/emu_<arch>.h, from the PTX ISA's fragment
and descriptor layouts), each policy run by tests/emulate/unit_<arch>.cpp through the real mainloop in one emulated
block against a float64 product of its 16-bit planes, plus negative checks (a wrong smem layout or swizzle must give
a wrong product; a missing fence must be reported). The whole fused kernel with these policies is
tests/ops/test_cuda_emulated.py::test_tensor_core_paths_match_reference. Needs g++ (C++20), the CUDA toolkit's
headers and the nvidia-cutlass wheel's CuTe headers."""

import subprocess

import pytest

from helpers.emulate import build

pytestmark = pytest.mark.slow  # g++ builds the emulated runners first: minutes on 2 cores


@pytest.mark.parametrize("arch", ["sm80", "sm90", "sm100"])
def test_emulated_tensor_core_policy(tmp_path_factory, arch):
    run = subprocess.run([str(build(tmp_path_factory, f"unit_{arch}", mma=True))], capture_output=True, text=True)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
