"""dcoco's PEP 517 backend: scikit-build-core's, plus [tool.dcoco].cuda-build-requires (the CUTLASS headers) in the
build requirements when the build will try CUDA, so plain `pip install .` (an isolated build) compiles the kernel.

A CPU-only build does not ask for them: nvidia-cutlass is needed for its headers alone, but a build environment
installs it with its dependencies (cuda-python, scipy, numpy, networkx, pydot, treelib: about 350 MB), and
cuda-bindings has no wheel for some platforms (macOS), where asking would break the build."""

from __future__ import annotations

import os
import shlex
import shutil
import sys

from scikit_build_core import build as _skbuild
from scikit_build_core.build import *  # noqa: F401,F403  the hooks not changed here

if sys.version_info >= (3, 11):
    import tomllib
else:  # scikit-build-core depends on tomli there
    import tomli as tomllib


def _define(config_settings, name: str, env: bool = False) -> str | None:
    """A CMake define as the build will see it: -Ccmake.define.NAME=..., else (where [tool.scikit-build.cmake.define]
    maps it) the environment variable."""
    value = (config_settings or {}).get(f"cmake.define.{name}")
    return value if isinstance(value, str) else os.environ.get(name) if env else None


def _nvcc(config_settings) -> str | None:
    """The CUDA compiler CMake would look at: CMAKE_CUDA_COMPILER, else CUDACXX, else nvcc on PATH or in CUDA_PATH."""
    named = _define(config_settings, "CMAKE_CUDA_COMPILER") or os.environ.get("CUDACXX")
    if named:
        return shutil.which(shlex.split(named)[0])
    cuda_path = os.environ.get("CUDA_PATH")
    return shutil.which("nvcc") or (shutil.which("nvcc", path=os.path.join(cuda_path, "bin")) if cuda_path else None)


def cuda_build_requires(config_settings=None) -> list[str]:
    if (_define(config_settings, "DCOCO_CUDA", env=True) or "AUTO").upper() == "OFF":
        return []
    if _define(config_settings, "CUTLASS_INCLUDE_DIR") or not _nvcc(config_settings):
        return []
    with open("pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["dcoco"]["cuda-build-requires"])


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return [*_skbuild.get_requires_for_build_wheel(config_settings), *cuda_build_requires(config_settings)]


def get_requires_for_build_editable(config_settings=None) -> list[str]:
    return [*_skbuild.get_requires_for_build_editable(config_settings), *cuda_build_requires(config_settings)]
