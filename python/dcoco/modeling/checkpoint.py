"""The serving checkpoint: the DFlash layout (what vLLM's DFlash loader reads) plus the corrector; and the
Qwen3 DSpark layout (what vLLM's qwen3_dspark.py reads) for a DFlash drafter with DSpark's heads.

config.json: the drafter's DFlash config with `architectures: ["DFlashDCOCODraftModel"]` and
`dcoco_config: {num_candidates, width, mlp_hidden, selection, anchor_transition}` (anchor_transition absent: off,
the paper's corrector); model.safetensors: the drafter's tensors
and the corrector's under `corrector.` (Corrector's state_dict names). Without a corrector it is a plain
DFlash checkpoint.

The DSpark layout (save_dspark, load_dspark): the same DFlash config and drafter tensors with
`architectures: ["Qwen3DSparkModel"]`, `markov_rank`, `markov_head_type: "vanilla"`, the confidence head on and
reading the Markov embedding (`enable_confidence_head`, `confidence_head_with_markov`), and
`sample_from_anchor: false` / `dspark_bonus_anchor: true`: the block is DFlash's [anchor, mask x N], the mask
slots predict, and the Markov walk starts from the anchor token, the contract DSparkHead is trained under. The
head's tensors go under vLLM's names: markov_head.markov_w1.weight (V,r), markov_head.markov_w2.weight (V,r),
confidence_head.proj.weight (1,d+r) and confidence_head.proj.bias (1,), zero: DSparkHead has no bias.

The Domino layout (a drafter trained with Domino's head; no server loads it, dcoco's engine and `dcoco eval` do):
the DFlash config with `architectures: ["DFlashDominoDraftModel"]` and `domino_config: {gru_size, mid_size}`, the
head's tensors under `domino.` (DominoHead's state_dict names; its GRU reads the target's embeddings, as wide as
the drafter).

save and load take and give any of the three modules beside the drafter: a Corrector, a DSparkHead, a DominoHead."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..ops import fused
from ..corrector import Corrector
from .dflash import ARCHITECTURE as DFLASH_ARCHITECTURE
from .dflash import DFlashDrafter
from .domino import DominoHead
from .draft_vocab import DraftHead
from .dspark import DSparkHead
from ..files import replacing_folder
from .weights import check_state, read_config, read_tensors

ARCHITECTURE = "DFlashDCOCODraftModel"
PREFIX = "corrector."
DSPARK_ARCHITECTURE = "Qwen3DSparkModel"
DSPARK_NAMES = {"markov_w1.weight": "markov_head.markov_w1.weight",  # DSparkHead's names -> the checkpoint's
                "markov_w2.weight": "markov_head.markov_w2.weight",
                "confidence_proj.weight": "confidence_head.proj.weight"}
DSPARK_BIAS = "confidence_head.proj.bias"
DSPARK_PREFIXES = ("markov_head.", "confidence_head.")
DOMINO_ARCHITECTURE = "DFlashDominoDraftModel"
DOMINO_PREFIX = "domino."

Second = Corrector | DSparkHead | DominoHead  # what a checkpoint may hold beside the drafter


def _not_checkpoint_file(name: str) -> bool:
    """What else a checkpoint folder may hold (a tokenizer, notes, a run's logs) and a new save keeps."""
    return name not in ("config.json", "model.safetensors.index.json") and not name.endswith(".safetensors")


def save(path: str | Path, drafter: DFlashDrafter, corrector: Second | None = None,
         selection: str = "greedy", dtype: torch.dtype | None = None) -> None:
    """Write drafter (+ corrector, or a DSpark or Domino head in its layout) to the directory path: the new
    config.json and model.safetensors are written beside it, fsynced, and swapped in with the folder in one step
    (files.replacing_folder), so a reader sees the old checkpoint or the new one, never one's config with the
    other's tensors; the folder's other files stay. A failed write is an OSError naming the folder, which is then
    as it was. selection: the path rule a server should use. dtype: the stored dtype (default: the drafter's;
    serving checkpoints are usually bfloat16)."""
    if isinstance(corrector, DSparkHead):
        save_dspark(path, drafter, corrector, dtype)
        return
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"drafter: expected a DFlashDrafter, got {type(drafter).__name__}")
    if isinstance(corrector, DominoHead):
        _save_domino(path, drafter, corrector, dtype)
        return
    if corrector is not None:
        _check_corrector(drafter, corrector, selection)
    _replace(path, lambda tmp: _write(tmp, drafter, corrector, selection, dtype))


def _replace(path: str | Path, write) -> None:
    """write(tmp) into a new folder that then takes path's place in one step (save's guarantees)."""
    try:
        with replacing_folder(path, carry=_not_checkpoint_file) as tmp:
            write(tmp)
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


