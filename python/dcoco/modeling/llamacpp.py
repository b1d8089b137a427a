"""The llama.cpp DFlash GGUF: a serving checkpoint's drafter as `llama-server -md ... --spec-type draft-dflash`
loads it, with its corrector beside it under `dcoco.` names.

The drafter's part is what llama.cpp's own converter (`convert_hf_to_gguf.py DRAFTER --target-model-dir TARGET`)
writes for a z-lab DFlash drafter: architecture `dflash`, its Qwen3 sizes under `dflash.*`, `dflash.block_size`,
`dflash.target_layers` (the target layer ids + 1: llama.cpp counts a layer's input, not its output), the tensors
under llama.cpp's names, 1-D tensors in float32, and the target's tokenizer (`tokenizer.*`, here copied from the
target's own GGUF, so llama.cpp finds the two vocabularies equal) with `tokenizer.ggml.mask_token_id`. A shortlisted
head (draft_vocab.py) goes in as `output.weight` (N, d) and `d2t`, the N target ids as int64: llama.cpp's reduced
draft vocabulary. Such a file, without a corrector, loads in llama.cpp as it is.

The corrector's part: its tensors as `dcoco.<Corrector state_dict name>`, in float32 whatever the file's dtype (it
scores in float32, and they are a few hundred thousand numbers), and its hyper-parameters as
`dcoco.num_candidates`, `dcoco.width`, `dcoco.mlp_hidden`, `dcoco.selection`, `dcoco.anchor_transition` and
`dcoco.layer_norm_epsilon`. llama.cpp loads those only with dcoco's scorer built in (integrations/llama.cpp)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from ..corrector import Corrector
from . import checkpoint
from .dflash import DFlashDrafter
from .domino import DominoHead
from .dspark import DSparkHead
from .weights import read_config

ARCH = "dflash"
PREFIX = "dcoco."
FILE_TYPES = {torch.float32: (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
              torch.float16: (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
              torch.bfloat16: (gguf.LlamaFileType.MOSTLY_BF16, gguf.GGMLQuantizationType.BF16)}
_NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64}
# the drafter's tensor names -> llama.cpp's (gguf-py's tensor_mapping for MODEL_ARCH.DFLASH)
_NAMES = {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight", "norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight", "d2t": "d2t"}
_LAYER_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
                "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
                "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
                "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                "mlp.down_proj.weight": "ffn_down.weight"}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def gguf_name(name: str) -> str:
    """llama.cpp's name for the drafter tensor `name` (its state_dict's, or the shortlisted head's)."""
    if name in _NAMES:
        return _NAMES[name]
    m = _LAYER.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"blk.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise ValueError(f"drafter: tensor {name!r} has no llama.cpp DFlash name")


def target_gguf(target: str | Path) -> Path:
    """The GGUF file whose tokenizer the drafter's GGUF carries: a .gguf file, or a folder holding exactly one."""
    path = Path(target)
    found = sorted(path.glob("*.gguf")) if path.is_dir() else [path]
    if len(found) != 1 or found[0].suffix != ".gguf" or not found[0].is_file():
        raise ValueError(f"target: expected the target's GGUF (the file llama-server -m serves, or a folder with "
                         f"one), got {target} ({len(found)} .gguf files there); convert a transformers target with "
                         f"llama.cpp's convert_hf_to_gguf.py first")
    return found[0]


Field = tuple[str, Any, gguf.GGUFValueType, gguf.GGUFValueType | None]  # key, value, type, element type


