"""Per-rank GPU memory of a `dcoco train` run, estimated from the configs alone (no weights are loaded).

What it counts, as recipe.run, online.TargetFeatures, training.train and the modules they call do it: the target
kept on the device for online feature capture (bf16 on CUDA, float32 on a CPU; its decoder FSDP2-sharded per
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

import torch

from ..corrector import Corrector
from ..modeling.dflash import DFlashConfig, DFlashDrafter
from ..modeling.head import chunk_rows
from ..ops.native import CHUNK_BYTES as NATIVE_CHUNK_BYTES
from .config import TrainConfig

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
        if fits is not None:
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


def estimate(target, drafter: DFlashConfig, cfg: TrainConfig, world: int = 1, seq_len: int = 2048,
             shard_target: bool = False, online: bool = True, cuda: bool = True,
             device_bytes: int | None = None) -> Plan:
    """Per-rank memory of `dcoco train` with target (a transformers config), drafter (its DFlashConfig) and cfg,
    on world ranks, with seqs_per_step sequences of seq_len tokens per micro-batch (all padded to seq_len) and
    cfg.anchors anchors each (512 on CUDA, 32 on a CPU when None; at most seq_len - 1). online: the target
    stays on the device to capture features (online.TargetFeatures; else they come from the corpus, float16);
    shard_target: its decoder FSDP2-sharded over the ranks. cuda: bf16 autocast and a bf16 target (else float32
    throughout)."""
    _check(target, drafter, cfg, world, seq_len, shard_target, online, cuda, device_bytes)
    rows: list[tuple[str, int, str]] = []
    mode, c = cfg.mode, drafter
    d, V, bs, K, hd = c.hidden_size, c.vocab_size, c.block_size, cfg.num_candidates, c.head_dim
    N, S = cfg.seqs_per_step, seq_len
    A = min(cfg.anchors or (512 if cuda else 32), S - 1)
    T, C = N * A * bs, N * S                 # block tokens, context tokens
    L, span = T + C, S + A * bs              # key tokens; keys per block token
    R, Rh = N * A, N * A * (bs - 1)          # blocks; LM-head rows (slots 1..bs-1)
    a = 2 if cuda else F32                   # matmul outputs: bf16 under autocast
    tb = 2 if cuda else F32                  # the target's weights and activations
    taps = len(c.target_layer_ids)
    dflash_grad, corr_grad = mode != "corrector", mode != "drafter"
    sharded = online and shard_target and world > 1
    tied = bool(getattr(target, "tie_word_embeddings", False))
    Vd = V * d

    # 1-2. the target for online capture: recipe.run moves the whole causal LM to the device (the LM head makes
    # the labels), or TargetFeatures shards its decoder (FSDP2: the root, embedding and final norm, stays gathered
    # after a no_grad forward; the next layer's all-gather overlaps the current one) and copies the LM head
    emb, layer, final = _target_params(target)
    P = emb + target.num_hidden_layers * layer + final
    if not online:
        rows += [("target weights (online capture)", 0, "offline: features from the corpus"),
                 ("target forward (no_grad capture)", 0, "offline")]
    else:
        if sharded:
            n = math.ceil(P / world) + emb + final + 2 * layer + Vd
            how = f"{P / 1e9:.3g}e9 params / {world} ranks + gathered root (embedding) and 2 layers + LM head"
        else:  # a tied head is the embedding, unless TargetFeatures copied it before moving the decoder
            n = P + (0 if tied and not shard_target else Vd)
            how = f"{n / 1e9:.3g}e9 params (decoder + LM head)"
        rows.append(("target weights (online capture)", n * tb, f"{how}, x {tb} B"))
        H = target.num_attention_heads
        kv, thd = getattr(target, "num_key_value_heads", None) or H, getattr(target, "head_dim", None) or d // H
        widest = max(3 * target.intermediate_size, 2 * H * thd + 2 * kv * thd)  # MLP gate/up/product, or q/k/v/out
        logits = min(chunk_rows(V), N * (S - 1)) * V * tb  # the label argmax: a chunk of logits, the head's dtype
        hooked = C * taps * d * tb       # the taps' outputs, until concatenated into the batch's features
        n = hooked + max(C * (2 * d + widest) * tb, 2 * C * d * tb + logits)
        rows.append(("target forward (no_grad capture)", n,
                     (f"{taps} hooked taps + max(a layer: residual, normed, widest op {widest}; the final hidden, "
                      f"its shifted copy, a {logits / 2 ** 20:.0f} MiB logits chunk) over {C} tokens")))
    # 3. the embedding and LM head train() gets: it keeps a float32 copy of the embedding (on a CPU float() of a
    # float32 weight is the weight itself) and the head in bf16 on CUDA (the bf16 target's own, shared), float32
    # elsewhere. Online, recipe.run passes the target's weights, or host clones taken before sharding (train()
    # then copies the head to the device); from a cache it passes the target's weights and keeps them referenced
    if online and not shard_target:
        n, how = (4 * Vd, "train(): float32 embedding copy; the head is the target's") if cuda else \
            (0, "train(): the target's float32 weights, aliased")
    elif online:
        n, how = (6 * Vd, "train(): float32 embedding + bf16 head copies of run()'s host clones") if cuda else \
            (8 * Vd, "run(): 2 float32 clones, aliased by train()")
    else:
        held = 1 if tied else 2
        n = held * Vd * tb + 4 * Vd * cuda
        how = f"run(): the target's {held} weight(s) x {tb} B" + (" + train(): float32 embedding copy" if cuda else "")
    rows.append(("embedding + LM head (train)", n, f"{how}; ({V},{d}) each"))

    # 4. weights, gradients, AdamW moments (float32); DDP's buckets are the gradients (gradient_as_bucket_view)
    with torch.device("meta"):
        dm = DFlashDrafter(c)
        cm = Corrector(d, K, cfg.width, cfg.mlp_hidden) if mode != "drafter" else None
    Pd, Pc = _count(dm), _count(cm) if cm is not None else 0
    for name, n, grad in (("drafter", Pd, dflash_grad), ("corrector", Pc, corr_grad)):
        rows.append((f"{name} weights", n * F32, f"{n / 1e6:.4g}e6 params x 4 B"))
        rows.append((f"{name} gradients", n * F32 * grad, f"{n / 1e6:.4g}e6 x 4 B" if grad else f"frozen ({mode})"))
        rows.append((f"{name} AdamW moments", 2 * n * F32 * grad,
                     f"exp_avg + exp_avg_sq, 2 x {n / 1e6:.4g}e6 x 4 B" if grad else f"frozen ({mode})"))
    rows.append(("DDP gradient buckets", 0, "gradient_as_bucket_view: the gradients themselves" if world > 1
                 else "single rank: no DDP"))
    # autocast casts each trainable Linear weight once per forward and caches the copy until the forward ends; the
    # layers' matmuls save theirs for backward (unless checkpointed), fc's does not (the features need no gradient)
    cached = sum(m.weight.numel() for m in dm.layers.modules() if isinstance(m, torch.nn.Linear))
    cached *= cuda and dflash_grad
    how = "until the forward ends (grad_checkpoint)" if cfg.grad_checkpoint else "saved for backward"
    rows.append(("autocast bf16 weight copies", 2 * cached,
                 f"drafter layers' Linear weights x 2 B, {how}" if cached else "none (no autocast or no gradient)"))

    # 5. context features: the batch (online: the target's dtype; else float16 from the corpus) and fc's input
    # (autocast's bf16 copy of its float32 upcast; on a CPU the float32 features themselves), saved when the
    # drafter trains, a transient of the no_grad forward otherwise
    fb = tb if online else 2
    fc_in = 2 if cuda else (0 if fb == F32 else F32)
    fc_saved = fc_in * dflash_grad
    rows.append(("context features (batch)", C * taps * d * (fb + fc_saved),
                 f"{N} x {S} x {taps}*{d} x ({fb} B batch + {fc_saved} B fc input)"))
    once = C * (F32 * d + F32 + a * d)       # hidden_norm on fc's output: its float32 input, rsqrt, normalised
    once += 2 * F32 * L * hd + T * (2 * F32 * d + F32)  # RoPE cos/sin (float32), the final norm
    layers, per_layer = c.num_hidden_layers, _layer_saved(c, T, L, span, a)
    inputs = C * d * F32 + T * span + T * d * F32 * layers  # ctx, the bool mask, every layer's input x
    if not dflash_grad:  # no_grad: the inputs and one layer's tensors at a time (or fc's input copy, if larger)
        live = inputs - T * d * F32 * (layers - 1) + 2 * F32 * L * hd + max(per_layer, C * taps * d * fc_in)
        rows.append(("drafter activations", live, "frozen drafter, no_grad: ctx, x, mask, RoPE + one layer"))
    elif cfg.grad_checkpoint:  # every layer checkpointed: its inputs kept, backward recomputes one at a time
        rows.append(("drafter activations", once + inputs,
                     f"grad_checkpoint: ctx, mask, {layers} layer inputs + norms, RoPE"))
    else:  # the first layer's input (the frozen embedding's output) needs no gradient: its norm keeps less
        rows.append(("drafter activations", once + layers * per_layer - T * (F32 * d + F32),
                     (f"{layers} layers x {per_layer / 2 ** 20:.0f} MiB ({T} block + {L} key tokens, "
                      f"_layer_saved) + norms, RoPE")))

    # 6. the LM head in row chunks (head.topk_ce): chunked with gradients, backward recomputes each chunk from
    # checkpointed inputs (a contiguous (Rh,d) copy of slots 1.., labels); one chunk keeps its log-softmax, top-k
    # ids (under autocast the head is train()'s bf16 one, saved as it is: no copy)
    step = chunk_rows(V, cfg.logit_chunk)
    one_chunk = Rh <= step
    head = 0
    if dflash_grad:
        head = Rh * 8 + Rh * F32  # labels, decayed_mean's weights
        how = "labels, loss weights"
        if one_chunk:
            head += Rh * V * F32 + Rh * K * 8
            how += f", one chunk: ({Rh},{V}) log-softmax, top-{K} ids"
        else:
            head += Rh * d * F32
            how += f", ({Rh},{d}) float32 slot states"
    else:
        how = f"no gradient through the frozen drafter ({mode})"
    rows.append(("LM head: saved for backward", head, how))

    # 7. corrector scores (R,bs-2,K,K): its op keeps the slot states (a view of the final norm's (N,A,bs,d)
    # output) and the candidates (ids, logits); L_corr its log-softmax, gather index, mask and weights
    corr, how = 0, "no corrector gradient"
    if corr_grad:
        corr = R * (bs - 2) * (K * K * F32 + 8 + 1 + F32) + Rh * K * (8 + a) + T * d * F32
        how = f"({R},{bs - 2},{K},{K}) log-softmax, top-{K} ids/logits, ({N},{A},{bs},{d}) float32 states"
    rows.append(("corrector + L_corr: saved", corr, how))

    # the largest transient on top: an LM-head chunk (the logits, their float32 copy and log-softmax; in backward
    # the log-softmax, its gradient and nll's), a drafter layer's backward (MLP: 3 (T,I) gradients; attention:
    # q/k/v gradients; recomputed first under grad_checkpoint), the native corrector's chunk
    rows_c = min(step, Rh)
    head_t = rows_c * V * (a + F32 + F32 * cuda)
    if dflash_grad:
        head_t = max(head_t, 12 * rows_c * V)
    layer_t = max(3 * T * c.intermediate_size * a, (T + 2 * L) * c.num_attention_heads * hd * 2 * a) * dflash_grad
    layer_t += per_layer * (dflash_grad and cfg.grad_checkpoint)
    corr_t = 4 * NATIVE_CHUNK_BYTES * (cuda and corr_grad)
    peak, which = max((head_t, f"an LM-head chunk of {rows_c} rows"), (layer_t, "a drafter layer's backward"),
                      (corr_t, "a native corrector chunk"))
    rows.append(("largest transient", peak, which))
    # 8. what no formula gives
    rows.append(("CUDA context + allocator slack", CUDA_SLACK if cuda else 0, "assumed" if cuda else "CPU: none"))
    return Plan(rows, device_bytes)