def _check_head(drafter: DFlashDrafter, head: DSparkHead | DominoHead) -> None:
    c = drafter.config
    for name, mine, theirs in (("vocab_size", head.vocab_size, c.vocab_size),
                               ("hidden_size", head.hidden_size, c.hidden_size)):
        if mine != theirs:
            raise ValueError(f"head: {name} {mine} differs from the drafter's {theirs}")


def _check_corrector(drafter: DFlashDrafter, corrector, selection: str) -> None:
    if not isinstance(corrector, Corrector):
        raise TypeError(f"corrector: expected a dcoco.Corrector, DSparkHead, DominoHead or None, got "
                        f"{type(corrector).__name__}")
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
         device: torch.device | str = "cpu") -> tuple[DFlashDrafter, Second | None]:
    """(drafter, corrector) from a DCOCO checkpoint, (drafter, head) from a DSpark or Domino one, (drafter, None)
    from a plain DFlash one. dtype defaults to the checkpoint's. ValueError names what is wrong: architecture,
    dcoco_config, the corrector's or head's tensors."""
    path = Path(path)
    cfg = read_config(path)
    arch = cfg.get("architectures")
    arch = arch if isinstance(arch, list) else []
    if DSPARK_ARCHITECTURE in arch:
        return load_dspark(path, dtype, device)
    if DOMINO_ARCHITECTURE in arch:
        return _load_domino(path, cfg, dtype, device)
    dcoco = ARCHITECTURE in arch
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


def _save_domino(path: str | Path, drafter: DFlashDrafter, head: DominoHead, dtype: torch.dtype | None) -> None:
    """The Domino layout (the module docstring's), written atomically like save."""
    _check_head(drafter, head)
    if head.embed_size != drafter.config.hidden_size:
        raise ValueError(f"head: embed_size {head.embed_size} differs from the drafter's hidden_size "
                         f"{drafter.config.hidden_size} (the target's embeddings)")
    config = {"architectures": [DOMINO_ARCHITECTURE],
              "domino_config": {"gru_size": head.gru_size, "mid_size": head.mid_size}}
    tensors = {DOMINO_PREFIX + k: v for k, v in head.state_dict().items()}
    _replace(path, lambda tmp: drafter.save_pretrained(tmp, extra_tensors=tensors, config_update=config, dtype=dtype))


def _load_domino(path: Path, cfg: dict, dtype: torch.dtype | None,
                 device: torch.device | str) -> tuple[DFlashDrafter, DominoHead]:
    dc = cfg.get("domino_config")
    sizes = dc if isinstance(dc, dict) else {}
    for key in ("gru_size", "mid_size"):
        v = sizes.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{path}: domino_config.{key}: expected an integer >= 1, got {v!r}")
    drafter = DFlashDrafter.from_pretrained(path, dtype, device, architectures=(DOMINO_ARCHITECTURE,),
                                            skip_prefix=DOMINO_PREFIX)
    c = drafter.config
    with torch.device("meta"):
        head = DominoHead(c.hidden_size, c.hidden_size, c.vocab_size, sizes["gru_size"], sizes["mid_size"])
    tensors = {k[len(DOMINO_PREFIX):]: v
               for k, v in read_tensors(path, lambda k: k.startswith(DOMINO_PREFIX)).items()}
    check_state(tensors, {k: v.shape for k, v in head.state_dict().items()}, str(path),
                "Domino head tensors do not match domino_config", DOMINO_PREFIX)
    dtype = dtype or drafter.fc.weight.dtype
    head.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}, assign=True)
    return drafter, head


