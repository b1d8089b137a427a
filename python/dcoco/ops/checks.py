"""Argument checks shared by both backends (the fused ops and the native PyTorch path): the same exception
types and messages, each naming the argument. Pure Python on shapes, dtypes and devices: no tensor values,
so they trace under torch.compile."""

from __future__ import annotations

import math

import torch

MAX_CANDIDATES = 64  # the compiled maximum K (dcoco/params.h kMaxCandidates; fused.py checks they agree)
RULES = {"greedy": 0, "global": 1, "geometric": 2}  # the core's Rule codes (fused.py checks they agree)
WEIGHTS = ("cand_proj", "ctx_proj", "fuse_proj", "fuse_norm_weight", "fuse_norm_bias", "pair_proj",
           "mlp0_weight", "mlp0_bias", "mlp2_weight", "mlp2_bias")
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
IDS = (torch.int32, torch.int64)
FUSED_DEVICES = ("cpu", "cuda", "meta")  # where the compiled core runs (meta: its fake implementations)


def require_tensors(**named) -> None:
    """Type check before the dispatcher, whose own message for a non-tensor dumps the whole value."""
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def float_tensor(name: str, t, ndim: int, float64: bool = False) -> None:
    """A tensor of the ops' floating dtypes (FLOATS; float64 only when allowed) with ndim dimensions."""
    require_tensors(**{name: t})
    if t.dtype not in FLOATS or (t.dtype == torch.float64 and not float64):
        more = ", bfloat16, float16 or float64 (CPU)" if float64 else ", bfloat16 or float16"
        raise TypeError(f"{name}: expected float32{more}, got {t.dtype}")
    dims(name, t, ndim)


KINDS = {"float": "a floating-point", "int": "an integer", "bool": "a bool"}


def tensor(name: str, t, ndim: int, kind: str) -> torch.Tensor:
    """t, checked to be a tensor of a kind of dtype (KINDS: any floating one, any integer one, bool) with ndim
    dimensions."""
    require_tensors(**{name: t})
    ok = {"float": t.is_floating_point(), "bool": t.dtype == torch.bool,
          "int": not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool}[kind]
    if not ok:
        raise TypeError(f"{name}: expected {KINDS[kind]} tensor, got {t.dtype}")
    dims(name, t, ndim)
    return t


def dims(name: str, t: torch.Tensor, ndim: int) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")


def shape(name: str, t: torch.Tensor, want: tuple, what: str) -> None:
    if tuple(t.shape) != tuple(want):
        raise ValueError(f"{name}: expected shape {tuple(want)} {what}, got {tuple(t.shape)}")


def last_dim(name: str, t: torch.Tensor, size: int, what: str) -> None:
    if t.shape[-1] != size:
        raise ValueError(f"{name}: expected last dimension {size} {what}, got {tuple(t.shape)}")


def same_device(named: dict, device_types: tuple[str, ...] | None = None) -> None:
    """All tensors on one device; device_types: the device types allowed (None: any)."""
    devices = {n: t.device for n, t in named.items() if t is not None}
    first_name, first = next(iter(devices.items()))
    for n, dev in devices.items():
        if dev != first:
            raise ValueError(f"{n}: expected device {first} like {first_name}, got {dev}")
    if device_types is not None and first.type not in device_types:
        raise ValueError(f"{first_name}: device {first} is not supported by the fused kernel "
                         f"({', '.join(device_types)}); the native backend runs there (dcoco.set_backend('native'))")


def precision(hidden, cand_logits, embed, weights) -> torch.dtype:
    """The training path computes in float64 when any float input is float64, else in float32."""
    wide = any(t.dtype == torch.float64 for t in (hidden, cand_logits, embed, *weights))
    return torch.float64 if wide else torch.float32


