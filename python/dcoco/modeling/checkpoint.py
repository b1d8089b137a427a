"""The serving checkpoint: the DFlash layout (what vLLM's DFlash loader reads) plus the corrector.

config.json: the drafter's DFlash config with `architectures: ["DFlashDCOCODraftModel"]` and
`dcoco_config: {num_candidates, width, mlp_hidden, selection, anchor_transition}` (anchor_transition absent: off,
the paper's corrector); model.safetensors: the drafter's tensors
and the corrector's under `corrector.` (Corrector's state_dict names). Without a corrector it is a plain
DFlash checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..ops import fused
from ..corrector import Corrector
from .dflash import ARCHITECTURE as DFLASH_ARCHITECTURE
from .dflash import DFlashDrafter
from ..files import replacing_folder
from .weights import check_state, read_config, read_tensors

ARCHITECTURE = "DFlashDCOCODraftModel"
PREFIX = "corrector."


def _not_checkpoint_file(name: str) -> bool:
    """What else a checkpoint folder may hold (a tokenizer, notes, a run's logs) and a new save keeps."""
    return name not in ("config.json", "model.safetensors.index.json") and not name.endswith(".safetensors")


def save(path: str | Path, drafter: DFlashDrafter, corrector: Corrector | None = None,
         selection: str = "greedy", dtype: torch.dtype | None = None) -> None:
    """Write drafter (+ corrector) to the directory path: the new config.json and model.safetensors are written
    beside it, fsynced, and swapped in with the folder in one step (files.replacing_folder), so a reader sees the
    old checkpoint or the new one, never one's config with the other's tensors; the folder's other files stay. A
    failed write is an OSError naming the folder, which is then as it was. selection: the path rule a server
    should use. dtype: the stored dtype (default: the drafter's; serving checkpoints are usually bfloat16)."""
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"drafter: expected a DFlashDrafter, got {type(drafter).__name__}")
    if corrector is not None:
        _check_corrector(drafter, corrector, selection)
    try:
        with replacing_folder(path, carry=_not_checkpoint_file) as tmp:
            _write(tmp, drafter, corrector, selection, dtype)
            mode = 0o666 & ~_umask()  # safetensors writes 0600; a serving user other than the owner must read it
            for f in tmp.iterdir():
                os.chmod(f, mode)
    except (ValueError, TypeError):
        raise
    except Exception as e:  # a full disk, safetensors' own errors, ...: one line, the old checkpoint intact
        raise OSError(f"{path}: writing the checkpoint failed ({type(e).__name__}: {e}); the folder is as it "
                      f"was") from e


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _check_corrector(drafter: DFlashDrafter, corrector, selection: str) -> None:
    if not isinstance(corrector, Corrector):
        raise TypeError(f"corrector: expected a dcoco.Corrector or None, got {type(corrector).__name__}")
    if corrector.hidden_size != drafter.config.hidden_size:
        raise ValueError(f"corrector: hidden_size {corrector.hidden_size} differs from the drafter's "
                         f"{drafter.config.hidden_size}")
    if selection not in fused.RULES:
        raise ValueError(f"selection: expected one of {sorted(fused.RULES)}, got {selection!r}")


def _write(path: Path, drafter: DFlashDrafter, corrector: Corrector | None, selection: str,
           dtype: torch.dtype | None) -> None:
    if corrector is None:
        drafter.save_pretrained(path, dtype=dtype)
        return
    dcoco_config = {"num_candidates": corrector.num_candidates, "width": corrector.width,
                    "mlp_hidden": corrector.mlp_hidden, "selection": selection}
    if corrector.anchor_transition:  # written only when on: the paper's checkpoints stay as they were
        dcoco_config["anchor_transition"] = True
    drafter.save_pretrained(path, extra_tensors={PREFIX + k: v for k, v in corrector.state_dict().items()},
                            config_update={"architectures": [ARCHITECTURE], "dcoco_config": dcoco_config},
                            dtype=dtype)


