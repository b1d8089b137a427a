"""dcoco: the DCOCO contextual corrector for parallel (DFlash) speculative drafts.

See docs/spec.md in the repository for the math. Public API:
  Corrector         the nn.Module (score, forward, prepare_inference); score has a compiled backward
  select            path selection on a score grid (greedy, global, geometric)
  correction_loss   the paper's L_corr (eq. 9) on a score grid
  DFlashDrafter     the DFlash drafter (DFlashConfig, dflash_loss), z-lab checkpoint layout
  dcoco.specdec.engine
                    the offline speculative-decoding engine (Engine, target_only, summarize)
  dcoco.train.training
                    dcoco train's Python API (corpus, modes, DDP, checkpoints)
  set_backend / use_backend / get_backend
                    the fused kernel or the native PyTorch path (ops/backend.py; DCOCO_BACKEND)
  build_info()      how dcoco was built, and the backend each visible device gets and why
  cuda_available()  whether the compiled CUDA path can run here
"""

import torch  # noqa: F401  (first: the core shares torch's OpenMP runtime)

from . import _C
from .ops import backend
from .ops.fused import MAX_CANDIDATES
from .ops.backend import get_backend, set_backend, use_backend
from .corrector import Corrector
from .modeling.dflash import DFlashConfig, DFlashDrafter, dflash_loss
from .loss import correction_loss
from .ops.select import select

__version__ = "0.1.0"
__all__ = ["Corrector", "select", "correction_loss", "DFlashConfig", "DFlashDrafter", "dflash_loss",
           "cuda_available", "build_info", "MAX_CANDIDATES", "set_backend", "use_backend", "get_backend"]


def cuda_available() -> bool:
    """True when dcoco was compiled with CUDA and a CUDA device is visible; never raises."""
    return _C.built_with_cuda and _C.cuda_status()[0] > 0


def build_info() -> dict:
    """How this dcoco was built and what it sees: CUDA compiled in (and for which archs), CUTLASS version,
    device status, the backend setting, and for each visible device the backend its tensors get and why."""
    count, message = _C.cuda_status()
    return {"version": __version__, "built_with_cuda": _C.built_with_cuda, "cuda_archs": list(backend.BUILT_CUDA_ARCHS),
            "validated_cuda_archs": list(backend.VALIDATED_CUDA_ARCHS), "cutlass": _C.cutlass_version,
            "cuda_devices": count, "cuda_status": message, "max_candidates": MAX_CANDIDATES,
            "backend": backend.get_backend(),
            "devices": backend.describe()}
