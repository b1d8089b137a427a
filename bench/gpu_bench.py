"""GPU timing of both backends (run by bench/gpu_check.sh on a GPU; needs CUDA).

CUDA-graph replay, median of many, d=4096, B=15, K=16, V=151936, bf16 inputs, for R in 1..256: the fused
kernel (after prepare_inference, run whether or not its arch is validated), the native backend (the same
table; eager ops replayed as a graph, and torch.compile of it unless --quick), and the eager literal reference.
The floor comes from the copy bandwidth and the bf16 matrix rate measured in the same run. Then training, R in 1, 8,
32, 512: the fused score and its compiled backward against the native score + backward (autograd, chunks
recomputed), with the native path's extra peak memory. Prints tables last and writes gpu_bench.json to --out.

--rehearse runs every call on the CPU at small sizes (d=64, V=1000, R 1 and 4, training R 1 and 8), timed eagerly
with perf_counter, without graphs, ceilings or memory counters: bench/gpu_check.sh's CPU rehearsal, so that a
GPU run never meets a call that cannot run."""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import dcoco
from dcoco.ops import native
from dcoco.testing import reference as ref


B, K, r, H = 15, 16, 128, 256
SIZES = {"device": (4096, 151936, (1, 4, 8, 16, 32, 64, 128, 256), (1, 8, 32, 512)),  # d, V, R, training R
         "rehearsal": (64, 1000, (1, 4), (1, 8))}


def graph_time_us(fn, reps=200) -> float:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def eager_time_us(fn, reps=5, sync=torch.cuda.synchronize) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def ceilings() -> dict:
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = graph_time_us(lambda: y.copy_(x), reps=20)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = graph_time_us(lambda: a @ a, reps=10)
    return {"copy_bytes_per_s": 2 * x.numel() / (us * 1e-6), "bf16_flop_per_s": 2 * 8192**3 / (mm * 1e-6)}