def load(path: str | Path, dtype: torch.dtype | None = None,
         device: torch.device | str = "cpu") -> tuple[DFlashDrafter, Corrector | None]:
    """(drafter, corrector) from a DCOCO checkpoint, (drafter, None) from a plain DFlash one. dtype defaults
    to the checkpoint's. ValueError names what is wrong: architecture, dcoco_config, corrector tensors."""
    path = Path(path)
    cfg = read_config(path)
    arch = cfg.get("architectures")
    dcoco = ARCHITECTURE in (arch if isinstance(arch, list) else [])
    if not dcoco:
        if "dcoco_config" in cfg:
            raise ValueError(f"{path}: dcoco_config given but architectures is {arch!r}, not [{ARCHITECTURE!r}]")
        return DFlashDrafter.from_pretrained(path, dtype, device), None  # corrector.* tensors: "unexpected"
    dc = dcoco_config(cfg.get("dcoco_config"), path)
    drafter = DFlashDrafter.from_pretrained(path, dtype, device, architectures=(DFLASH_ARCHITECTURE, ARCHITECTURE),
                                            skip_prefix=PREFIX)
    tensors = {k[len(PREFIX):]: v for k, v in read_tensors(path, lambda k: k.startswith(PREFIX)).items()}
    with torch.device("meta"):
        corrector = Corrector(drafter.config.hidden_size, dc["num_candidates"], dc["width"], dc["mlp_hidden"],
                              dc["anchor_transition"])
    check_state(tensors, {k: v.shape for k, v in corrector.state_dict().items()}, str(path),
                "corrector tensors do not match dcoco_config", PREFIX)
    dtype = dtype or drafter.fc.weight.dtype
    corrector.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}, assign=True)
    return drafter, corrector


def export(src: str | Path, out: str | Path, drafter_only: bool = False, dtype: str | None = None) -> Path:
    """Rewrite the checkpoint at src into out: drafter_only drops the corrector (a plain DFlash checkpoint, what
    vLLM serves as DFlash: the "same drafter, corrector off" baseline); dtype ("bfloat16", "float16", "float32")
    casts the stored tensors. Returns out."""
    if Path(out).resolve() == Path(src).resolve():
        raise ValueError(f"out: {out} is the source checkpoint; write to another folder")
    if dtype is not None and dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype: expected bfloat16, float16 or float32, got {dtype!r}")
    drafter, corrector = load(src)
    selection = (read_config(src).get("dcoco_config") or {}).get("selection", "greedy")
    save(out, drafter, None if drafter_only else corrector, selection, getattr(torch, dtype) if dtype else None)
    return Path(out)


def dcoco_config(dc, path: Path) -> dict:
    """The checked dcoco_config of a checkpoint at path (ValueError naming the bad key)."""
    if not isinstance(dc, dict):
        raise ValueError(f"{path}: {ARCHITECTURE} needs a dcoco_config object in config.json, got {dc!r}")
    for key, lo in (("num_candidates", 1), ("width", 2), ("mlp_hidden", 1)):
        v = dc.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{path}: dcoco_config.{key}: expected an integer >= {lo}, got {v!r}")
    if dc["num_candidates"] > fused.MAX_CANDIDATES:
        raise ValueError(f"{path}: dcoco_config.num_candidates: at most {fused.MAX_CANDIDATES}, "
                         f"got {dc['num_candidates']}")
    if dc.get("selection") not in fused.RULES:
        raise ValueError(f"{path}: dcoco_config.selection: expected one of {sorted(fused.RULES)}, "
                         f"got {dc.get('selection')!r}")
    anchor = dc.get("anchor_transition", False)
    if not isinstance(anchor, bool):
        raise ValueError(f"{path}: dcoco_config.anchor_transition: expected true or false, got {anchor!r}")
    return {**dc, "anchor_transition": anchor}
