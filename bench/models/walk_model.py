"""The corrector's walk on an H200, two designs compared by a latency model (no GPU has run
either yet, so every constant below is stated and the result is a range, not a measurement).

(a) the serial row walk (today, cuda/stage_walk.cuh): one CTA of 256 threads per request scores only the chosen
    predecessor's row, K successors x H MLP units, at each of the B-1 dependent steps.
(b) the grid, then a walk: every transition's K x K scores computed across the GPU (tiles of one predecessor row,
    K x H terms, so R (B-1) K tiles), then per request a walk over the finished grid loaded into shared memory.

Work per MLP term, from cpp/include/dcoco/math.h (transition_terms with gelu/erf_rational), in issued thread
instructions: u+a+b (2), x/sqrt2 (1), clamp (2), t=c*c (1), the P and Q polynomials (5 + 6 FMA), c*p/q (1 + about
10 for an IEEE division), selects (2), 0.5 x (1+e) (3), the w2 FMA (1), 4 loads: about 38.

    python bench/models/walk_model.py            # prints the table, writes bench/results/walk-model/walk-model.json
"""

from __future__ import annotations

import json
from pathlib import Path

GPU = {"name": "H200 SXM", "sms": 132, "clock_ghz": 1.98, "issue_per_sm": 128}  # 4 schedulers x 32 lanes
INSTR_PER_TERM = 38
EFFICIENCY = (0.5, 1.0)  # issue efficiency: 2 warps per scheduler hide little latency (0.5) .. perfect (1.0)
SYNC_CYCLES = 60         # one __syncthreads of 8 warps
L2_CYCLES = 300          # one dependent L2 round trip
HANDOFF_US = 1.0         # a tile waiting on another CTA's counter (fence + atomic + poll), once per dependency
K, H = 16, 256           # candidates per slot, MLP hidden (docs/spec.md)
STEPS = 14               # dependent steps of the walk: 15 drafted slots, 14 transitions


def us(cycles: float) -> float:
    return cycles / (GPU["clock_ghz"] * 1e3)


def row_cycles(eff: float) -> float:
    """One CTA scoring K successors x H units on one SM."""
    return K * H * INSTR_PER_TERM / (GPU["issue_per_sm"] * eff)


def serial(R: int, eff: float) -> float:
    """(a): each request's CTA runs its 14 steps alone (R <= sms: CTAs in parallel); per step the row, the
    successors' rows fetched from L2 (partly hidden), 3 barriers and the K-wide argmax."""
    step = row_cycles(eff) + L2_CYCLES * (1 - eff) + 3 * SYNC_CYCLES + 2 * K
    waves = -(-R // GPU["sms"])
    return waves * us(STEPS * step) + HANDOFF_US


def grid(R: int, eff: float) -> float:
    """(b): R * 14 * K row tiles spread over the GPU (throughput-bound once they outnumber the SMs), one handoff,
    then the walk: the request's grid (14 K^2 floats) loaded once, 14 argmaxes of K in shared memory."""
    tiles = R * STEPS * K
    per_sm = -(-tiles // GPU["sms"])
    scores = us(per_sm * row_cycles(eff))
    walk = us(L2_CYCLES + STEPS * (K + SYNC_CYCLES))
    return scores + HANDOFF_US + walk + HANDOFF_US


def main() -> None:
    rows = []
    for R in (1, 8, 32):
        a = [serial(R, e) for e in EFFICIENCY]
        b = [grid(R, e) for e in EFFICIENCY]
        rows.append({"R": R, "serial_us": [min(a), max(a)], "grid_us": [min(b), max(b)],
                     "terms_serial": R * STEPS * K * H, "terms_grid": R * STEPS * K * K * H})
    print(f"{'R':>3} | {'(a) serial row walk, us':>24} | {'(b) grid then walk, us':>23} | MLP terms (a) / (b)")
    for r in rows:
        print(f"{r['R']:>3} | {r['serial_us'][0]:>10.1f} .. {r['serial_us'][1]:<10.1f} | "
              f"{r['grid_us'][0]:>9.1f} .. {r['grid_us'][1]:<10.1f} | {r['terms_serial']:,} / {r['terms_grid']:,}")
    out = Path("bench/results/walk-model/walk-model.json")
    out.write_text(json.dumps({"gpu": GPU, "instr_per_term": INSTR_PER_TERM, "efficiency": EFFICIENCY,
                               "sync_cycles": SYNC_CYCLES, "l2_cycles": L2_CYCLES, "handoff_us": HANDOFF_US,
                               "K": K, "H": H, "steps": STEPS, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