def check_inputs(hidden, cand_ids, cand_logits, embed, weights, table=None, float64=False,
                 device_types=None) -> tuple[int, ...]:
    """Validates the corrector's inputs; returns (R, B, K, d, V, r, H). Raises naming the argument.
    float64: also accept float64 tensors (the training path, for gradcheck)."""
    float_tensor("hidden", hidden, 3, float64)
    require_tensors(cand_ids=cand_ids)
    if cand_ids.dtype not in IDS:
        raise TypeError(f"cand_ids: expected int32 or int64 token ids, got {cand_ids.dtype}")
    if cand_ids.dim() != 3:
        raise ValueError(f"cand_ids: expected 3 dimensions (R, B, K), got shape {tuple(cand_ids.shape)}")
    float_tensor("cand_logits", cand_logits, 3, float64)
    float_tensor("embed", embed, 2, float64)
    R, B, d = hidden.shape
    K = cand_ids.shape[2]
    V = embed.shape[0]
    shape("cand_ids", cand_ids, (R, B, K), "= (R, B, K) matching hidden's (R, B)")
    shape("cand_logits", cand_logits, (R, B, K), "= cand_ids' (R, B, K)")
    shape("embed", embed, (V, d), "= (V, d) with d from hidden")
    if B < 1:
        raise ValueError("hidden: expected at least one drafted slot (B >= 1), got B=0")
    if not 1 <= K <= MAX_CANDIDATES:
        raise ValueError(f"cand_ids: expected 1 <= K <= {MAX_CANDIDATES} candidates per slot (the compiled "
                         f"maximum), got K={K}")
    if V < 1:
        raise ValueError("embed: expected at least one vocabulary row")
    if len(weights) != len(WEIGHTS):
        raise TypeError(f"weights: expected {len(WEIGHTS)} tensors {WEIGHTS}, got {len(weights)}")
    named = dict(zip(WEIGHTS, weights))
    for n, w in named.items():
        float_tensor(n, w, 1 if n in ("fuse_norm_weight", "fuse_norm_bias", "mlp0_bias", "mlp2_bias") else 2, float64)
    r = named["cand_proj"].shape[0]
    H = named["mlp0_weight"].shape[0]
    if r < 2:
        raise ValueError(f"cand_proj: expected width r >= 2, got {r}")
    want = {"cand_proj": (r, d), "ctx_proj": (r, d), "fuse_proj": (r, 2 * r), "fuse_norm_weight": (r,),
            "fuse_norm_bias": (r,), "pair_proj": (r, 2 * d), "mlp0_weight": (H, 3 * r + 2), "mlp0_bias": (H,),
            "mlp2_weight": (1, H), "mlp2_bias": (1,)}
    for n, s in want.items():
        shape(n, named[n], s, f"for d={d}, r={r}, mlp_hidden={H}")
    if table is not None:
        if not isinstance(table, torch.Tensor) or table.dtype != torch.float32:
            raise TypeError(f"table: expected a float32 tensor from prepare_inference, got "
                            f"{getattr(table, 'dtype', type(table).__name__)}")
        shape("table", table, (V, r), "= (V, r) from prepare_inference(embed)")
    same_device({"hidden": hidden, "cand_ids": cand_ids, "cand_logits": cand_logits, "embed": embed,
                 **named, "table": table}, device_types)
    if precision(hidden, cand_logits, embed, weights) == torch.float64 and hidden.device.type not in ("cpu", "meta"):
        raise TypeError(f"hidden: float64 runs on the CPU only (it exists for gradcheck); use float32, bfloat16 "
                        f"or float16 on {hidden.device.type}")
    return R, B, K, d, V, r, H


def check_table_args(embed, cand_proj, fuse_proj, device_types=None) -> tuple[int, int, int]:
    float_tensor("embed", embed, 2)
    float_tensor("cand_proj", cand_proj, 2)
    float_tensor("fuse_proj", fuse_proj, 2)
    V, d = embed.shape
    r = cand_proj.shape[0]
    shape("cand_proj", cand_proj, (r, d), "= (r, d) with d from embed")
    shape("fuse_proj", fuse_proj, (r, 2 * r), "= (r, 2r)")
    same_device({"embed": embed, "cand_proj": cand_proj, "fuse_proj": fuse_proj}, device_types)
    return V, d, r


WEIGHT_EXPONENT = 64  # the geometric rule's weights lam^p stay within [2^-64, 2^64]


def geometric_lam(lam: float, transitions: int) -> None:
    """The geometric rule weighs transition p by lam^p (p < transitions). Within [2^-WEIGHT_EXPONENT,
    2^WEIGHT_EXPONENT] those weights times any score a corrector gives stay normal float32 numbers; beyond, path
    values overflow to inf (or underflow) and tie, and the walk no longer finds the optimum. Within, it finds it
    up to float32 rounding of the path sums: a transition weighted under 2^-24 of the largest only breaks ties."""
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam: expected a finite lambda > 0 for the geometric rule, got {lam}")
    top = transitions - 1
    if top > 0 and abs(top * math.log2(lam)) > WEIGHT_EXPONENT:
        lo, hi = 2 ** (-WEIGHT_EXPONENT / top), 2 ** (WEIGHT_EXPONENT / top)
        raise ValueError(f"lam: {lam:g}^{top} (the last of {transitions} transitions' weight) is beyond "
                         f"[2^-{WEIGHT_EXPONENT}, 2^{WEIGHT_EXPONENT}], where float32 path sums lose the scores; "
                         f"expected lam in [{lo:.4g}, {hi:.4g}] for B = {transitions + 1}")


def check_select(scores, first_logits, rule, lam, device_types=None) -> tuple[int, int, int]:
    float_tensor("scores", scores, 4)
    float_tensor("first_logits", first_logits, 2)
    R, T, K, K2 = scores.shape
    if K != K2:
        raise ValueError(f"scores: expected shape (R, B-1, K, K), got {tuple(scores.shape)}")
    shape("first_logits", first_logits, (R, K), "= (R, K) matching scores")
    if not 1 <= K <= MAX_CANDIDATES:
        raise ValueError(f"scores: expected 1 <= K <= {MAX_CANDIDATES}, got K={K}")
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {sorted(RULES)}, got {rule!r}")
    if rule == "geometric":
        geometric_lam(lam, T)
    same_device({"scores": scores, "first_logits": first_logits}, device_types)
    return R, T + 1, K
