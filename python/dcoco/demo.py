"""`dcoco demo`: the corrector on the embedded default target, offline, CPU or GPU.

There is no trained DFlash drafter yet, so the target itself stands in for one: a single forward pass over
prompt + anchor + 15 mask tokens gives, at every drafted slot, a hidden state and top-16 candidates that
were chosen without seeing the earlier slots, which is exactly a parallel draft's blind spot. The demo shows
how often the target's own greedy continuation sits in each slot's top-16 (what a corrector can reach), the
uncorrected draft, and a fresh corrector's re-selection, which at initialisation (zero output layer) must
equal the drafter's argmax."""

from __future__ import annotations

import time

import torch

from . import Corrector, build_info, smollm2

BLOCK = 15
K = 16


@torch.no_grad()
def run(prompt: str, device: str = "cpu") -> dict:
    tok, model = smollm2.load()
    model.to(device)
    chat = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ids = tok(chat, return_tensors="pt").input_ids.to(device)
    truth = model.generate(ids, max_new_tokens=BLOCK + 1, do_sample=False)[0, ids.shape[1]:]
    if truth.numel() < BLOCK + 1:
        raise RuntimeError("the target stopped before a whole block; try a longer prompt")
    anchor = truth[:1]
    masks = torch.full((BLOCK,), smollm2.MASK_TOKEN_ID, device=device)
    out = model(torch.cat([ids[0], anchor, masks])[None], output_hidden_states=True)
    n = ids.shape[1] + 1  # positions of the anchor onwards; slot j is predicted at anchor + j - 1
    logits = out.logits[0, n - 1:n - 1 + BLOCK].float()          # (B,V): slot j's prediction
    hidden = out.hidden_states[-1][0, n - 1:n - 1 + BLOCK]       # (B,d)
    top = logits.topk(K, dim=-1)                                  # sorted, rank 0 = argmax
    embed = model.get_input_embeddings().weight.detach()
    corrector = Corrector(embed.shape[1], num_candidates=K).to(device)
    t = time.perf_counter()
    corrector.prepare_inference(embed)
    prep_s = time.perf_counter() - t
    args = (hidden[None], top.indices[None], top.values[None], embed)
    ranks, tokens = corrector(*args)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        corrector(*args)
        times.append(time.perf_counter() - t)
    want = truth[1:BLOCK + 1]
    in_top = (top.indices == want[:, None]).any(-1)
    return {
        "prompt": prompt, "device": device, "build": build_info(),
        "truth": tok.convert_ids_to_tokens(want.tolist()),
        "draft": tok.convert_ids_to_tokens(top.indices[:, 0].tolist()),
        "corrected": tok.convert_ids_to_tokens(tokens[0].tolist()),
        "top1_hit": (top.indices[:, 0] == want).tolist(), "top16_hit": in_top.tolist(),
        "identity_at_init": bool((ranks == 0).all()),
        "prepare_inference_s": prep_s, "forward_ms_median": sorted(times)[len(times) // 2] * 1e3,
        "shapes": {"R": 1, "B": BLOCK, "K": K, "d": embed.shape[1], "V": embed.shape[0]},
    }


def show(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    s = res["shapes"]
    c.print(f"[bold]dcoco demo[/] on SmolLM2-135M-Instruct ({res['device']}): R={s['R']} B={s['B']} K={s['K']} "
            f"d={s['d']} V={s['V']}")
    c.print(f"prompt: {res['prompt']!r}")
    table = Table("slot", "target's greedy token", "draft top-1", "in top-16", "corrected")
    for j, (t, d, hit, cor) in enumerate(zip(res["truth"], res["draft"], res["top16_hit"], res["corrected"]), 1):
        table.add_row(str(j), repr(t), repr(d) + (" ✓" if t == d else ""), "yes" if hit else "no", repr(cor))
    c.print(table)
    c.print(f"top-1 hits {sum(res['top1_hit'])}/{len(res['top1_hit'])}, top-16 hits "
            f"{sum(res['top16_hit'])}/{len(res['top16_hit'])}: the room a trained corrector can use")
    c.print(f"fresh corrector keeps the drafter's argmax: {res['identity_at_init']} (zero-initialised output layer)")
    c.print(f"prepare_inference (V x r table): {res['prepare_inference_s']:.2f} s; corrector forward: "
            f"{res['forward_ms_median']:.2f} ms median of 20 (compiled core, {res['build']['cuda_status']})")
