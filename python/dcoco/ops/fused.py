"""torch.library ops over the compiled core: argument checks, output allocation, fake impls.

Ops (namespace ``dcoco``):
  score(hidden, cand_ids, cand_logits, embed, *weights) -> scores (R,B-1,K,K) f32 (f64 for float64 inputs),
      differentiable in hidden, cand_logits and the weights (backward: score_backward, compiled)
  score_backward(grad, hidden, cand_ids, cand_logits, embed, *weights) -> (d_hidden, d_logits, *d_weights)
  correct(hidden, cand_ids, cand_logits, embed, *weights, table) -> (ranks, tokens) (R,B) i64
  cand_table(embed, cand_proj, fuse_proj) -> (V,r) f32
  select(scores, first_logits, rule, lam) -> ranks (R,B) i64

The core takes raw pointers; every tensor it sees is made contiguous here and every output is a
torch allocation, so the ops are safe under torch.compile and (on CUDA) graph capture.
"""

from __future__ import annotations

import functools

import torch

from .. import _C
from . import backend, checks
from .checks import MAX_CANDIDATES, RULES, WEIGHTS, require_tensors  # noqa: F401  (the ops' public names)

assert MAX_CANDIDATES == _C.MAX_CANDIDATES, (MAX_CANDIDATES, _C.MAX_CANDIDATES)
# the checks of checks.py, restricted to the devices the compiled core runs on
check_inputs = functools.partial(checks.check_inputs, device_types=checks.FUSED_DEVICES)
_check_table_args = functools.partial(checks.check_table_args, device_types=checks.FUSED_DEVICES)
_check_select = functools.partial(checks.check_select, device_types=checks.FUSED_DEVICES)
_FLOAT_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 5}
_ID_CODES = {torch.int32: 3, torch.int64: 4}


def code_mismatches(dtype_codes: dict, rules: dict) -> list[str]:
    """How the codes passed to the core (torch dtype -> code, rule name -> code) differ from its enums _C.DType and
    _C.Rule, one line each; empty when they agree."""
    core = {**{f"dtype {n}": int(v) for n, v in _C.DType.__members__.items()},
            **{f"rule {n}": int(v) for n, v in _C.Rule.__members__.items()}}
    ours = {**{f"dtype {str(t).removeprefix('torch.')}": c for t, c in dtype_codes.items()},
            **{f"rule {n}": c for n, c in rules.items()}}
    return [f"{k}: {ours.get(k)} here, {core.get(k)} in dcoco._C" for k in sorted(core.keys() | ours.keys())
            if ours.get(k) != core.get(k)]


# a core built from other sources would read every dtype or rule wrongly: refuse it at import
if _mismatches := code_mismatches({**_FLOAT_CODES, **_ID_CODES}, RULES):
    raise ImportError(f"dcoco.ops.fused: the codes disagree with the compiled core (rebuild dcoco): {_mismatches}")

# Tests set this to fill outputs with NaN / -1 before the core writes them, so unwritten elements show.
POISON = False

_lib = torch.library.Library("dcoco", "DEF")
_W_SCHEMA = ", ".join(f"Tensor {n}" for n in WEIGHTS)
_lib.define(f"score(Tensor hidden, Tensor cand_ids, Tensor cand_logits, Tensor embed, {_W_SCHEMA}) -> Tensor")
_lib.define(f"score_backward(Tensor grad, Tensor hidden, Tensor cand_ids, Tensor cand_logits, Tensor embed, "
            f"{_W_SCHEMA}) -> ({', '.join(['Tensor'] * (2 + len(WEIGHTS)))})")
_lib.define(f"correct(Tensor hidden, Tensor cand_ids, Tensor cand_logits, Tensor embed, {_W_SCHEMA}, "
            "Tensor? table) -> (Tensor, Tensor)")
_lib.define("cand_table(Tensor embed, Tensor cand_proj, Tensor fuse_proj) -> Tensor")
_lib.define("select(Tensor scores, Tensor first_logits, str rule, float lam) -> Tensor")


