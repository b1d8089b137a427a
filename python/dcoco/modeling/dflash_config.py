"""DFlashConfig: the drafter's sizes and taps, and the z-lab config.json it reads and writes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

ARCHITECTURE = "DFlashDraftModel"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps when a config gives none: the middle layer, or evenly spaced over 1..T-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclasses.dataclass
class DFlashConfig:
    """Qwen3 sizes plus DFlash's fields; to_dict/from_dict read and write the z-lab config.json."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int | None = None  # only checks target_layer_ids and goes to config.json
    block_size: int = 16
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6  # vLLM's default for DFlash drafts without one
    max_position_embeddings: int = 40960

    def __post_init__(self):
        if self.head_dim is None and isinstance(self.hidden_size, int) and isinstance(self.num_attention_heads, int):
            self.head_dim = self.hidden_size // max(self.num_attention_heads, 1)
        self.target_layer_ids = list(self.target_layer_ids)
        for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected an integer >= 1, got {v!r}")
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ValueError(f"block_size: expected an integer >= 2, got {self.block_size!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: RoPE needs an even size, got {self.head_dim}")
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id: expected an id in [0, {self.vocab_size}), got {self.mask_token_id!r}")
        top = self.num_target_layers if self.num_target_layers is not None else math.inf
        if not self.target_layer_ids or not all(isinstance(i, int) and 0 <= i < top for i in self.target_layer_ids):
            raise ValueError(f"target_layer_ids: expected a non-empty list of layer indices < {top}, "
                             f"got {self.target_layer_ids!r}")
        for f in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{f}: expected a finite number > 0, got {v!r}")

    def to_dict(self) -> dict:
        """config.json content: a qwen3 config plus block_size, num_target_layers and dflash_config."""
        d = {"architectures": [ARCHITECTURE], "model_type": "qwen3",
             **{f: getattr(self, f) for f in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads", "num_key_value_heads", "head_dim",
                                              "vocab_size", "rms_norm_eps", "rope_theta",
                                              "max_position_embeddings", "block_size")},
             # transformers 5 and vLLM read rope_parameters; older readers rope_theta
             "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
             "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
             "layer_types": ["full_attention"] * self.num_hidden_layers,
             "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}}
        if self.num_target_layers is not None:
            d["num_target_layers"] = self.num_target_layers
        return d

    @classmethod
    def from_dict(cls, d: dict, architectures: Collection[str] = (ARCHITECTURE,)) -> DFlashConfig:
        """Parse a DFlash config.json; ValueError on a different architecture or an unsupported variant.
        architectures: the accepted names (a checkpoint that extends the DFlash layout adds its own)."""
        arch = d.get("architectures")
        if not isinstance(arch, list) or not set(arch) & set(architectures):
            raise ValueError(f"architectures: expected one of {sorted(architectures)}, got {arch!r}")
        if d.get("model_type") != "qwen3":
            raise ValueError(f"model_type: expected 'qwen3', got {d.get('model_type')!r}")
        _check_supported(d)
        dc = d.get("dflash_config") or {}

        def pick(key: str):  # some checkpoints put DFlash fields at the top level, not under dflash_config
            return dc[key] if dc.get(key) is not None else d.get(key)

        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size") if d.get(k) is None]
        missing += [k for k in ("mask_token_id", "block_size") if pick(k) is None]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        layers, ntl = d["num_hidden_layers"], d.get("num_target_layers")
        ids = pick("target_layer_ids")
        if ids is None:
            if ntl is None:
                raise ValueError("missing dflash_config.target_layer_ids (and num_target_layers)")
            ids = build_target_layer_ids(ntl, layers)
        rope = d.get("rope_parameters") or {}
        return cls(hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"], num_hidden_layers=layers,
                   num_attention_heads=d["num_attention_heads"],
                   num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
                   vocab_size=d["vocab_size"], mask_token_id=pick("mask_token_id"), target_layer_ids=ids,
                   num_target_layers=ntl, block_size=pick("block_size"), head_dim=d.get("head_dim"),
                   rms_norm_eps=d.get("rms_norm_eps", 1e-6),
                   rope_theta=d.get("rope_theta") or rope.get("rope_theta") or 1e6,
                   max_position_embeddings=d.get("max_position_embeddings", 40960))


def _check_supported(d: dict) -> None:
    """Refuse config variants this drafter does not implement rather than load them into wrong math."""
    dc = d.get("dflash_config") or {}
    rope_type = (d.get("rope_parameters") or {}).get("rope_type", "default")
    problems = {
        "attention_bias": bool(d.get("attention_bias")),
        "hidden_act": d.get("hidden_act", "silu") != "silu",
        "rope_scaling": bool(d.get("rope_scaling")) or rope_type != "default",
        "layer_types": any(t != "full_attention" for t in d.get("layer_types") or []),
        "use_sliding_window": bool(d.get("use_sliding_window")) or bool(dc.get("use_swa")),
        "dflash_config.causal": bool(dc.get("causal")) or bool(d.get("is_causal")),
        "target_hidden_size": d.get("target_hidden_size") not in (None, d.get("hidden_size")),
        "attention_sink_bias": bool(dc.get("attention_sink_bias")) or bool(d.get("add_swa_attention_sink_bias")),
        "input_embedding_scale": d.get("input_embedding_scale", 1.0) != 1.0,
        "output_multiplier": d.get("output_multiplier", 1.0) != 1.0,
        "final_logit_softcapping": d.get("final_logit_softcapping") is not None,
    }
    bad = [k for k, v in problems.items() if v]
    if bad:
        raise ValueError(f"unsupported DFlash variant ({', '.join(bad)})")
