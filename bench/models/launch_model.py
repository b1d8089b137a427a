"""What a GPU would see of the corrector, counted here and projected onto an H200 (no GPU has run it yet: the
counts are exact, the latencies a model with every constant stated below).

Counted (dcoco.ops.launches on the meta device: every kernel-launching aten op, and the bytes its tensors hold) at
d=4096, B=15, K=16, V=151,936, R = 1, 8, 32 requests, with bf16 hidden states and logits as vLLM hands them:
  native forward   Corrector.forward after prepare_inference (the grid, then the walk by pointer doubling);
  native hook      the whole compute_logits hook (dcoco.serve.hook.on_logits): top-K, the corrector, the hand-back;
  native global    the hook's corrector under selection "global" (grid + max-plus scan), for the path rules;
  native hook, grid fused  the lever for large R, modelled: the grid's elementwise chain as one kernel (what
                   torch.compile makes of it), so the (R,B-1,K,K,H) pre-activations never reach HBM;
  fused hook       the same hook on the fused kernel: top-K, the logits' upcast, the workspace's counter memset
                   (added by hand: the meta device runs the op's fake, which allocates nothing), one kernel, the
                   hand-back; the kernel's time from bench/models/walk_model.py's design for that R plus its bytes;
  DFlash           plain DFlash's own selection, one argmax over the logits (what the hook adds to).
Projected per op, summed (a stream runs its kernels one after another):
  eager   max(LAUNCH_EAGER_US, GPU time): the host's dispatch and launch bound small kernels;
  graph   max(GRAPH_NODE_US, GPU time): a CUDA graph replays the same kernels without the host;
  GPU time = bytes / HBM_TBS (an op reads its inputs and writes its outputs once) + GEMM FLOPs / FP32_TFLOPS.

    python bench/models/launch_model.py          # prints the table, writes bench/results/launch-model/launch-model.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import dcoco
from dcoco.serve import hook
from dcoco.ops.launches import count

sys.path.insert(0, str(Path(__file__).parent))
import walk_model

D, B, K, V, R_ALL = 4096, 15, 16, 151_936, (1, 8, 32)
LAUNCH_EAGER_US = (4.0, 6.0)  # PyTorch eager: dispatch + cudaLaunchKernel per op, host-bound for small kernels
GRAPH_NODE_US = (1.0, 2.0)    # one kernel node of a replayed CUDA graph, launch to completion of a tiny kernel
HBM_TBS = 3.5                 # achievable HBM3e bandwidth on an H200 (4.8 TB/s peak)
FP32_TFLOPS = 40.0            # achievable fp32 GEMM (67 peak; PyTorch keeps TF32 off for fp32 matmuls by default)
BUDGET_US = {"DCOCO paper (3-4% of a Qwen3-8B draft-verify cycle, B200)": (160.0, 220.0),
             "DFlash2 selector in vLLM (about 1.3%)": (70.0, 70.0)}
GEMMS = {"mm", "addmm", "bmm", "baddbmm"}


class _Shapes(torch.utils._python_dispatch.TorchDispatchMode):
    """(M, N, K) of every GEMM, in op order (0s for other ops), to price their FLOPs."""

    def __init__(self):
        super().__init__()
        self.mnk = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in GEMMS:
            a, b = args[-2], args[-1]
            self.mnk.append((a.shape[-2], b.shape[-1], a.shape[-1]))
        return func(*args, **(kwargs or {}))


def measured(fn, *args) -> dict:
    """Launches, bytes and GEMM FLOPs of fn(*args), one dict per launching op kept for the projection."""
    with torch.no_grad(), _Shapes() as shapes:  # no_grad: composite ops show the kernels they run
        _, c = count(fn, *args)
    assert c.syncs == 0, c.ops
    gemm = iter(shapes.mnk)
    ops = []
    for op, b in zip(c.ops, c.bytes):
        m, n, k = next(gemm) if op in GEMMS else (0, 0, 0)
        ops.append({"op": op, "bytes": b, "flops": 2.0 * m * n * k})
    return {"launches": c.count, "bytes": c.total_bytes, "ops": ops}


def project(ops: list[dict], floor: float) -> float:
    return sum(max(floor, o["bytes"] / (HBM_TBS * 1e6) + o["flops"] / (FP32_TFLOPS * 1e6)) for o in ops)


def inputs(R: int):
    return (torch.empty(R * B, D, device="meta", dtype=torch.bfloat16),
            torch.empty(R * B, V, device="meta", dtype=torch.bfloat16))


def fused_kernel_us(R: int) -> tuple[tuple[float, float], int]:
    """The one fused launch, (its time range, its bytes): its walk (bench/models/walk_model.py's design at this R) plus
    its bytes (bf16 hidden, the gathered table rows, ids and logits, the weights, the outputs)."""
    r, H = 128, 256
    weights = 4 * (r * D + 2 * r * D + 2 * r * r + H * (3 * r + 2))
    moved = R * B * (D * 2 + K * (r * 4 + 12) + 16) + weights
    walk = [walk_model.grid(R, e) if R <= 6 else walk_model.serial(R, e) for e in walk_model.EFFICIENCY]
    return (min(walk) + moved / (HBM_TBS * 1e6), max(walk) + moved / (HBM_TBS * 1e6)), moved


def fuse_grid(case: dict, R: int) -> dict:
    """The lever for the native path at larger R: the grid's elementwise chain (the (R,B-1,K,K,H) add, the GELU,
    the dot with W2 and the logits' add) as one kernel, as torch.compile's inductor would emit it: it reads the
    (R,B-1,K,H) predecessor and successor terms and writes the scores, so the H-wide grid never reaches HBM."""
    ops = case["ops"]
    i = next(j for j, o in enumerate(ops) if o["op"] == "gelu_") - 1  # the big add feeding the GELU
    terms = 2 * R * (B - 1) * K * 256 * 4 + R * (B - 1) * K * K * 4 * 2  # pred + succ read, scores (+ logits)
    merged = {"op": "grid_fused", "bytes": terms, "flops": ops[i + 2]["flops"]}
    rest = ops[:i] + [merged] + ops[i + 4:]
    return {"launches": len(rest), "bytes": sum(o["bytes"] for o in rest), "ops": rest}


def main() -> None:
    with dcoco.use_backend("native"):
        m = dcoco.Corrector(D).to("meta").requires_grad_(False)
        embed = torch.empty(V, D, device="meta")
        m.prepare_inference(embed)
    rows = []
    for R in R_ALL:
        hidden, logits = inputs(R)
        h3, ids, lg = hidden.view(R, B, D), torch.empty(R, B, K, dtype=torch.int64, device="meta"), \
            torch.empty(R, B, K, device="meta")
        greedy = hook.rows(lambda h, i, v: hook.tokens(m, embed, "greedy", h, i, v), B)
        with dcoco.use_backend("native"):
            cases = {"native forward": measured(m, h3, ids, lg, embed),
                     "native hook": measured(hook.on_logits, greedy, hidden, logits, K, False),
                     "native global": measured(hook.tokens, m, embed, "global", h3, ids, lg)}
        with dcoco.use_backend("fused"):
            fused = measured(hook.on_logits, greedy, hidden, logits, K, False)
        cases["native hook, grid fused"] = fuse_grid(cases["native hook"], R)
        kernel, kernel_bytes = fused_kernel_us(R)
        fused["ops"] = [o for o in fused["ops"] if o["op"] != "correct"]
        fused["launches"] += 1  # the counters' memset
        fused["bytes"] = sum(o["bytes"] for o in fused["ops"]) + kernel_bytes
        cases["fused hook"] = fused
        cases["DFlash"] = measured(lambda x: x.argmax(-1), logits)
        for name, c in cases.items():
            eager = [project(c["ops"], f) for f in LAUNCH_EAGER_US]
            graph = [project(c["ops"], f) for f in GRAPH_NODE_US]
            if name == "fused hook":  # + the memset node and the kernel itself
                eager = [e + f + k for e, f, k in zip(eager, LAUNCH_EAGER_US, kernel)]
                graph = [g + f + k for g, f, k in zip(graph, GRAPH_NODE_US, kernel)]
            rows.append({"R": R, "path": name, "launches": c["launches"], "mbytes": c["bytes"] / 1e6,
                         "eager_us": eager, "graph_us": graph})
    print(f"d={D}, B={B}, K={K}, V={V:,}; H200 model: eager {LAUNCH_EAGER_US} us/op, graph {GRAPH_NODE_US} us/node, "
          f"{HBM_TBS} TB/s, {FP32_TFLOPS} TFLOPS fp32")
    print(f"{'R':>3} | {'path':<24} | {'launches':>8} | {'MB moved':>9} | {'eager, us':>15} | {'CUDA graph, us':>15}")
    for r in rows:
        print(f"{r['R']:>3} | {r['path']:<24} | {r['launches']:>8} | {r['mbytes']:>9.1f} | "
              f"{r['eager_us'][0]:>6.0f} .. {r['eager_us'][1]:<6.0f} | "
              f"{r['graph_us'][0]:>6.0f} .. {r['graph_us'][1]:<6.0f}")
    for name, (lo, hi) in BUDGET_US.items():
        print(f"budget: {name}: {lo:.0f}-{hi:.0f} us")
    out = Path(__file__).parents[1] / "results" / "launch-model" / "launch-model.json"
    out.write_text(json.dumps({"shape": {"d": D, "B": B, "K": K, "V": V}, "launch_eager_us": LAUNCH_EAGER_US,
                               "graph_node_us": GRAPH_NODE_US, "hbm_tbs": HBM_TBS, "fp32_tflops": FP32_TFLOPS,
                               "budget_us": BUDGET_US, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
