"""GPU timing of the fused forward (run by bench/gpu_check.sh on a lent device; needs CUDA).

CUDA-graph replay, median of many, d=4096, B=15, K=16, V=151936, bf16 inputs, for R in 1..256: the fused
op (after prepare_inference) vs the eager literal reference vs torch.compile of the best PyTorch
formulation (bench/baselines.py, same table). The floor comes from the copy bandwidth and the bf16
matrix rate measured in the same run. Then the training op (score and its compiled backward) for R in 1, 8,
32 against autograd through bench/baselines.py's score. Prints tables last and writes JSON to --out."""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import dcoco
from dcoco import reference as ref

sys.path.insert(0, str(Path(__file__).parent))
import baselines  # noqa: E402

D, V, B, K, r, H = 4096, 151936, 15, 16, 128, 256


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


def eager_time_us(fn, reps=5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def ceilings() -> dict:
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = graph_time_us(lambda: y.copy_(x), reps=20)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = graph_time_us(lambda: a @ a, reps=10)
    return {"copy_bytes_per_s": 2 * x.numel() / (us * 1e-6), "bf16_flop_per_s": 2 * 8192**3 / (mm * 1e-6)}


def floor_us(R: int, ceil: dict) -> float:
    nbytes = 3 * r * D * 4 + H * (3 * r + 2) * 4 + R * B * D * 2 + R * B * K * (r * 4 + 8 + 2)  # weights, hidden, table rows, ids, logits
    flops = 2 * R * (B * 3 * r * D + B * K * r * (r + 2 * H) + (B - 1) * r * H + (B - 1) * K * H * 2)
    return max(nbytes / ceil["copy_bytes_per_s"], flops / ceil["bf16_flop_per_s"]) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.environ["DCOCO_UNVALIDATED_CUDA"] = "1"
    torch.manual_seed(0)
    m = dcoco.Corrector(D).cuda()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    embed = torch.randn(V, D, device="cuda", dtype=torch.bfloat16)
    table = m.prepare_inference(embed)
    w = tuple(t.detach() for t in m.weights())
    compiled = torch.compile(lambda h, i, l: baselines.forward(h, i, l, embed, w, table))
    ceil = ceilings()
    rows = []
    for R in (1, 4, 8, 16, 32, 64, 128, 256):
        h = torch.randn(R, B, D, device="cuda", dtype=torch.bfloat16)
        ids = torch.randint(0, V, (R, B, K), device="cuda")
        lg = torch.randn(R, B, K, device="cuda").sort(-1, descending=True).values.bfloat16()
        with torch.no_grad():
            fused = graph_time_us(lambda: m(h, ids, lg, embed))
            comp = graph_time_us(lambda: compiled(h, ids, lg))
            eager = eager_time_us(lambda: ref.forward(h, ids, lg, embed, *w)) if R <= 64 else None
        rows.append({"R": R, "fused_us": fused, "compile_us": comp, "eager_ref_us": eager, "floor_us": floor_us(R, ceil)})
        print(rows[-1], flush=True)
    train = []  # the training op: dcoco::score forward, its compiled backward, vs autograd through the baseline
    for R in (1, 8, 32):
        h = torch.randn(R, B, D, device="cuda", dtype=torch.bfloat16)
        ids = torch.randint(0, V, (R, B, K), device="cuda")
        lg = torch.randn(R, B, K, device="cuda")
        G = torch.randn(R, B - 1, K, K, device="cuda")
        hg, lgg, wg = h.float().requires_grad_(), lg.clone().requires_grad_(), [t.clone().requires_grad_() for t in w]
        fwd = graph_time_us(lambda: torch.ops.dcoco.score(h, ids, lg, embed, *w))
        bwd = graph_time_us(lambda: torch.ops.dcoco.score_backward(G, h, ids, lg, embed, *w))
        torch_fb = eager_time_us(lambda: torch.autograd.grad((baselines.score(hg, ids, lgg, embed, wg) * G).sum(),
                                                             (hg, lgg, *wg)))
        train.append({"R": R, "score_us": fwd, "backward_us": bwd, "torch_fwd_bwd_us": torch_fb})
        print(train[-1], flush=True)
    info = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "dcoco": dcoco.build_info(), "ceilings": ceil, "rows": rows, "train": train}
    Path(args.out, "gpu_bench.json").write_text(json.dumps(info, indent=2))
    print(f"\n{info['gpu']}, {info['date']}: median us per call (CUDA-graph replay)")
    print("| R | fused | torch.compile | eager reference | floor | compile/fused | eager/fused | fused/floor |")
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        e = f"{x['eager_ref_us']:.0f}" if x["eager_ref_us"] else "-"
        ef = f"{x['eager_ref_us'] / x['fused_us']:.1f}x" if x["eager_ref_us"] else "-"
        print(f"| {x['R']} | {x['fused_us']:.1f} | {x['compile_us']:.1f} | {e} | {x['floor_us']:.1f} | "
              f"{x['compile_us'] / x['fused_us']:.1f}x | {ef} | {x['fused_us'] / x['floor_us']:.1f}x |")
    print("\n| R | score | backward | backward/score | torch fwd+bwd (eager) |")
    print("|---|---|---|---|---|")
    for x in train:
        print(f"| {x['R']} | {x['score_us']:.1f} | {x['backward_us']:.1f} | {x['backward_us'] / x['score_us']:.1f}x | "
              f"{x['torch_fwd_bwd_us']:.0f} |")


if __name__ == "__main__":
    main()
