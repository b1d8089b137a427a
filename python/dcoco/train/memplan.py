"""Per-rank GPU memory of a `dcoco train` run, estimated from the configs alone (no weights are loaded).

What it counts, as recipe.run, target.features.TargetFeatures, training.train and the modules they call do it: the
target kept on the device for online feature capture (bf16 on CUDA, float32 on a CPU; its decoder FSDP2-sharded per
layer when asked) and its no_grad forward; the embedding and LM head that train() gets and its float32 copies;
the drafter's and corrector's float32 weights, gradients, AdamW moments (DDP's buckets are the gradients); autocast's
cached bf16 weight copies; the tensors one micro-batch keeps for backward (drafter layers, or their inputs under
grad_checkpoint; the chunked LM head; the corrector and L_corr), tensor by tensor, under CUDA bf16 autocast or
in float32 on a CPU; the largest transient on top of them; an assumed CUDA context and allocator slack.

What it does not: fragmentation beyond that slack line, NCCL's buffers, the optimizer step's temporaries (they
come after backward has freed the activations), the held-out evaluation (no_grad, smaller), and SDPA kernels
that materialise the attention weights: on CUDA the bool block mask with GQA (enable_gqa) is assumed to reach a
fused kernel (cuDNN, or memory-efficient attention where it supports GQA) as a bf16 bias; torch's math fallback
would add (N,heads,A*bs,S+A*bs) per layer. The total is an upper bound in two ways: the capture transient never
coexists with the drafter's activations, and with grad_accum 1 no gradient exists yet when backward starts.
The activation rows equal what one forward keeps for backward on a CPU, in float32 and under bf16 autocast
(tests/train/test_memplan.py measures both); not measured: CUDA's SDPA kernel (assumed to save what the CPU's does), the
native corrector's chunks and the transients (the largest: an LM-head chunk's logits).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch

from ..corrector import Corrector
from ..modeling.dflash import DFlashConfig, DFlashDrafter
from ..logit_chunks import chunk_rows
from ..ops.native import CHUNK_BYTES as NATIVE_CHUNK_BYTES
from .config import TrainConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig

GIB = 2 ** 30
F32 = 4
CUDA_SLACK = int(1.5 * GIB)  # CUDA context, cuBLAS workspaces, allocator rounding: an assumption, not measured
TARGET_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # dense decoders whose parameters _target_params counts
# the rows that tests/train/test_memplan.py compares with what autograd saves in one Objective.forward
ACTIVATION_ROWS = ("context features (batch)", "drafter activations", "LM head: saved for backward",
                   "corrector + L_corr: saved")


@dataclasses.dataclass
class Plan:
    rows: list[tuple[str, int, str]]  # (component, bytes, how it was computed)
    device_bytes: int | None          # the device's memory, when known

    @property
    def total(self) -> int:
        return sum(b for _, b, _ in self.rows)

    def fits(self, headroom: float = 0.9) -> bool | None:
        """Whether the total fits in headroom x the device's memory; None when that memory is unknown."""
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 < headroom <= 1:
            raise ValueError(f"headroom: expected a fraction in (0, 1], got {headroom!r}")
        return None if self.device_bytes is None else self.total <= headroom * self.device_bytes

    def format(self, headroom: float = 0.9) -> str:
        """An aligned table in GiB, a total line and whether it fits."""
        w = max(len(n) for n, _, _ in self.rows + [("total", 0, "")])
        lines = [f"{'component':<{w}}  {'GiB':>7}  how"]
        lines += [f"{n:<{w}}  {b / GIB:7.2f}  {how}" for n, b, how in self.rows]
        lines.append(f"{'total':<{w}}  {self.total / GIB:7.2f}  per rank")
        fits = self.fits(headroom)
        if fits is not None and self.device_bytes is not None:  # (fits is None exactly when device_bytes is)
            lines.append(f"{'fits' if fits else 'does not fit'} in {self.device_bytes / GIB:.1f} GiB "
                         f"({headroom:.0%} headroom: {headroom * self.device_bytes / GIB:.1f} GiB)")
        return "\n".join(lines)

    def to_dict(self, headroom: float = 0.9) -> dict:
        return {"rows": [{"component": n, "bytes": b, "gib": round(b / GIB, 3), "how": how} for n, b, how in self.rows],
                "total_bytes": self.total, "device_bytes": self.device_bytes, "headroom": headroom,
                "fits": self.fits(headroom)}


