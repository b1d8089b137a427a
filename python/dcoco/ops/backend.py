"""Which implementation runs the corrector's math on a device: the fused compiled kernel or the native
PyTorch path (native.py). Decided here and nowhere else.

Settings (DCOCO_BACKEND in the environment at import, or set_backend / use_backend from Python):
  auto    the fused kernel where it is proven: the CPU always; a CUDA device only when this build holds code
          for its arch and the arch is in VALIDATED_CUDA_ARCHS. Anything else runs native, with one log line
          per device saying why.
  fused   the kernel wherever it exists (CPU, CUDA), validated or not; a GPU that none of this build's code runs
          on (an arch older than every one built) runs native, with a warning naming it and the archs built.
  native  plain PyTorch everywhere.
Devices without a fused kernel (MPS, XPU, ...) always run native.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch

from .. import _C

BACKENDS = ("auto", "fused", "native")
# Archs whose fused CUDA path passed bench/gpu_check.sh, with its JSON committed under bench/results/gpu/.
# Empty until an arch passes it: every CUDA device runs native under "auto".
VALIDATED_CUDA_ARCHS: tuple[str, ...] = ()
# The CUDA archs this build holds code for, as sm_XY (e.g. sm_80, sm_90, sm_100 from DCOCO_CUDA_ARCHS 80;90a;100a).
BUILT_CUDA_ARCHS: tuple[str, ...] = tuple(f"sm_{a.rstrip('af')}" for a in _C.cuda_archs.split(",")
                                          if a.rstrip("af").isdigit())

log = logging.getLogger("dcoco")


def _checked(name, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{source}: expected one of {', '.join(BACKENDS)}, got {name!r}")
    return name


_setting = _checked(os.environ.get("DCOCO_BACKEND", "auto").strip().lower() or "auto", "DCOCO_BACKEND")
_decided: dict[tuple[str, str], tuple[str, str]] = {}


def get_backend() -> str:
    """The current setting: 'auto', 'fused' or 'native'."""
    return _setting


def set_backend(name: str) -> None:
    """Sets the backend for every later call in this process: 'auto', 'fused' or 'native'."""
    global _setting
    _setting = _checked(name, "backend")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """with dcoco.use_backend('native'): ...  sets the backend inside the block, restores it after.
    Process-wide (not per thread), like set_backend."""
    before = get_backend()
    set_backend(name)
    try:
        yield
    finally:
        set_backend(before)


def _cuda_arch(index: int | None) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _cuda_path(index: int | None) -> str | None:
    """The fused kernel's arch path on CUDA device index: what the code the runtime loaded for it holds
    (dcoco/dispatch.h), or None when none of this build's code runs there."""
    try:
        with torch.cuda.device(index):
            return _C.cuda_path()
    except RuntimeError:
        return None


def decide(setting: str, device_type: str, arch: str | None = None, built_with_cuda: bool = False,
           built_archs: tuple[str, ...] = (), validated: tuple[str, ...] = (), path: str | None = None
           ) -> tuple[str, str]:
    """(backend, why) from the facts alone: the setting, the device type, the CUDA device's arch (sm_XY), what
    this build holds, and the kernel path the build's code offers on the device (None: no code loads there).
    Pure, so every branch is tested on a machine without a GPU."""
    if setting == "native":
        return "native", "native forced (DCOCO_BACKEND / dcoco.set_backend)"
    if device_type in ("cpu", "meta"):
        return "fused", "the compiled CPU core" if setting == "auto" else "fused forced"
    if device_type != "cuda":
        if setting == "fused":
            raise ValueError(f"backend: 'fused' has no kernel for {device_type} tensors (cpu and cuda only); "
                             "use 'auto' or 'native'")
        return "native", f"no fused kernel for {device_type}"
    if not built_with_cuda:
        if setting == "fused":
            return "fused", "fused forced"  # the op then says the build has no CUDA
        return "native", "the CUDA kernel was not built (nvcc was not found when dcoco was installed)"
    built = ", ".join(built_archs) or "none"
    if path is None:
        return "native", f"none of this build's code runs on {arch} (built for {built})"
    if setting == "fused":
        return "fused", f"fused forced ({path} path)"
    if arch not in built_archs:
        return "native", f"this build has no kernel for {arch} (built for {built})"
    if arch not in validated:
        return "native", f"the fused kernel is not validated on {arch} yet (bench/gpu_check.sh)"
    return "fused", f"the fused kernel, validated on {arch} ({path} path)"


@torch.compiler.assume_constant_result
def _resolve_key(setting: str, device: str) -> tuple[str, str]:
    key = (setting, device)
    if key not in _decided:
        dev = torch.device(device)
        cuda = dev.type == "cuda" and _C.built_with_cuda and setting != "native"
        arch, path = (_cuda_arch(dev.index), _cuda_path(dev.index)) if cuda else (None, None)
        _decided[key] = decide(setting, dev.type, arch, _C.built_with_cuda, BUILT_CUDA_ARCHS, VALIDATED_CUDA_ARCHS,
                               path)
        name, why = _decided[key]
        if name == "native" and setting != "native":
            log.warning("dcoco: %s runs the native PyTorch backend: %s", device, why)
    return _decided[key]


def resolve(device: torch.device | str) -> tuple[str, str]:
    """(backend, why) for tensors on device under the current setting; 'fused' or 'native'."""
    return _resolve_key(_setting, str(torch.device(device)))


def native(device: torch.device) -> bool:
    """True when calls on device take the native path."""
    return resolve(device)[0] == "native"


def devices() -> list[torch.device]:
    """Every device this process sees: the CPU, each CUDA device, and MPS / XPU where torch has them."""
    out = [torch.device("cpu")]
    if torch.cuda.is_available():
        out += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append(torch.device("mps"))
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        out += [torch.device("xpu", i) for i in range(xpu.device_count())]
    return out


def describe() -> dict[str, dict[str, str]]:
    """{device: {"backend": ..., "why": ...}} for every visible device under the current setting."""
    out = {}
    for dev in devices():
        try:
            name, why = resolve(dev)
        except ValueError as e:  # 'fused' forced where no kernel exists
            name, why = "none", str(e)
        out[str(dev)] = {"backend": name, "why": why}
    return out