def _tokenizer(target: Path, vocab_size: int) -> list[Field]:
    """The target GGUF's tokenizer.* fields as (key, value, type, element type)."""
    fields = gguf.GGUFReader(target).fields
    if "tokenizer.ggml.model" not in fields or "tokenizer.ggml.tokens" not in fields:
        raise ValueError(f"target: {target} holds no tokenizer (no tokenizer.ggml.model / tokenizer.ggml.tokens)")
    n = len(fields["tokenizer.ggml.tokens"].data)
    if n != vocab_size:
        raise ValueError(f"target: {target}'s tokenizer has {n} tokens, the drafter's vocab_size is {vocab_size}")
    out: list[Field] = []
    for key, f in fields.items():
        if key.startswith("tokenizer."):
            vtype = gguf.GGUFValueType(f.types[0])
            sub = gguf.GGUFValueType(f.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
            out.append((key, f.contents(), vtype, sub))
    return out


def _array(t: torch.Tensor, dtype: torch.dtype) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    """t as the array the file stores: integers as int64, 1-D tensors in float32 (as llama.cpp's converter keeps
    norms), the rest in dtype (bfloat16 as its raw 16 bits)."""
    t = t.detach().cpu()
    if not t.is_floating_point():
        return t.to(torch.int64).numpy(), None
    dtype = torch.float32 if t.dim() == 1 else dtype
    if dtype == torch.bfloat16:
        return t.to(dtype).view(torch.int16).numpy(), gguf.GGMLQuantizationType.BF16
    return t.to(dtype).numpy().astype(_NUMPY[dtype], copy=False), None


def _metadata(w: gguf.GGUFWriter, drafter: DFlashDrafter, name: str, file_type: int) -> None:
    c = drafter.config
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in (("block_count", c.num_hidden_layers), ("context_length", c.max_position_embeddings),
                       ("embedding_length", c.hidden_size), ("feed_forward_length", c.intermediate_size),
                       ("attention.head_count", c.num_attention_heads),
                       ("attention.head_count_kv", c.num_key_value_heads), ("attention.key_length", c.head_dim),
                       ("attention.value_length", c.head_dim), ("block_size", c.block_size)):
        assert value is not None  # head_dim: DFlashConfig fills it
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_float32(f"{ARCH}.rope.freq_base", c.rope_theta)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_array(f"{ARCH}.target_layers", [i + 1 for i in c.target_layer_ids])


def _corrector_metadata(w: gguf.GGUFWriter, corrector: Corrector, selection: str) -> None:
    for key, value in (("num_candidates", corrector.num_candidates), ("width", corrector.width),
                       ("mlp_hidden", corrector.mlp_hidden)):
        w.add_uint32(PREFIX + key, value)
    w.add_string(PREFIX + "selection", selection)
    w.add_bool(PREFIX + "anchor_transition", corrector.anchor_transition)
    w.add_float32(PREFIX + "layer_norm_epsilon", corrector.fuse_norm.eps)


def tensors(drafter: DFlashDrafter, corrector: Corrector | None) -> dict[str, torch.Tensor]:
    """Every tensor the GGUF holds, under its GGUF name, as the checkpoint has it."""
    out = {gguf_name(k): v for k, v in drafter.state_dict().items()}
    if drafter.draft_head is not None:
        out["output.weight"] = drafter.draft_head.weight
        out["d2t"] = drafter.draft_head.ids
    if corrector is not None:
        out.update({PREFIX + k: v for k, v in corrector.state_dict().items()})
    return out


def export(src: str | Path, out: str | Path, target: str | Path, drafter_only: bool = False,
           dtype: str | None = None) -> Path:
    """Write the serving checkpoint src (a DFlash or DCOCO one, shortlisted head or not) as the GGUF file out, with
    the tokenizer of target's GGUF (target_gguf). drafter_only leaves the corrector out (the file loads in any
    llama.cpp). dtype ("bfloat16", "float16", "float32"): the 2-D tensors' type (default: as saved). The file
    appears whole or not at all; ValueError names the argument that does not fit."""
    out = Path(out)
    if out.suffix != ".gguf":
        raise ValueError(f"out: --format gguf writes one file; name it *.gguf, got {out}")
    if out.is_dir():
        raise ValueError(f"out: {out} is a folder; name the .gguf file to write")
    drafter, corrector = checkpoint.load(src)
    if isinstance(corrector, (DSparkHead, DominoHead)):
        raise ValueError(f"checkpoint: {src} holds a {type(corrector).__name__}; the GGUF export takes DFlash and "
                         f"DCOCO checkpoints")
    corrector = None if drafter_only else corrector
    cast = getattr(torch, dtype) if dtype else drafter.fc.weight.dtype
    if cast not in FILE_TYPES:
        raise ValueError(f"dtype: expected bfloat16, float16 or float32, got {dtype!r}")
    vocab = _tokenizer(target_gguf(target), drafter.config.vocab_size)
    selection = (read_config(src).get("dcoco_config") or {}).get("selection", "greedy")
    file_type, _ = FILE_TYPES[cast]
    tmp = out.with_name(f".{out.name}.tmp")
    w = gguf.GGUFWriter(tmp, arch=ARCH)
    try:
        _metadata(w, drafter, Path(src).resolve().name, file_type)
        for key, value, vtype, sub in vocab:
            w.add_key_value(key, value, vtype, sub_type=sub)
        w.add_mask_token_id(drafter.config.mask_token_id)
        if corrector is not None:
            _corrector_metadata(w, corrector, selection)
        for name, t in tensors(drafter, corrector).items():
            data, raw = _array(t, torch.float32 if name.startswith(PREFIX) else cast)
            w.add_tensor(name, data, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    finally:
        w.close()
        tmp.unlink(missing_ok=True)
    return out