def _out(shape, dtype, device) -> torch.Tensor:
    if POISON:
        return torch.full(shape, float("nan") if dtype.is_floating_point else -1, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _check_cuda(op: str, device: torch.device) -> None:
    """Raises clearly when the fused CUDA kernel of op may not run on device (backend.py decides)."""
    if not _C.built_with_cuda:
        raise RuntimeError(f"dcoco.{op}: CUDA tensors given, but dcoco was built without CUDA ({_C.cuda_status()[1]}); "
                           "dcoco.Corrector and dcoco.select run the native backend there")
    name, why = backend.resolve(device)
    if name != "fused":
        raise NotImplementedError(
            f"dcoco.{op}: the fused kernel is off on {device} ({why}); dcoco.Corrector and dcoco.select run the "
            "native backend there, and DCOCO_BACKEND=fused (or dcoco.set_backend('fused')) runs the kernel anyway")


def _launch(op: str, fn, device: torch.device, workspace=None, **kw) -> None:
    """fn(**kw) on the CPU, or on device's current stream for CUDA tensors (the core's arguments by their names in
    cpp/bindings.cpp). workspace() gives the CUDA workspace as {keyword: tensor}; it is allocated after the checks,
    under the device guard (its size may follow the device), and kept alive through the call."""
    if device.type != "cuda":
        fn(**kw)
        return
    _check_cuda(op, device)
    with torch.cuda.device(device):
        ws = workspace() if workspace else {}
        fn(**kw, cuda=True, stream=torch.cuda.current_stream(device).cuda_stream,
           **{k: t.data_ptr() for k, t in ws.items()})


def _ptr(t) -> int:
    return 0 if t is None else t.data_ptr()


def _inputs(hidden, cand_ids, cand_logits, embed, table=None) -> tuple[list[torch.Tensor], dict[str, int]]:
    """The inputs made contiguous (keep them alive through the call) and the core's pointer and dtype-code
    arguments for them, by name. With a vocabulary table the core reads no embedding row: embed may be a stand-in
    (Corrector's table-only preparation) and is passed as a null pointer, never copied."""
    hidden, cand_ids, cand_logits = (t.contiguous() for t in (hidden, cand_ids, cand_logits))
    embed = embed if table is not None else embed.contiguous()
    return [hidden, cand_ids, cand_logits, embed], {
        "hidden": hidden.data_ptr(), "hidden_dtype": _FLOAT_CODES[hidden.dtype],
        "cand_ids": cand_ids.data_ptr(), "ids_dtype": _ID_CODES[cand_ids.dtype],
        "cand_logits": cand_logits.data_ptr(), "logits_dtype": _FLOAT_CODES[cand_logits.dtype],
        "embed": 0 if table is not None else embed.data_ptr(), "embed_dtype": _FLOAT_CODES[embed.dtype]}


def _run_core(hidden, cand_ids, cand_logits, embed, weights, table, sizes, scores, ranks, tokens) -> None:
    keep, inputs = _inputs(hidden, cand_ids, cand_logits, embed, table)
    ws = [w.to(torch.float32).contiguous() for w in weights]
    table = None if table is None else table.contiguous()
    dev = hidden.device

    def workspace():  # the split of d follows the device's SM count
        floats, ints = _C.cuda_workspace_sizes(list(sizes), table is not None, scores is not None)
        return {"workspace": torch.empty(floats, dtype=torch.float32, device=dev),
                "counters": torch.zeros(ints, dtype=torch.int32, device=dev)}

    _launch("score" if ranks is None else "correct", _C.forward, dev, workspace, sizes=list(sizes), **inputs,
            table=_ptr(table), weights=[w.data_ptr() for w in ws], scores=_ptr(scores), ranks=_ptr(ranks),
            tokens=_ptr(tokens))


# --- score -----------------------------------------------------------------------------------------

def _score_impl(hidden, cand_ids, cand_logits, embed, *weights):
    sizes = check_inputs(hidden, cand_ids, cand_logits, embed, weights, float64=True)
    R, B, K = sizes[:3]
    dt = checks.precision(hidden, cand_logits, embed, weights)
    scores = _out((R, B - 1, K, K), dt, hidden.device)
    if not scores.numel():
        return scores
    if dt == torch.float64:
        _run_grad(hidden, cand_ids, cand_logits, embed, weights, sizes, dt, scores=scores)
    else:
        _run_core(hidden, cand_ids, cand_logits, embed, weights, None, sizes, scores, None, None)
    return scores


@torch.library.register_fake("dcoco::score", lib=_lib)
def _score_fake(hidden, cand_ids, cand_logits, embed, *weights):
    R, B, K = check_inputs(hidden, cand_ids, cand_logits, embed, weights, float64=True)[:3]
    return hidden.new_empty((R, B - 1, K, K), dtype=checks.precision(hidden, cand_logits, embed, weights))


def _run_grad(hidden, cand_ids, cand_logits, embed, weights, sizes, dt, scores=None, grad=None, outs=()) -> None:
    """The training path: scores (CPU, float64) and/or, given grad, the gradients into outs, in precision dt."""
    keep, inputs = _inputs(hidden, cand_ids, cand_logits, embed)
    ws = [w.to(dt).contiguous() for w in weights]
    grad = None if grad is None else grad.to(dt).contiguous()
    outs = outs or (None, None)
    dev = hidden.device
    workspace = lambda: {"workspace": torch.empty(_C.cuda_grad_workspace_size(list(sizes)), dtype=torch.float32,
                                                  device=dev)}
    _launch("score_backward", _C.score_grad, dev, workspace, sizes=list(sizes), **inputs,
            weights=[w.data_ptr() for w in ws], grad=_ptr(grad), scores=_ptr(scores), d_hidden=_ptr(outs[0]),
            d_logits=_ptr(outs[1]), d_weights=[o.data_ptr() for o in outs[2:]], float64=dt == torch.float64)


# --- score_backward: the compiled backward, and score's autograd ------------------------------------

def _grad_outputs(hidden, cand_logits, weights, dt, empty):
    return (empty(hidden.shape, dt), empty(cand_logits.shape, dt), *(empty(w.shape, dt) for w in weights))


def _score_backward_impl(grad, hidden, cand_ids, cand_logits, embed, *weights):
    sizes = check_inputs(hidden, cand_ids, cand_logits, embed, weights, float64=True)
    R, B, K = sizes[:3]
    checks.float_tensor("grad", grad, 4, float64=True)
    checks.shape("grad", grad, (R, B - 1, K, K), "= the scores' (R, B-1, K, K)")
    dt = checks.precision(hidden, cand_logits, embed, weights)
    outs = _grad_outputs(hidden, cand_logits, weights, dt, lambda s, t: _out(s, t, hidden.device))
    if grad.numel():
        _run_grad(hidden, cand_ids, cand_logits, embed, weights, sizes, dt, grad=grad, outs=outs)
    else:  # no transition (R = 0 or B = 1): nothing depends on the inputs
        for o in outs:
            o.zero_()
    return outs


@torch.library.register_fake("dcoco::score_backward", lib=_lib)
def _score_backward_fake(grad, hidden, cand_ids, cand_logits, embed, *weights):
    check_inputs(hidden, cand_ids, cand_logits, embed, weights, float64=True)
    dt = checks.precision(hidden, cand_logits, embed, weights)
    return _grad_outputs(hidden, cand_logits, weights, dt, lambda s, t: hidden.new_empty(s, dtype=t))


def _score_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _score_backward(ctx, grad):
    hidden, cand_ids, cand_logits, embed, *weights = ctx.saved_tensors
    d_hidden, d_logits, *d_weights = torch.ops.dcoco.score_backward(grad, hidden, cand_ids, cand_logits, embed,
                                                                    *weights)
    # none for the ids (discrete) or embed (frozen: docs/spec.md, "Shapes and names")
    return (d_hidden.to(hidden.dtype), None, d_logits.to(cand_logits.dtype), None,
            *(g.to(w.dtype) for g, w in zip(d_weights, weights)))


torch.library.register_autograd("dcoco::score", _score_backward, setup_context=_score_setup, lib=_lib)


def _no_double_backward(ctx, *grads):
    raise NotImplementedError("dcoco.score: double backward (gradients of gradients) is not supported")


torch.library.register_autograd("dcoco::score_backward", _no_double_backward, lib=_lib)


# --- correct ---------------------------------------------------------------------------------------

def _correct_impl(hidden, cand_ids, cand_logits, embed, *weights_and_table):
    *weights, table = weights_and_table
    sizes = check_inputs(hidden, cand_ids, cand_logits, embed, weights, table)
    R, B = sizes[:2]
    ranks = _out((R, B), torch.int64, hidden.device)
    tokens = _out((R, B), torch.int64, hidden.device)
    if R:
        _run_core(hidden, cand_ids, cand_logits, embed, weights, table, sizes, None, ranks, tokens)
    return ranks, tokens


@torch.library.register_fake("dcoco::correct", lib=_lib)
def _correct_fake(hidden, cand_ids, cand_logits, embed, *weights_and_table):
    *weights, table = weights_and_table
    R, B = check_inputs(hidden, cand_ids, cand_logits, embed, weights, table)[:2]
    return hidden.new_empty((R, B), dtype=torch.int64), hidden.new_empty((R, B), dtype=torch.int64)


# --- cand_table ------------------------------------------------------------------------------------

def _cand_table_impl(embed, cand_proj, fuse_proj):
    V, d, r = _check_table_args(embed, cand_proj, fuse_proj)
    table = _out((V, r), torch.float32, embed.device)
    embed = embed.contiguous()
    cp, fp = cand_proj.to(torch.float32).contiguous(), fuse_proj.to(torch.float32).contiguous()
    if V:
        _launch("cand_table", _C.cand_table, embed.device, V=V, d=d, r=r, embed=embed.data_ptr(),
                embed_dtype=_FLOAT_CODES[embed.dtype], cand_proj=cp.data_ptr(), fuse_proj=fp.data_ptr(),
                table=table.data_ptr())
    return table


@torch.library.register_fake("dcoco::cand_table", lib=_lib)
def _cand_table_fake(embed, cand_proj, fuse_proj):
    V, _, r = _check_table_args(embed, cand_proj, fuse_proj)
    return embed.new_empty((V, r), dtype=torch.float32)


# --- select ----------------------------------------------------------------------------------------

def _select_impl(scores, first_logits, rule, lam):
    R, B, K = _check_select(scores, first_logits, rule, lam)
    dev = scores.device
    ranks = _out((R, B), torch.int64, dev)
    if R == 0:
        return ranks
    scores = scores.to(torch.float32).contiguous()
    first_logits = first_logits.contiguous()
    work = torch.empty((R, 3 * K), dtype=torch.float32, device=dev)
    nxt = torch.empty((R, max(B - 1, 1), K), dtype=torch.int32, device=dev)
    _launch("select", _C.select, dev, R=R, B=B, K=K, scores=scores.data_ptr(), first_logits=first_logits.data_ptr(),
            first_dtype=_FLOAT_CODES[first_logits.dtype], rule=RULES[rule], lam=float(lam), work=work.data_ptr(),
            next=nxt.data_ptr(), ranks=ranks.data_ptr())
    return ranks


@torch.library.register_fake("dcoco::select", lib=_lib)
def _select_fake(scores, first_logits, rule, lam):
    R, B, _ = _check_select(scores, first_logits, rule, lam)
    return scores.new_empty((R, B), dtype=torch.int64)


for _key in ("CPU", "CUDA"):
    _lib.impl("score", _score_impl, _key)
    _lib.impl("score_backward", _score_backward_impl, _key)
    _lib.impl("correct", _correct_impl, _key)
    _lib.impl("cand_table", _cand_table_impl, _key)
    _lib.impl("select", _select_impl, _key)
