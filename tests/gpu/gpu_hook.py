"""The plugin's whole draft-logits hook without vLLM (bench/gpu_check.sh): dcoco.serve.hook.on_logits as the plugin runs
it (top-K of bf16 logits, the greedy corrector over the prepared table, the hand-back), point_mass False and True,
and an anchor-aware corrector (docs/spec.md, "Anchor transition") fed as the plugin feeds it (each request's anchor
row and token strided views of the drafter pass's), on both backends, eager and replayed from a CUDA graph; its
drafts checked against the CPU core on the same inputs, and timed against plain DFlash's hand-back (argmax only,
no corrector). Writes --out after every case, so a run cut off keeps what finished.

  python tests/gpu/gpu_hook.py --out OUT/hook.json                       # the device: R 1,8,32, V=151936, d=4096
  python tests/gpu/gpu_hook.py --device cpu --R 1 2 --V 1000 --d 64 ...  # the rehearsal: no graphs, no CUDA timers

Each case ("anchor": the anchor-aware corrector, point_mass False only): "topk_equal" (GPU and CPU top-K ids),
"hand_back_ok" (+inf at the chosen token and nothing else changed, or the point mass), "graph_equal" (replay ==
eager), "corrector_equal" (the corrector alone, as the plugin calls it, drafts the hook's tokens), "agree_slots" /
"agree_requests" (exact agreement with the CPU core), and for each disagreeing request whether the GPU's walk is
still a greedy walk of the float64 reference scores (from the anchor transition's S_0 in an anchor case) within
the tolerance tests/ops/test_cuda.py uses ("invalid_walks" counts those that are not).
Times are medians in us: "eager_us" (CUDA events around the eager call), "graph_us" (around a replay),
"corrector_us" (the corrector alone, replayed), "baseline_us" (plain DFlash: argmax of the same logits, replayed),
"ratio" = graph_us / baseline_us. The logits are restored before each call, outside the timed span: the hook
rewrites them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import dcoco
from dcoco.serve import hook
from dcoco.testing import reference as ref

N, K = 15, 16
TOL = 1e-4  # bf16 inputs on the tensor-core paths (tests/ops/test_cuda.py's tolerance)


def random_corrector(d: int, seed: int, anchor: bool = False) -> dcoco.Corrector:
    """float32 like the plugin's, with the output layer active (zero at init), scaled as tests/conftest.py does."""
    g = torch.Generator().manual_seed(seed)
    m = dcoco.Corrector(d, num_candidates=K, anchor_transition=anchor)
    with torch.no_grad():
        for name, p in m.named_parameters():
            fan_in = p.shape[-1] if p.dim() == 2 else 1
            std = 3.0 / m.mlp_hidden ** 0.5 if name == "mlp.2.weight" else 1.0 / fan_in ** 0.5
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if name == "fuse_norm.weight" else 0.0))
    return m.requires_grad_(False)


def draft_logits(rows: int, V: int, g: torch.Generator, device) -> torch.Tensor:
    """bf16 logits whose top K+4 per row are distinct exact bf16 values in [4, 8), gaps near the corrector's
    corrections, over a background clamped at 3: top-K has one answer, so CPU and GPU must agree on it."""
    x = torch.randn(rows, V, generator=g, device=device).clamp_(max=3.0)
    top = K + 4
    pos = torch.rand(rows, V, generator=g, device=device).topk(top, -1).indices
    vals = 4.0 + torch.rand(rows, 128, generator=g, device=device).argsort(-1)[:, :top].float() / 32
    return x.scatter_(1, pos, vals).bfloat16()