def export(src: str | Path, out: str | Path, drafter_only: bool = False, dtype: str | None = None,
           dspark_head: str | Path | DSparkHead | None = None, draft_head: DraftHead | None = None,
           corrector: str | Path | Corrector | None = None) -> Path:
    """Rewrite the checkpoint at src into out: drafter_only drops the corrector (a plain DFlash checkpoint, what
    vLLM serves as DFlash: the "same drafter, corrector off" baseline); dspark_head (a DSparkHead, or the file or
    folder read_dspark_head reads) writes src's drafter with that head in the DSpark layout instead (the corrector
    left out; save_dspark); draft_head gives the drafter that shortlisted head (draft_vocab.py), replacing any it
    had; corrector (a Corrector, or the file or folder read_corrector reads) replaces src's corrector, if any;
    dtype ("bfloat16", "float16", "float32") casts the stored tensors. Returns out."""
    if Path(out).resolve() == Path(src).resolve():
        raise ValueError(f"out: {out} is the source checkpoint; write to another folder")
    if dtype is not None and dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype: expected bfloat16, float16 or float32, got {dtype!r}")
    if dspark_head is not None and drafter_only:
        raise ValueError("drafter_only: a DSpark checkpoint holds the drafter and its head, never a corrector; "
                         "leave drafter_only out with dspark_head")
    if corrector is not None and (drafter_only or dspark_head is not None):
        raise ValueError("corrector: a corrector is written into a DFlash/DCOCO checkpoint; leave out drafter_only "
                         "and dspark_head with it")
    head = dspark_head if dspark_head is None or isinstance(dspark_head, DSparkHead) else read_dspark_head(dspark_head)
    attached = corrector if corrector is None or isinstance(corrector, Corrector) else read_corrector(corrector)
    drafter, second = load(src)
    if attached is not None:
        if attached.hidden_size != drafter.config.hidden_size:
            raise ValueError(f"corrector: hidden_size {attached.hidden_size} differs from the drafter's "
                             f"{drafter.config.hidden_size}")
        second = attached
    if draft_head is not None:
        if head is not None or isinstance(second, (DSparkHead, DominoHead)):
            raise ValueError("draft_head: DSpark's and Domino's heads read the drafter's logits over the whole "
                             "vocabulary; a shortlisted head is for DFlash and DCOCO checkpoints")
        if draft_head.vocab_size != drafter.config.vocab_size or \
                draft_head.weight.shape[1] != drafter.config.hidden_size:
            raise ValueError(f"draft_head: a head over a vocabulary of {draft_head.vocab_size} with rows of "
                             f"{draft_head.weight.shape[1]}, but the drafter has vocab_size "
                             f"{drafter.config.vocab_size} and hidden_size {drafter.config.hidden_size}")
        drafter.draft_head = draft_head
    cast = getattr(torch, dtype) if dtype else None
    if head is not None:
        save_dspark(out, drafter, head, cast)
        return Path(out)
    selection = (read_config(src).get("dcoco_config") or {}).get("selection", "greedy")
    save(out, drafter, None if drafter_only else second, selection, cast)
    return Path(out)


def save_dspark(path: str | Path, drafter: DFlashDrafter, head: DSparkHead, dtype: torch.dtype | None = None) -> None:
    """Write drafter and DSpark's heads as the Qwen3 DSpark checkpoint vLLM loads (the module docstring's layout),
    atomically like save (config.json and model.safetensors swapped in with the folder in one step; a failed write
    is an OSError naming the folder, which is then as it was). dtype: the stored dtype (default: the drafter's).
    ValueError when the head's vocab_size or hidden_size is not the drafter's."""
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"drafter: expected a DFlashDrafter, got {type(drafter).__name__}")
    if not isinstance(head, DSparkHead):
        raise TypeError(f"head: expected a dcoco.modeling.dspark.DSparkHead, got {type(head).__name__}")
    _check_head(drafter, head)
    state = head.state_dict()
    tensors = {DSPARK_NAMES[k]: v for k, v in state.items()}
    tensors[DSPARK_BIAS] = torch.zeros(1, dtype=state["confidence_proj.weight"].dtype)
    config = {"architectures": [DSPARK_ARCHITECTURE], "markov_rank": head.rank, "markov_head_type": "vanilla",
              "sample_from_anchor": False, "dspark_bonus_anchor": True, "enable_confidence_head": True,
              "confidence_head_with_markov": True}
    _replace(path, lambda tmp: drafter.save_pretrained(tmp, extra_tensors=tensors, config_update=config,
                                                       dtype=dtype))


def load_dspark(path: str | Path, dtype: torch.dtype | None = None,
                device: torch.device | str = "cpu") -> tuple[DFlashDrafter, DSparkHead]:
    """(drafter, head) from a DSpark checkpoint save_dspark wrote (or one of that layout). dtype defaults to the
    checkpoint's. ValueError names what does not fit: the architecture, a config key, the head's tensors."""
    path = Path(path)
    cfg = read_config(path)
    drafter = DFlashDrafter.from_pretrained(path, dtype, device, architectures=(DSPARK_ARCHITECTURE,),
                                            skip_prefix=DSPARK_PREFIXES)
    for key, want, default in (("sample_from_anchor", False, True), ("enable_confidence_head", True, False),
                               ("confidence_head_with_markov", True, False),
                               ("markov_head_type", "vanilla", "vanilla")):
        got = cfg.get(key, default)  # absent: vLLM's default
        if got != want:
            raise ValueError(f"{path}: {key}: expected {json.dumps(want)} (DFlash's block, DSparkHead's heads), "
                             f"got {json.dumps(got)}")
    rank = cfg.get("markov_rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{path}: markov_rank: expected an integer >= 1, got {rank!r}")
    tensors = read_tensors(path, lambda k: k.startswith(DSPARK_PREFIXES))
    bias = tensors.pop(DSPARK_BIAS, None)
    if bias is not None and bool(bias.ne(0).any()):
        raise ValueError(f"{path}: tensor {DSPARK_BIAS}: expected zero (DSparkHead has no bias), got {bias.tolist()}")
    names = {v: k for k, v in DSPARK_NAMES.items()}
    c = drafter.config
    with torch.device("meta"):
        head = DSparkHead(c.hidden_size, c.vocab_size, rank)
    expected = {DSPARK_NAMES[k]: v.shape for k, v in head.state_dict().items()}
    check_state(tensors, expected, str(path), "DSpark head tensors do not match the config (markov_rank, "
                "vocab_size, hidden_size)")
    dtype = dtype or drafter.fc.weight.dtype
    head.load_state_dict({names[k]: v.to(device=device, dtype=dtype) for k, v in tensors.items()}, assign=True)
    return drafter, head