def _target_params(c) -> tuple[int, int, int]:
    """(embedding, one decoder layer, final norm) parameter counts of a dense decoder, LM head excluded."""
    d, V, H, ffn = c.hidden_size, c.vocab_size, c.num_attention_heads, c.intermediate_size
    kv = getattr(c, "num_key_value_heads", None) or H
    hd = getattr(c, "head_dim", None) or d // H
    q, k = H * hd, kv * hd
    attn = d * q + 2 * d * k + q * d
    if c.model_type == "qwen2":               # q/k/v biases, none on o_proj
        attn += q + 2 * k
    elif getattr(c, "attention_bias", False):  # llama/mistral/qwen3: biases on q/k/v/o
        attn += q + 2 * k + d
    if c.model_type == "qwen3":               # per-head RMSNorms on queries and keys
        attn += 2 * hd
    mlp = 3 * d * ffn + (2 * ffn + d if getattr(c, "mlp_bias", False) else 0)
    return V * d, attn + mlp + 2 * d, d


def _check(target, drafter, cfg, world, seq_len, shard_target, online, cuda, device_bytes) -> None:
    from transformers import PretrainedConfig

    if not isinstance(target, PretrainedConfig):
        raise ValueError(f"target: expected a transformers PretrainedConfig, got {type(target).__name__}")
    if target.model_type not in TARGET_TYPES:
        raise ValueError(f"target: model_type {target.model_type!r} is not one of {TARGET_TYPES}")
    if not isinstance(drafter, DFlashConfig):
        raise ValueError(f"drafter: expected a dcoco.modeling.dflash.DFlashConfig, got {type(drafter).__name__}")
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"cfg: expected a dcoco.train.training.TrainConfig, got {type(cfg).__name__}")
    for name, v, lo in (("world", world, 1), ("seq_len", seq_len, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    for name, v in (("shard_target", shard_target), ("online", online), ("cuda", cuda)):
        if not isinstance(v, bool):
            raise ValueError(f"{name}: expected a bool, got {v!r}")
    if device_bytes is not None and (isinstance(device_bytes, bool) or not isinstance(device_bytes, int)
                                     or device_bytes < 1):
        raise ValueError(f"device_bytes: expected an integer >= 1 or None, got {device_bytes!r}")
    if (drafter.hidden_size, drafter.vocab_size) != (target.hidden_size, target.vocab_size):
        raise ValueError(f"drafter: hidden_size/vocab_size {drafter.hidden_size}/{drafter.vocab_size} differ from "
                         f"the target's {target.hidden_size}/{target.vocab_size}")
    if max(drafter.target_layer_ids) >= target.num_hidden_layers:
        raise ValueError(f"drafter: target_layer_ids {drafter.target_layer_ids} exceed the target's "
                         f"{target.num_hidden_layers} layers")


def _layer_saved(c: DFlashConfig, T: int, L: int, span: int, a: int) -> int:
    """Bytes one drafter layer (dflash_layers.Layer) saves for backward. T block tokens, L = T + context tokens (the
    keys [ctx ; x]), span keys per block token (S + A*bs), a bytes per matmul output (2 under CUDA autocast,
    4 in float32). The residual stream and RMSNorm statistics are float32 either way; an fp32 input to a matmul
    is saved as is on a CPU and as autocast's bf16 copy (one per matmul) on CUDA, hence the 4d terms:
        per block token: (20 + a)d + (4 + 3a)Hq + 8H + 8 + a*span + 4a*ffn
        per key token:   4d + (4 + 3a)Hk + 4KV             (Hq = heads x head_dim, Hk = kv_heads x head_dim)"""
    d, ffn, H, KV, hd = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    assert hd is not None  # DFlashConfig.__post_init__ fills it in
    Hq, Hk = H * hd, KV * hd
    per_block = (2 * F32 * d + F32          # input_layernorm: its input x and x * rsqrt, rsqrt
                 + a * d                    # q_proj's input (the norm's output, or its bf16 copy)
                 + (F32 + a) * Hq + F32 * H  # q_norm: float32 input, normalised (in the input's dtype), rsqrt
                 + 2 * a * Hq + F32 * H     # SDPA: query after RoPE, output (= o_proj's input), logsumexp
                 + a * span                 # the bool block mask as an additive bias, converted by every call
                 + 2 * F32 * d + F32        # post_attention_layernorm
                 + 4 * d                    # MLP input: float32 once (CPU), or bf16 for gate and up (autocast)
                 + 4 * a * ffn)             # gate, silu(gate), up, silu(gate) * up (down_proj's input)
    per_key = (4 * d                        # kv_in = [ctx ; x]: float32 once, or bf16 for k_proj and v_proj
               + (F32 + a) * Hk + F32 * KV  # k_norm
               + 2 * a * Hk)                # SDPA: k after RoPE, v (enable_gqa: kv heads only, no copies)
    return T * per_block + L * per_key


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@dataclasses.dataclass(frozen=True)
class RunShape:
    """The sizes the plan's rows are computed from: one micro-batch of N sequences of S tokens with A anchors each,
    T block tokens, C context tokens, L key tokens, span keys per block token, R blocks, Rh LM-head rows; a bytes
    per matmul output and tb per target weight or activation; which modules get gradients."""
    target: PretrainedConfig  # estimate's _check made sure
    c: DFlashConfig
    cfg: TrainConfig
    world: int
    online: bool
    shard_target: bool
    cuda: bool
    N: int
    S: int
    A: int

    @classmethod
    def of(cls, target, drafter: DFlashConfig, cfg: TrainConfig, world: int, seq_len: int, shard_target: bool,
           online: bool, cuda: bool) -> RunShape:
        A = min(cfg.anchors or (512 if cuda else 32), seq_len - 1)
        return cls(target, drafter, cfg, world, online, shard_target, cuda, cfg.seqs_per_step, seq_len, A)

    d = property(lambda s: s.c.hidden_size)
    V = property(lambda s: s.c.vocab_size)
    Vd = property(lambda s: s.V * s.d)
    bs = property(lambda s: s.c.block_size)
    K = property(lambda s: s.cfg.num_candidates)
    hd = property(lambda s: s.c.head_dim)
    taps = property(lambda s: len(s.c.target_layer_ids))
    T = property(lambda s: s.N * s.A * s.bs)           # block tokens
    C = property(lambda s: s.N * s.S)                  # context tokens
    L = property(lambda s: s.T + s.C)                  # key tokens
    span = property(lambda s: s.S + s.A * s.bs)        # keys per block token
    R = property(lambda s: s.N * s.A)                  # blocks
    Rh = property(lambda s: s.N * s.A * (s.bs - 1))    # LM-head rows (slots 1..bs-1)
    a = property(lambda s: 2 if s.cuda else F32)       # matmul outputs: bf16 under autocast
    tb = property(lambda s: 2 if s.cuda else F32)      # the target's weights and activations
    dflash_grad = property(lambda s: s.cfg.mode != "corrector")
    corr_grad = property(lambda s: s.cfg.mode != "drafter")
    tied = property(lambda s: bool(getattr(s.target, "tie_word_embeddings", False)))
    per_layer = property(lambda s: _layer_saved(s.c, s.T, s.L, s.span, s.a))


def estimate(target, drafter: DFlashConfig, cfg: TrainConfig, world: int = 1, seq_len: int = 2048,
             shard_target: bool = False, online: bool = True, cuda: bool = True,
             device_bytes: int | None = None) -> Plan:
    """Per-rank memory of `dcoco train` with target (a transformers config), drafter (its DFlashConfig) and cfg,
    on world ranks, with seqs_per_step sequences of seq_len tokens per micro-batch (all padded to seq_len) and
    cfg.anchors anchors each (512 on CUDA, 32 on a CPU when None; at most seq_len - 1). online: the target
    stays on the device to capture features (target.features.TargetFeatures; else they come from the corpus, float16);
    shard_target: its decoder FSDP2-sharded over the ranks. cuda: bf16 autocast and a bf16 target (else float32
    throughout)."""
    _check(target, drafter, cfg, world, seq_len, shard_target, online, cuda, device_bytes)
    s = RunShape.of(target, drafter, cfg, world, seq_len, shard_target, online, cuda)
    rows = (_target_rows(s) + [_embedding_row(s)] + _weight_rows(s) + _activation_rows(s)
            + [_head_row(s), _corrector_row(s), _transient_row(s)]
            # 8. what no formula gives
            + [("CUDA context + allocator slack", CUDA_SLACK if cuda else 0, "assumed" if cuda else "CPU: none")])
    return Plan(rows, device_bytes)


def _target_rows(s: RunShape) -> list[tuple[str, int, str]]:
    # 1-2. the target for online capture: recipe.run moves the whole causal LM to the device (the LM head makes
    # the labels), or TargetFeatures shards its decoder (FSDP2: the root, embedding and final norm, stays gathered
    # after a no_grad forward; the next layer's all-gather overlaps the current one) and copies the LM head
    target, world, d, V, tb, Vd, C = s.target, s.world, s.d, s.V, s.tb, s.Vd, s.C
    emb, layer, final = _target_params(target)
    P = emb + target.num_hidden_layers * layer + final
    if not s.online:
        return [("target weights (online capture)", 0, "offline: features from the corpus"),
                ("target forward (no_grad capture)", 0, "offline")]
    if s.shard_target and world > 1:
        n = math.ceil(P / world) + emb + final + 2 * layer + Vd
        how = f"{P / 1e9:.3g}e9 params / {world} ranks + gathered root (embedding) and 2 layers + LM head"
    else:  # a tied head is the embedding, unless TargetFeatures copied it before moving the decoder
        n = P + (0 if s.tied and not s.shard_target else Vd)
        how = f"{n / 1e9:.3g}e9 params (decoder + LM head)"
    rows = [("target weights (online capture)", n * tb, f"{how}, x {tb} B")]
    H = target.num_attention_heads
    kv, thd = getattr(target, "num_key_value_heads", None) or H, getattr(target, "head_dim", None) or d // H
    widest = max(3 * target.intermediate_size, 2 * H * thd + 2 * kv * thd)  # MLP gate/up/product, or q/k/v/out
    logits = min(chunk_rows(V), s.N * (s.S - 1)) * V * tb  # the label argmax: a chunk of logits, the head's dtype
    hooked = C * s.taps * d * tb       # the taps' outputs, until concatenated into the batch's features
    n = hooked + max(C * (2 * d + widest) * tb, 2 * C * d * tb + logits)
    rows.append(("target forward (no_grad capture)", n,
                 (f"{s.taps} hooked taps + max(a layer: residual, normed, widest op {widest}; the final hidden, "
                  f"its shifted copy, a {logits / 2 ** 20:.0f} MiB logits chunk) over {C} tokens")))
    return rows


def _embedding_row(s: RunShape) -> tuple[str, int, str]:
    # 3. the embedding and LM head train() gets: it keeps a float32 copy of the embedding (on a CPU float() of a
    # float32 weight is the weight itself) and the head in bf16 on CUDA (the bf16 target's own, shared), float32
    # elsewhere. Online, recipe.run passes the target's weights, or host clones taken before sharding (train()
    # then copies the head to the device); from a cache it passes the target's weights and keeps them referenced
    Vd, cuda, tb = s.Vd, s.cuda, s.tb
    if s.online and not s.shard_target:
        n, how = (4 * Vd, "train(): float32 embedding copy; the head is the target's") if cuda else \
            (0, "train(): the target's float32 weights, aliased")
    elif s.online:
        n, how = (6 * Vd, "train(): float32 embedding + bf16 head copies of run()'s host clones") if cuda else \
            (8 * Vd, "run(): 2 float32 clones, aliased by train()")
    else:
        held = 1 if s.tied else 2
        n = held * Vd * tb + 4 * Vd * cuda
        how = f"run(): the target's {held} weight(s) x {tb} B" + (" + train(): float32 embedding copy" if cuda else "")
    return ("embedding + LM head (train)", n, f"{how}; ({s.V},{s.d}) each")


def _weight_rows(s: RunShape) -> list[tuple[str, int, str]]:
    # 4. weights, gradients, AdamW moments (float32); DDP's buckets are the gradients (gradient_as_bucket_view)
    mode, cfg = s.cfg.mode, s.cfg
    with torch.device("meta"):
        dm = DFlashDrafter(s.c)
        cm = Corrector(s.d, s.K, cfg.width, cfg.mlp_hidden) if mode != "drafter" else None
    Pd, Pc = _count(dm), _count(cm) if cm is not None else 0
    rows = []
    for name, n, grad in (("drafter", Pd, s.dflash_grad), ("corrector", Pc, s.corr_grad)):
        rows.append((f"{name} weights", n * F32, f"{n / 1e6:.4g}e6 params x 4 B"))
        rows.append((f"{name} gradients", n * F32 * grad, f"{n / 1e6:.4g}e6 x 4 B" if grad else f"frozen ({mode})"))
        rows.append((f"{name} AdamW moments", 2 * n * F32 * grad,
                     f"exp_avg + exp_avg_sq, 2 x {n / 1e6:.4g}e6 x 4 B" if grad else f"frozen ({mode})"))
    rows.append(("DDP gradient buckets", 0, "gradient_as_bucket_view: the gradients themselves" if s.world > 1
                 else "single rank: no DDP"))
    # autocast casts each trainable Linear weight once per forward and caches the copy until the forward ends; the
    # layers' matmuls save theirs for backward (unless checkpointed), fc's does not (the features need no gradient)
    cached = sum(m.weight.numel() for m in dm.layers.modules() if isinstance(m, torch.nn.Linear))
    cached *= s.cuda and s.dflash_grad
    how = "until the forward ends (grad_checkpoint)" if cfg.grad_checkpoint else "saved for backward"
    rows.append(("autocast bf16 weight copies", 2 * cached,
                 f"drafter layers' Linear weights x 2 B, {how}" if cached else "none (no autocast or no gradient)"))
    return rows


def _activation_rows(s: RunShape) -> list[tuple[str, int, str]]:
    # 5. context features: the batch (online: the target's dtype; else float16 from the corpus) and fc's input
    # (autocast's bf16 copy of its float32 upcast; on a CPU the float32 features themselves), saved when the
    # drafter trains, a transient of the no_grad forward otherwise
    N, S, C, T, L, d, a, hd, taps = s.N, s.S, s.C, s.T, s.L, s.d, s.a, s.hd, s.taps
    fb = s.tb if s.online else 2
    fc_in = 2 if s.cuda else (0 if fb == F32 else F32)
    fc_saved = fc_in * s.dflash_grad
    rows = [("context features (batch)", C * taps * d * (fb + fc_saved),
             f"{N} x {S} x {taps}*{d} x ({fb} B batch + {fc_saved} B fc input)")]
    once = C * (F32 * d + F32 + a * d)       # hidden_norm on fc's output: its float32 input, rsqrt, normalised
    once += 2 * F32 * L * hd + T * (2 * F32 * d + F32)  # RoPE cos/sin (float32), the final norm
    layers, per_layer = s.c.num_hidden_layers, s.per_layer
    inputs = C * d * F32 + T * s.span + T * d * F32 * layers  # ctx, the bool mask, every layer's input x
    if not s.dflash_grad:  # no_grad: the inputs and one layer's tensors at a time (or fc's input copy, if larger)
        live = inputs - T * d * F32 * (layers - 1) + 2 * F32 * L * hd + max(per_layer, C * taps * d * fc_in)
        rows.append(("drafter activations", live, "frozen drafter, no_grad: ctx, x, mask, RoPE + one layer"))
    elif s.cfg.grad_checkpoint:  # every layer checkpointed: its inputs kept, backward recomputes one at a time
        rows.append(("drafter activations", once + inputs,
                     f"grad_checkpoint: ctx, mask, {layers} layer inputs + norms, RoPE"))
    else:  # the first layer's input (the frozen embedding's output) needs no gradient: its norm keeps less
        rows.append(("drafter activations", once + layers * per_layer - T * (F32 * d + F32),
                     (f"{layers} layers x {per_layer / 2 ** 20:.0f} MiB ({T} block + {L} key tokens, "
                      f"_layer_saved) + norms, RoPE")))
    return rows


def _head_row(s: RunShape) -> tuple[str, int, str]:
    # 6. the LM head in row chunks (head.topk_ce): chunked with gradients, backward recomputes each chunk from
    # checkpointed inputs (a contiguous (Rh,d) copy of slots 1.., labels); one chunk keeps its log-softmax, top-k
    # ids (under autocast the head is train()'s bf16 one, saved as it is: no copy)
    Rh, V, K = s.Rh, s.V, s.K
    head = 0
    if s.dflash_grad:
        head = Rh * 8 + Rh * F32  # labels, decayed_mean's weights
        how = "labels, loss weights"
        if Rh <= chunk_rows(V, s.cfg.logit_chunk):  # one chunk
            head += Rh * V * F32 + Rh * K * 8
            how += f", one chunk: ({Rh},{V}) log-softmax, top-{K} ids"
        else:
            head += Rh * s.d * F32
            how += f", ({Rh},{s.d}) float32 slot states"
    else:
        how = f"no gradient through the frozen drafter ({s.cfg.mode})"
    return ("LM head: saved for backward", head, how)


def _corrector_row(s: RunShape) -> tuple[str, int, str]:
    # 7. corrector scores (R,bs-2,K,K): its op keeps the slot states (a view of the final norm's (N,A,bs,d)
    # output) and the candidates (ids, logits); L_corr its log-softmax, gather index, mask and weights
    R, bs, K = s.R, s.bs, s.K
    corr, how = 0, "no corrector gradient"
    if s.corr_grad:
        corr = R * (bs - 2) * (K * K * F32 + 8 + 1 + F32) + s.Rh * K * (8 + s.a) + s.T * s.d * F32
        how = f"({R},{bs - 2},{K},{K}) log-softmax, top-{K} ids/logits, ({s.N},{s.A},{bs},{s.d}) float32 states"
    return ("corrector + L_corr: saved", corr, how)


def _transient_row(s: RunShape) -> tuple[str, int, str]:
    # the largest transient on top: an LM-head chunk (the logits, their float32 copy and log-softmax; in backward
    # the log-softmax, its gradient and nll's), a drafter layer's backward (MLP: 3 (T,I) gradients; attention:
    # q/k/v gradients; recomputed first under grad_checkpoint), the native corrector's chunk
    V, a, T, L, dflash_grad = s.V, s.a, s.T, s.L, s.dflash_grad
    rows_c = min(chunk_rows(V, s.cfg.logit_chunk), s.Rh)
    head_t = rows_c * V * (a + F32 + F32 * s.cuda)
    if dflash_grad:
        head_t = max(head_t, 12 * rows_c * V)
    layer_t = max(3 * T * s.c.intermediate_size * a, (T + 2 * L) * s.c.num_attention_heads * s.hd * 2 * a) * dflash_grad
    layer_t += s.per_layer * (dflash_grad and s.cfg.grad_checkpoint)
    corr_t = 4 * NATIVE_CHUNK_BYTES * (s.cuda and s.corr_grad)
    peak, which = max((head_t, f"an LM-head chunk of {rows_c} rows"), (layer_t, "a drafter layer's backward"),
                      (corr_t, "a native corrector chunk"))
    return ("largest transient", peak, which)