class Timer:
    """Median time of fn(), in us: CUDA events on a GPU, perf_counter on the CPU rehearsal. before() runs
    untimed before each call (restores the logits)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def __call__(self, fn, before, reps: int) -> float:
        times = []
        for _ in range(reps + 1):
            before()
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e6)
        return statistics.median(times[1:])  # the first is a warmup


def capture(fn):
    """A CUDA graph of fn (warmed up on a side stream, as capture needs) and its static output."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def cpu_reference(m_cpu: dcoco.Corrector, embed, hidden, logits, R: int, anchor: tuple = ()) -> dict:
    """The whole hook on the CPU (fused CPU core, prepared table) on the same inputs; anchor: () or (anchor_hidden
    (R, d), anchor_ids (R,)) for an anchor-aware m_cpu. The table and the reference scores use only the
    candidates' and anchors' embedding rows (ids remapped): the same rows, a fraction of V."""
    h, lg = hidden.cpu(), logits.cpu()
    ids, values = hook.candidates(lg, K)
    a_h, a_ids = (t.cpu() for t in anchor) if anchor else (None, ids.new_zeros(0))
    uniq, inv = torch.cat([ids.flatten(), a_ids]).unique(return_inverse=True)
    inv, a_inv = inv[:ids.numel()].view(ids.shape), inv[ids.numel():]
    e = embed[uniq.to(embed.device)].cpu()
    with dcoco.use_backend("fused"):
        m_cpu.prepare_inference(e)
        correct = hook.rows(lambda hh, ii, vv, *a: uniq[m_cpu(hh, inv.view(ii.shape), vv, e, *a)[1]], N)
        out = hook.on_logits(correct, h, lg.clone(), K, False, *((a_h, a_inv) if anchor else ()))
    return {"tokens": out.argmax(-1).view(R, N), "ids": ids.view(R, N, K), "values": values.view(R, N, K),
            "inv": inv.view(R, N, K), "embed": e, "hidden": hook.blocks(h, N, a_h),
            "anchor_inv": a_inv if anchor else None}


def walk_check(m_cpu, cpu: dict, ids_gpu: torch.Tensor, tokens_gpu: torch.Tensor) -> dict:
    """Exact agreement with the CPU core; each disagreeing request's GPU walk checked as a greedy walk of the
    float64 reference scores (slot 1 the argmax, or within atol of S_0's maximum in an anchor case, every later
    step within atol of its row's maximum)."""
    tokens_cpu = cpu["tokens"]
    same = tokens_gpu == tokens_cpu
    bad = (~same.all(-1)).nonzero().flatten().tolist()
    res = {"agree_slots": same.float().mean().item(), "agree_requests": same.all(-1).float().mean().item(),
           "disagreeing": len(bad), "invalid_walks": 0, "max_shortfall": 0.0}
    if not bad:
        return res
    ranks = (ids_gpu[bad] == tokens_gpu[bad][..., None]).int().argmax(-1)  # ids unique per slot
    in_ids = (ids_gpu[bad] == tokens_gpu[bad][..., None]).any(-1).all(-1)
    s64, first = reference_scores(m_cpu, cpu, bad)
    atol = 10 * TOL * (s64.abs().max().item() + 1.0)
    for j in range(len(bad)):
        if first is None:
            ok = bool(in_ids[j]) and int(ranks[j, 0]) == int(cpu["values"][bad[j], 0].argmax())
        else:
            short = (first[j].max() - first[j, ranks[j, 0]]).item()
            res["max_shortfall"] = max(res["max_shortfall"], short)
            ok = bool(in_ids[j]) and short <= atol
        for p in range(N - 1):
            row = s64[j, p, ranks[j, p]]
            short = (row.max() - row[ranks[j, p + 1]]).item()
            res["max_shortfall"] = max(res["max_shortfall"], short)
            ok = ok and short <= atol
        res["invalid_walks"] += not ok
    res["atol"] = atol
    return res