def floor_us(R: int, ceil: dict, D: int) -> float | None:
    if not ceil:
        return None
    # weights, hidden, table rows, ids, logits
    nbytes = 3 * r * D * 4 + H * (3 * r + 2) * 4 + R * B * D * 2 + R * B * K * (r * 4 + 8 + 2)
    flops = 2 * R * (B * 3 * r * D + B * K * r * (r + 2 * H) + (B - 1) * r * H + (B - 1) * K * H * 2)
    return max(nbytes / ceil["copy_bytes_per_s"], flops / ceil["bf16_flop_per_s"]) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="no torch.compile column (its compile takes the longest)")
    ap.add_argument("--rehearse", action="store_true", help="on the CPU at small sizes (see above)")
    args = ap.parse_args()
    dev = "cpu" if args.rehearse else "cuda"
    D, V, R_rows, R_train = SIZES["rehearsal" if args.rehearse else "device"]
    if args.rehearse:  # every timer eager, by perf_counter, nothing to synchronize
        no_sync = lambda: None
        graph_us = lambda fn, reps=200: eager_time_us(fn, min(reps, 3), no_sync)
        eager_us = lambda fn, reps=5: eager_time_us(fn, reps, no_sync)
    else:
        graph_us, eager_us = graph_time_us, eager_time_us
    dcoco.set_backend("fused")  # the Corrector calls below time the kernel; native.* is called directly
    torch.manual_seed(0)
    m = dcoco.Corrector(D).to(dev)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    embed = torch.randn(V, D, device=dev, dtype=torch.bfloat16)
    table = m.prepare_inference(embed)
    w = tuple(t.detach() for t in m.weights())
    compiled = None if args.quick else torch.compile(lambda h, i, l: native.correct(h, i, l, embed, w, table))
    ceil = {} if args.rehearse else ceilings()
    rows, train = [], []
    info = {"gpu": "cpu (rehearsal)" if args.rehearse else torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "dcoco": dcoco.build_info(),
            "ceilings": ceil, "rows": rows, "train": train}
    # written after every R, so a timeout keeps what ran
    save = lambda: Path(args.out, "gpu_bench.json").write_text(json.dumps(info, indent=2))
    for R in R_rows:
        h = torch.randn(R, B, D, device=dev, dtype=torch.bfloat16)
        ids = torch.randint(0, V, (R, B, K), device=dev)
        lg = torch.randn(R, B, K, device=dev).sort(-1, descending=True).values.bfloat16()
        with torch.no_grad():
            fused = graph_us(lambda: m(h, ids, lg, embed))
            nat = graph_us(lambda: native.correct(h, ids, lg, embed, w, table))
            comp = graph_us(lambda: compiled(h, ids, lg)) if compiled else None
            eager = eager_us(lambda: ref.forward(h, ids, lg, embed, *w)) if R <= 64 else None
        rows.append({"R": R, "fused_us": fused, "native_us": nat, "native_compile_us": comp, "eager_ref_us": eager,
                     "floor_us": floor_us(R, ceil, D)})
        print(rows[-1], flush=True)
        save()
    for R in R_train:
        h = torch.randn(R, B, D, device=dev, dtype=torch.bfloat16)
        ids = torch.randint(0, V, (R, B, K), device=dev)
        lg = torch.randn(R, B, K, device=dev)
        G = torch.randn(R, B - 1, K, K, device=dev)
        hg, lgg, wg = h.float().requires_grad_(), lg.clone().requires_grad_(), [t.clone().requires_grad_() for t in w]
        reps, eager_reps = (20, 5) if R <= 32 else (3, 1)  # R=512: the training batch, timed once
        fwd = graph_us(lambda: torch.ops.dcoco.score(h, ids, lg, embed, *w), reps=reps)
        bwd = graph_us(lambda: torch.ops.dcoco.score_backward(G, h, ids, lg, embed, *w), reps=reps)
        def grad(score):
            return torch.autograd.grad((score(hg, ids, lgg, embed, wg) * G).sum(), (hg, lgg, *wg))

        fused_score = lambda h, i, l, e, ws: torch.ops.dcoco.score(h, i, l, e, *ws)
        fused_fb = eager_us(lambda: grad(fused_score), eager_reps)
        native_fb = eager_us(lambda: grad(native.score), eager_reps)
        peak = None
        if not args.rehearse:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            grad(native.score)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
        train.append({"R": R, "score_us": fwd, "backward_us": bwd, "fused_fwd_bwd_us": fused_fb,
                      "native_fwd_bwd_us": native_fb, "native_extra_peak_bytes": peak})
        print(train[-1], flush=True)
        save()
    print(f"\n{info['gpu']}, {info['date']}: median us per call ({'eager' if args.rehearse else 'CUDA-graph replay'})")
    print("| R | fused | native | native compiled | eager reference | floor | native/fused | fused/floor |")
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        e = f"{x['eager_ref_us']:.0f}" if x["eager_ref_us"] else "-"
        c = f"{x['native_compile_us']:.1f}" if x["native_compile_us"] else "-"
        fl, ff = ("-", "-") if x["floor_us"] is None else (f"{x['floor_us']:.1f}",
                                                           f"{x['fused_us'] / x['floor_us']:.1f}x")
        print(f"| {x['R']} | {x['fused_us']:.1f} | {x['native_us']:.1f} | {c} | {e} | {fl} | "
              f"{x['native_us'] / x['fused_us']:.1f}x | {ff} |")
    print("\n| R | fused score | fused backward | fused fwd+bwd | native fwd+bwd | native extra peak |")
    print("|---|---|---|---|---|---|")
    for x in train:
        peak = "-" if x["native_extra_peak_bytes"] is None else f"{x['native_extra_peak_bytes'] / 2**30:.2f} GiB"
        print(f"| {x['R']} | {x['score_us']:.1f} | {x['backward_us']:.1f} | {x['fused_fwd_bwd_us']:.0f} | "
              f"{x['native_fwd_bwd_us']:.0f} | {peak} |")


if __name__ == "__main__":
    main()