def read_dspark_head(path: str | Path) -> DSparkHead:
    """A trained DSparkHead from a safetensors file of its state_dict (markov_w1.weight, markov_w2.weight,
    confidence_proj.weight), or from a folder holding it as model.safetensors (what `dcoco demo`'s dspark stage
    writes). ValueError naming the path and what is missing or misshapen."""
    path = Path(path)
    if not ((path.is_file() and path.suffix == ".safetensors") or (path / "model.safetensors").is_file()):
        raise ValueError(f"head: expected a DSparkHead's .safetensors file or a folder with model.safetensors, got "
                         f"{path}{'' if path.exists() else ' (no such file or folder)'}")
    tensors = read_tensors(path)
    w1, conf = tensors.get("markov_w1.weight"), tensors.get("confidence_proj.weight")
    if w1 is None or conf is None or w1.dim() != 2 or conf.dim() != 2 or conf.shape[1] <= w1.shape[1]:
        raise ValueError(f"head: {path} holds no DSparkHead (expected markov_w1.weight (V,r), markov_w2.weight "
                         f"(V,r), confidence_proj.weight (1,d+r); got {_shapes(tensors)})")
    (V, r), d = w1.shape, conf.shape[1] - w1.shape[1]
    with torch.device("meta"):
        head = DSparkHead(d, V, r)
    check_state(tensors, {k: v.shape for k, v in head.state_dict().items()}, f"head: {path}",
                "not a DSparkHead's tensors")
    head.load_state_dict(tensors, assign=True)
    return head.eval()


def read_corrector(path: str | Path) -> Corrector:
    """A trained dcoco.Corrector from a safetensors file of its state_dict, or from a folder holding it as
    model.safetensors (what `dcoco demo`'s corrector and anchor stages write); its width and MLP size are read
    from its tensors, anchor_transition and num_candidates (K, default 16) from the file's metadata. ValueError
    naming the path and what is missing or misshapen."""
    from safetensors import safe_open

    path = Path(path)
    file = path if path.is_file() and path.suffix == ".safetensors" else path / "model.safetensors"
    if not file.is_file():
        raise ValueError(f"corrector: expected a dcoco.Corrector's .safetensors file or a folder with "
                         f"model.safetensors, got {path}{'' if path.exists() else ' (no such file or folder)'}")
    tensors = read_tensors(file)
    proj, mlp = tensors.get("cand_proj.weight"), tensors.get("mlp.0.weight")
    if proj is None or mlp is None or proj.dim() != 2 or mlp.dim() != 2:
        raise ValueError(f"corrector: {path} holds no dcoco.Corrector (expected cand_proj.weight (r,d) and "
                         f"mlp.0.weight (h,.); got {_shapes(tensors)})")
    with safe_open(str(file), "pt") as f:
        meta = f.metadata() or {}
    K = meta.get("num_candidates", "16")
    if not K.isdigit():
        raise ValueError(f"corrector: {file}'s metadata num_candidates is {K!r}; expected an integer")
    with torch.device("meta"):
        corrector = Corrector(proj.shape[1], int(K), width=proj.shape[0], mlp_hidden=mlp.shape[0],
                              anchor_transition=meta.get("anchor_transition") == "true")
    check_state(tensors, {k: v.shape for k, v in corrector.state_dict().items()}, f"corrector: {path}",
                "not a dcoco.Corrector's tensors")
    corrector.load_state_dict(tensors, assign=True)
    return corrector.eval()


def _shapes(tensors: dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{k} {tuple(v.shape)}" for k, v in sorted(tensors.items())[:8]) or "no tensors"


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