def reference_scores(m_cpu, cpu: dict, rows: list) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The float64 reference scores of the requests `rows` over the remapped embedding rows: the grid
    (n,N-1,K,K), and S_0 (n,K) in an anchor case (else None)."""
    h, ids, values = cpu["hidden"][rows].double(), cpu["inv"][rows], cpu["values"][rows].double()
    e, weights = cpu["embed"].double(), [w.double() for w in m_cpu.weights()]
    if cpu["anchor_inv"] is None:
        return ref.score(h, ids, values, e, *weights), None
    return (ref.score(h[:, 1:], ids, values, e, *weights),
            ref.anchor_scores(h, ids, values, cpu["anchor_inv"][rows], e, *weights))


def self_check(m_cpu, cpu: dict) -> bool:
    """walk_check flags a walk that is not greedy: the CPU's own tokens with request 0's last step moved to the
    candidate the reference scores lowest, and in an anchor case, apart, its first step moved to S_0's lowest
    (run in the rehearsal, where every case agrees)."""
    s64, first = reference_scores(m_cpu, cpu, [0])
    prev = int((cpu["ids"][0, N - 2] == cpu["tokens"][0, N - 2]).int().argmax())
    moves = [(N - 1, int(s64[0, N - 2, prev].argmin()))] + ([] if first is None else [(0, int(first[0].argmin()))])
    for slot, rank in moves:
        tampered = cpu["tokens"].clone()
        tampered[0, slot] = cpu["ids"][0, slot, rank]
        res = walk_check(m_cpu, cpu, cpu["ids"], tampered)
        if not (res["disagreeing"] == 1 and res["invalid_walks"] == 1):
            return False
    return walk_check(m_cpu, cpu, cpu["ids"], cpu["tokens"])["disagreeing"] == 0


def hand_back_ok(before: torch.Tensor, after: torch.Tensor, tokens: torch.Tensor, point_mass: bool) -> bool:
    rows = torch.arange(after.shape[0], device=after.device)
    if point_mass:
        return bool((after[rows, tokens] == 0).all() and (torch.isneginf(after).sum(-1) == after.shape[1] - 1).all())
    changed = after != before
    return bool(torch.isposinf(after[rows, tokens]).all() and (changed.sum(-1) == 1).all()
                and changed[rows, tokens].all())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--R", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=50, help="graph replays timed (eager: a fifth of it, at least 3)")
    ap.add_argument("--out", default="hook.json")
    ap.add_argument("--self-check", action="store_true", help="also check that a tampered walk is flagged")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    m_cpu = {a: random_corrector(args.d, seed=0, anchor=a) for a in (False, True)}
    m = {a: random_corrector(args.d, seed=0, anchor=a).to(dev) for a in (False, True)}
    g = torch.Generator(device=dev).manual_seed(1)
    embed = torch.randn(args.V, args.d, generator=g, device=dev).bfloat16()
    timer = Timer(cuda)
    info = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "dcoco": dcoco.build_info()["version"], "N": N, "K": K, "V": args.V, "d": args.d, "reps": args.reps,
            "graphs": cuda, "note": None if cuda else "CPU rehearsal: CUDA graphs and CUDA-event timings skipped, "
            "eager timed with perf_counter", "baseline": {}, "cases": []}
    out = Path(args.out)
    save = lambda: out.write_text(json.dumps(info, indent=1))
    inputs = {}
    for R in args.R:
        # the drafter pass's R(1+N) rows, request-major, each request's anchor first: the plugin's hook gets the N
        # drafted rows of each (gathered, a copy) and reads the anchors' rows and tokens as strided views
        pass_rows = torch.randn(R * (N + 1), args.d, generator=g, device=dev).bfloat16()
        hidden = pass_rows.view(R, N + 1, -1)[:, 1:].reshape(R * N, -1)
        anchor = (pass_rows[::N + 1], torch.randint(args.V, (R * (N + 1),), generator=g, device=dev)[::N + 1])
        logits = draft_logits(R * N, args.V, g, dev)
        work = torch.empty_like(logits)
        restore = lambda: work.copy_(logits)
        base = {"eager_us": timer(lambda: work.argmax(-1), restore, max(3, args.reps // 5))}
        if cuda:
            restore()
            graph, _ = capture(lambda: work.argmax(-1))
            base["graph_us"] = timer(graph.replay, restore, args.reps)
            del graph
        info["baseline"][str(R)] = base
        inputs[R] = (hidden, logits, work, anchor, {a: cpu_reference(m_cpu[a], embed, hidden, logits, R,
                                                                     anchor if a else ()) for a in (False, True)})
        if args.self_check:
            checks = (self_check(m_cpu[a], inputs[R][4][a]) for a in (False, True))
            info.setdefault("self_check", {})[str(R)] = all(checks)
        save()
    for backend, a in ((b, a) for b in ("fused", "native") for a in (False, True)):
        with dcoco.use_backend(backend):
            m[a].prepare_inference(embed)
            # the plugin's call
            correct = hook.rows(lambda h, i, v, *an: hook.tokens(m[a], embed, "greedy", h, i, v, *an), N)
            for R in args.R:
                hidden, logits, work, anchor, cpu = inputs[R]
                anchor, cpu = anchor if a else (), cpu[a]
                ids, values = hook.candidates(logits, K)
                for point_mass in (False, True) if not a else (False,):
                    case = {"backend": backend, "R": R, "anchor": a, "point_mass": point_mass, "error": None}
                    info["cases"].append(case)
                    step = lambda: (hook.on_logits(correct, hidden, work, K, point_mass, *anchor)
                                    .argmax(-1))
                    restore = lambda: work.copy_(logits)
                    try:
                        restore()
                        tokens = step()
                        case["hand_back_ok"] = hand_back_ok(logits, work, tokens, point_mass)
                        case["topk_equal"] = torch.equal(ids.view(R, N, K).cpu(), cpu["ids"])
                        case.update(walk_check(m_cpu[a], cpu, ids.view(R, N, K).cpu(), tokens.view(R, N).cpu()))
                        case["eager_us"] = timer(step, restore, max(3, args.reps // 5))
                        alone = lambda: correct(hidden, ids, values, *anchor)
                        case["corrector_equal"] = torch.equal(alone(), tokens)
                        if cuda:
                            restore()
                            graph, replayed = capture(step)
                            restore()
                            graph.replay()
                            case["graph_equal"] = torch.equal(replayed, tokens)
                            case["graph_us"] = timer(graph.replay, restore, args.reps)
                            alone_graph, _ = capture(alone)
                            case["corrector_us"] = timer(alone_graph.replay, lambda: None, args.reps)
                            case["ratio"] = case["graph_us"] / info["baseline"][str(R)]["graph_us"]
                            del graph, alone_graph
                        case["ok"] = bool(case["hand_back_ok"] and case["topk_equal"] and case["invalid_walks"] == 0
                                          and case["corrector_equal"] and case.get("graph_equal", True))
                    except Exception as e:  # noqa: BLE001  recorded: the other cases still run
                        case.update(ok=False, error=f"{type(e).__name__}: {e}"[:500])
                    print(json.dumps(case), flush=True)
                    save()
    info["passed"] = {b: bool(rows) and all(c["ok"] for c in rows)
                      for b in ("fused", "native") for rows in [[c for c in info["cases"] if c["backend"] == b]]}
    save()
    print("\n| backend | R | anchor | point mass | agree | invalid walks | eager us | graph us | corrector us "
          "| DFlash us | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in info["cases"]:
        f = lambda k: f"{c[k]:.1f}" if isinstance(c.get(k), float) else "-"
        b = info["baseline"][str(c["R"])]
        print(f"| {c['backend']} | {c['R']} | {c['anchor']} | {c['point_mass']} | {f('agree_slots')} "
              f"| {c.get('invalid_walks', '-')} | {f('eager_us')} | {f('graph_us')} | {f('corrector_us')} | "
              f"{b.get('graph_us', b['eager_us']):.1f} | {f('ratio')} |" + (f" {c['error']}" if c["error"] else ""))
    print("passed:", json.dumps(info["passed"]))


if __name__ == "__main__":
    main()
