"""Extra peak memory of Corrector.score + backward on the CPU, per backend, at a training size.

  python bench/native_memory.py --out bench/results/native-memory/native_memory.json  # R=512, B=15, K=16, d=4096

Each (backend, size) runs in a fresh process: inputs and weights are made first, the peak resident set is
reset (/proc/self/clear_refs), then score + backward run; the figure is the peak minus the resident set
before. It includes what any implementation must hold: the scores, their gradient and the input and weight
gradients. For scale, the whole (R, B-1, K, K, H) float32 pre-activation tensor is reported too: the native
backend must never hold it (its budget: at most 1 GiB extra at the default size).
"""

import argparse
import json
import os
import subprocess
import sys
import time

GiB = 1 << 30


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def measure(backend: str, R: int, B: int, K: int, d: int, V: int, r: int = 128, H: int = 256) -> dict:
    """Runs in this process; call it in a fresh one (child mode below)."""
    import gc

    import torch

    import dcoco

    dcoco.set_backend(backend)
    g = torch.Generator().manual_seed(0)
    m = dcoco.Corrector(d, K, r, H)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    embed = torch.randn(V, d, generator=g).bfloat16()
    hidden = torch.randn(R, B, d, generator=g).requires_grad_()
    ids = torch.randint(0, V, (R, B, K), generator=g)
    logits = torch.randn(R, B, K, generator=g).sort(-1, descending=True).values.requires_grad_()
    G = torch.randn(R, B - 1, K, K, generator=g)
    gc.collect()
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    t = time.perf_counter()
    (m.score(hidden, ids, logits, embed) * G).sum().backward()
    seconds = time.perf_counter() - t
    peak = _status("VmHWM")
    return {"backend": backend, "R": R, "B": B, "K": K, "d": d, "V": V, "r": r, "H": H,
            "extra_peak_bytes": peak - base, "extra_peak_gib": round((peak - base) / GiB, 3),
            "preactivation_bytes": R * (B - 1) * K * K * H * 4, "seconds": round(seconds, 2),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def run_child(backend: str, size: dict) -> dict:
    code = f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import native_memory as n; " \
           f"print(json.dumps(n.measure({backend!r}, **{size!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--R", type=int, default=512)
    ap.add_argument("--B", type=int, default=15)
    ap.add_argument("--K", type=int, default=16)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--backends", default="native,fused")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    size = dict(R=args.R, B=args.B, K=args.K, d=args.d, V=args.V)
    rows = [run_child(b, size) for b in args.backends.split(",")]
    for row in rows:
        print(f"{row['backend']:>6}: extra peak {row['extra_peak_gib']:.3f} GiB for score + backward at R={row['R']} "
              f"B={row['B']} K={row['K']} d={row['d']} ({row['seconds']} s; the whole pre-activation tensor is "
              f"{row['preactivation_bytes'] / GiB:.2f} GiB)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python bench/native_memory.py " + " ".join(sys.argv[1:]), "results": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
