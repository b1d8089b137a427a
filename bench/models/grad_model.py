"""The CUDA backward of dcoco.score (cuda/score_grad.cuh) on an H200, by a traffic and FLOP model
(no GPU has run either design: every constant below is stated and the result is a roofline, not a measurement).

Three designs at one training shape (R anchors x B slots x K candidates, fp32 weights, bf16 hidden and embed),
under the JSON keys today, new and forward:
  per-slot     (key today) a backward with one CTA per slot re-reading every weight, thread-per-element outer
               sums over all rows, serial column sums and b2 summed by one thread: the straightforward design,
               modelled as the baseline the GEMM-shaped one is compared with;
  GEMM-shaped  (key new) the backward cuda/score_grad.cuh implements (tile_gemm<SimtMma> with loaders/epilogues;
               weight gradients split over row spans with ordered partial reductions; column sums as block
               reductions);
  forward      the fused forward dcoco.score runs (cuda/fused_forward.cuh stages 1-3: projections, fuse, the
               grid; no table, no walk), its tile counts from cuda/plan.cuh's plan_of; 16-bit inputs take the
               tensor cores.

Per kernel: DRAM bytes two ways, and the roofline time
  no-reuse  every tile (CTA) reads its operands from DRAM: A once per n-tile, B once per m-tile (the pessimistic
            assumption: L2 does not hold operands re-read across CTAs);
  L2        compulsory DRAM traffic only (each distinct operand once), re-reads served by L2 at L2_BW. Justified
            for the GEMMs' shared operands: the weights are 8.4 MB and every weight operand <= 6.3 MB (H200 L2:
            50 MB), and tiles sharing an operand are adjacent in launch order (cuda/score_grad.cuh output_tile,
            weight_gemm_kernel), so they are resident at the same time.
  time = max(bytes / bandwidth, FLOPs / peak, issued instructions / issue rate, serial dependency chains), summed
  over kernels, plus LAUNCH_US per launch (back-to-back launches on one stream, no graph).

    python bench/models/grad_model.py            # prints the table, writes bench/results/grad-model/grad-model.json
"""

from __future__ import annotations

import json
from pathlib import Path

SHAPE = {"R": 512, "B": 16, "K": 16, "d": 4096, "r": 128, "H": 256}
GPU = {"name": "H200 SXM", "sms": 132, "clock_ghz": 1.98, "hbm_tbs": 4.8, "l2_tbs": 10.0, "l2_mb": 50,
       "fp32_tflops": 67.0,     # non-tensor FP32 (an FMA is 2 FLOPs)
       "bf16_tc_tflops": 989.0,  # dense bf16 tensor cores (the forward's 16-bit projections)
       "issue_per_sm": 128}     # 4 schedulers x 32 lanes: thread instructions per cycle
L2_BW_NOTE = "L2 bandwidth is not published for the H200; 10 TB/s is an assumption (about 2x HBM)"
FADD_CYCLES = 4       # dependent float add/FMA latency: a serial chain of n adds takes 4 n cycles
THREADS_PER_SM = 2048
LAUNCH_US = 2.0       # per kernel launch on one stream
INSTR_FWD_TERM = 38   # a forward MLP term (bench/models/walk_model.py: u+a+b, gelu via erf_rational, the w2 FMA, loads)
INSTR_BWD_TERM = 75   # one backward term, transition_unit_grad: gelu and gelu_grad (erf shared after inlining,
#                       exp_nonpos ~15), 3 products, 3 accumulations, 2 loads
LOCAL_BYTES_PER_TERM = 8  # per-slot: dsucc[64] lives in local memory: one load + one store of 4 bytes per term
KBM, KBN, KBK = 64, 128, 32  # cuda/plan.cuh
GRAD_CTAS, MIN_SPAN, COL_ROWS = 264, 256, 256  # cuda/score_grad.cuh

R, B, K, d, r, H = (SHAPE[k] for k in ("R", "B", "K", "d", "r", "H"))
S, C, Tn, IN = R * B, R * B * K, R * (B - 1), 3 * r + 2
F32, BF16 = 4, 2
CLOCK = GPU["clock_ghz"] * 1e9
ISSUE = GPU["sms"] * GPU["issue_per_sm"] * CLOCK
WAVE = GPU["sms"] * THREADS_PER_SM
LABELS = {"today": "per-slot backward", "new": "GEMM-shaped backward", "forward": "fused forward"}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kernel(name, noreuse, compulsory, flops=0.0, tc_flops=0.0, instr=0.0, serial_s=0.0, launches=1, grid=None):
    return {"kernel": name, "grid": grid, "dram_noreuse_gb": noreuse / 1e9, "dram_compulsory_gb": compulsory / 1e9,
            "gflops_fp32": flops / 1e9, "gflops_tc": tc_flops / 1e9, "ginstr": instr / 1e9, "serial_ms": serial_s * 1e3,
            "launches": launches}


def gemm(name, M, N, Kd, ea, eb, out_bytes, a_distinct=None, b_distinct=None, tc=False):
    """acc (M,N) = A (M,Kd) B (N,Kd)^T in (KBM,KBN) tiles: A read once per n-tile, B once per m-tile."""
    mt, nt = cdiv(M, KBM), cdiv(N, KBN)
    a, b = M * Kd * ea, N * Kd * eb
    a_distinct = a if a_distinct is None else a_distinct
    b_distinct = b if b_distinct is None else b_distinct
    f = 2.0 * M * N * Kd
    return kernel(name, nt * a + mt * b + out_bytes, a_distinct + b_distinct + out_bytes,
                  flops=0 if tc else f, tc_flops=f if tc else 0, grid=f"{mt}x{nt}")


def timing(k: dict) -> dict:
    hbm, l2 = GPU["hbm_tbs"] * 1e12, GPU["l2_tbs"] * 1e12
    compute = max(k["gflops_fp32"] * 1e9 / (GPU["fp32_tflops"] * 1e12)
                  + k["gflops_tc"] * 1e9 / (GPU["bf16_tc_tflops"] * 1e12),
                  k["ginstr"] * 1e9 / ISSUE, k["serial_ms"] / 1e3)
    k["ms_noreuse"] = 1e3 * max(k["dram_noreuse_gb"] * 1e9 / hbm, compute)
    k["ms_l2"] = 1e3 * max(k["dram_compulsory_gb"] * 1e9 / hbm, k["dram_noreuse_gb"] * 1e9 / l2, compute)
    return k


# -------------------------------------------------------------------------------------------------------- per-slot
def per_slot() -> list[dict]:
    ks = []
    W_slot, W_cand, W_fuse, W1_ab, W1_s = 3 * r * d * F32, r * d * F32, 2 * r * r * F32, 2 * H * r * F32, H * r * F32
    # 1. grad_forward_kernel, a CTA per slot: (3+K) r d-wide warp dots, then the r-wide work per thread
    per = (3 + K) * r * d * F32 + d * BF16 + K * d * BF16 + W_fuse + W1_ab + (3 * r + 3 * K * r + 2 * K * H) * F32
    comp = W_slot + W_cand + W_fuse + W1_ab + S * d * BF16 + C * d * BF16 + (S * 3 * r + 3 * C * r + 2 * C * H) * F32
    fl = S * (2.0 * (3 + K) * r * d + 2 * r * r + 2 * K * r * r + 4 * K * H * r)
    ks.append(kernel("grad_forward (per slot)", S * per, comp, flops=fl, grid=f"{S}"))
    # 2. grad_transition_kernel, a CTA per transition: u = W1_s s re-reads W1_s per transition; K^2 H terms
    per = W1_s + (2 * r + 2 * K * H + K * K + 2 * K * H + r + 2 * H) * F32
    comp = W1_s + (2 * S * r + 2 * C * H + Tn * K * K + 2 * C * H + Tn * (r + 2 * H)) * F32
    terms = Tn * K * K * H
    k = kernel("grad_transition (per transition)", Tn * per, comp, flops=2.0 * Tn * H * r,
               instr=terms * (INSTR_BWD_TERM + 2), grid=f"{Tn}")
    k["local_memory_gb"] = terms * LOCAL_BYTES_PER_TERM / 1e9  # dsucc[64] spilled: L1/L2 traffic, not in DRAM bytes
    ks.append(k)
    # 3. grad_slot_kernel, a CTA per slot: re-reads W1 (dz, dP/dQ), W_fuse and all d-wide weights (d_hidden)
    per = (2 * K * H + 2 * H) * F32 + W1_ab + W1_s + W_fuse + W_slot + 2 * H * 32 + (3 * K * r + 4 * r + d + K) * F32
    comp = (2 * C * H + 2 * Tn * H) * F32 + W1_ab + W1_s + W_fuse + W_slot + (3 * C * r + 4 * S * r + S * d + C) * F32
    fl = S * (4.0 * K * H + 4 * K * r * H + 2 * K * r * r + 2 * r * r + 4 * H * r + 6 * r * d)
    ks.append(kernel("grad_slot (per slot)", S * per, comp, flops=fl, grid=f"{S}"))
    # 4. outer_sum_kernel x 11: a thread per gradient element, each summing all M rows in order
    sums = [("W_cand", C, r, d, BF16), ("W_ctx", S, r, d, BF16), ("W_fuse_b", C, r, r, F32), ("W_fuse_g", S, r, r, F32),
            ("W_pair_L", S, r, d, BF16), ("W_pair_R", S, r, d, BF16), ("W1_s", Tn, H, r, F32), ("W1_a", C, H, r, F32),
            ("W1_b", C, H, r, F32), ("w_la", C, H, 1, F32), ("w_lb", C, H, 1, F32)]
    nor = com = fl = ser = 0.0
    for _, M, N, Kd, ex in sums:
        blocks = cdiv(N * Kd, 256)
        per_block_n = max(1, 256 // Kd)
        nor += blocks * M * (min(Kd, 256) * ex + max(32, 4 * per_block_n)) + N * Kd * F32
        com += M * Kd * ex + M * N * F32 + N * Kd * F32
        fl += 2.0 * M * N * Kd
        ser += cdiv(N * Kd, WAVE) * M * FADD_CYCLES / CLOCK
    ks.append(kernel("outer_sum x11 (thread per element)", nor, com, flops=fl, serial_s=ser, launches=11,
                     grid="N*Kd/256 each"))
    # 5. column_sum_kernel: r + H + 1 threads, each a serial chain over its rows; b2 by one thread
    nb = (2 * C * r + 2 * Tn * H + Tn * K * K) * F32
    ser = max(C, Tn, Tn * K * K) * FADD_CYCLES / CLOCK
    ks.append(kernel("column_sum (b2: one thread)", nb, nb, serial_s=ser, grid=f"{cdiv(r + H + 1, 256)}"))
    return ks


# ----------------------------------------------------------------------------------------------------- GEMM-shaped
def split_of(N, Kd, M):
    mt, nt = cdiv(N, KBM), cdiv(Kd, KBN)
    want = min(cdiv(GRAD_CTAS, mt * nt), cdiv(M, MIN_SPAN))
    span = cdiv(cdiv(M, want), KBK) * KBK
    return mt, nt, cdiv(M, span)


def weight_gemm(name, N, Kd, M, eD, eX):
    """G (N,Kd) = D (M,N)^T X (M,Kd): tiles (mt, nt, splits); D read per n-tile, X per m-tile; partials."""
    mt, nt, splits = split_of(N, Kd, M)
    part = splits * N * Kd * F32
    f = 2.0 * M * N * Kd
    g = kernel(f"wgrad {name}", nt * M * N * eD + mt * M * Kd * eX + part, M * N * eD + M * Kd * eX + part, flops=f,
               grid=f"{mt}x{nt}x{splits}")
    red = kernel(f"  reduce {name}", part + N * Kd * F32, part + N * Kd * F32, serial_s=splits * FADD_CYCLES / CLOCK,
                 grid=f"{cdiv(N * Kd, 256)}")
    return [g, red]


def column_sum(name, rows, cols, bytes_per_elem):
    chunks, cb = cdiv(rows, COL_ROWS), cdiv(cols, 32)
    nb = rows * cols * bytes_per_elem + chunks * cols * F32
    ser = (COL_ROWS // 8 + 8 + chunks * (cols if name == "b2" else 1)) * FADD_CYCLES / CLOCK
    return kernel(f"colsum {name}", nb, nb, serial_s=ser, launches=2, grid=f"{cb}x{chunks} + reduce")


def gemm_shaped() -> list[dict]:
    ks = [gemm("slot_proj [g|P|Q]", S, 3 * r, d, BF16, F32, S * 3 * r * F32),
          gemm("cand_proj b", C, r, d, BF16, F32, C * r * F32),
          kernel("ln_inputs", 2 * (S + C) * r * F32, 2 * (S + C) * r * F32, grid=f"{cdiv(S + C, 256)}"),
          gemm("fuse zc = [b^;g^] W_fuse^T", C, r, 2 * r, F32, F32, C * r * F32, a_distinct=(C + S) * r * F32),
          kernel("ln_fuse", 3 * C * r * F32, 3 * C * r * F32, grid=f"{cdiv(C, 256)}")]
    ks[3]["dram_noreuse_gb"] -= (C - S) * r * F32 / 1e9  # the g^ half: a tile's 64 rows share 64/K slots' rows
    ks.append(gemm("pred_succ", C, 2 * H, r, F32, F32, 2 * C * H * F32 + C * BF16))
    ks.append(gemm("pair u", Tn, H, r, 2 * F32, F32, Tn * H * F32, a_distinct=2 * S * r * F32))
    terms = Tn * K * K * H
    tb = Tn * (H + 2 * K * H + K * K + 2 * K * H + 2 * H + 2 * K) * F32
    ks.append(kernel("transition", tb, tb, instr=terms * INSTR_BWD_TERM, grid=f"{Tn}"))
    ks += [gemm("dz = [dpred|dsucc] W1_ab", C, r, 2 * H, F32, F32, 2 * C * r * F32),
           kernel("ln_z_grad + d_logits", (3 * C * r + C * K + 3 * C) * F32,
                  (3 * C * r + 3 * C) * F32 + Tn * K * K * F32, grid=f"{cdiv(C, 256)}"),
           gemm("db = dzc W_fuse_b", C, r, r, F32, F32, C * r * F32),
           kernel("ln_b_grad + dzs", (4 * C * r + S * r) * F32, (4 * C * r + S * r) * F32,
                  grid=f"{cdiv(C + S * r, 256)}"),
           gemm("dg = dzs W_fuse_g", S, r, r, F32, F32, S * r * F32),
           gemm("ds = du W1_s", Tn, r, H, F32, F32, Tn * r * F32),
           kernel("ln_g_grad", 3 * S * r * F32, 3 * S * r * F32, grid=f"{cdiv(S, 256)}"),
           gemm("d_hidden = [dgc|dP|dQ] W_slot", S, d, 3 * r, F32, F32, S * d * F32)]
    for args in [("W_cand", r, d, C, F32, BF16), ("W_ctx|W_pair", 3 * r, d, S, F32, BF16),
                 ("W_fuse_b", r, r, C, F32, F32), ("W_fuse_g", r, r, S, F32, F32), ("W1_s", H, r, Tn, F32, F32),
                 ("W1_a|W1_b", 2 * H, r, C, F32, F32)]:
        ks += weight_gemm(*args)
    ks += [column_sum("gamma", C, r, 2 * F32), column_sum("beta", C, r, F32), column_sum("b1", Tn, H, F32),
           column_sum("w2", Tn, H, F32), column_sum("w_la", C, H, F32), column_sum("w_lb", C, H, F32),
           column_sum("b2", Tn * K, K, F32)]
    return ks


# ------------------------------------------------------------------------------------------------------ forward
def forward() -> list[dict]:
    """cuda/fused_forward.cuh, one launch; tiles by cuda/plan.cuh plan_of (sms = 132, no table, scores, no walk)."""
    s_mt, s_nt, c_mt, c_nt = cdiv(S, KBM), cdiv(3 * r, KBN), cdiv(C, KBM), cdiv(r, KBN)
    kblocks, tiles = cdiv(d, KBK), s_mt * s_nt + c_mt * c_nt
    want = min(cdiv(2 * GPU["sms"], tiles), max(kblocks // 4, 1))
    ksplit = cdiv(kblocks, cdiv(kblocks, want))
    G = KBM // K if K <= KBM else 1
    groups, g_nt = cdiv(S, G), cdiv(2 * H, KBN)
    ks = []
    slot = gemm("stage 1 slot tiles", S, 3 * r, d, BF16, F32, ksplit * S * 3 * r * F32, tc=True)
    cand = gemm("stage 1 cand tiles", C, r, d, BF16, F32, ksplit * C * r * F32, tc=True)
    for k, m in ((slot, f"{s_mt}x{s_nt}x{ksplit}"), (cand, f"{c_mt}x{c_nt}x{ksplit}")):
        k["grid"] = m
        ks.append(k)
    # stage 2, per (group of G slots, kBN columns of [pred|succ]): partials, LNs, z by wdot (SIMT), pq, the GEMM
    rows = G * K
    per = (ksplit * (G * 3 * r + rows * r) + 2 * r * r + KBN * r + rows * KBN + G * KBN) * F32 + rows * BF16
    comp = ksplit * (S * 3 * r + C * r) * F32 + 2 * r * r * F32 + 2 * H * r * F32 + (2 * C * H + S * 2 * H) * F32
    simt = groups * g_nt * (2.0 * rows * r * r + 2 * G * r * r + 2 * G * KBN * r)
    tc = groups * g_nt * 2.0 * rows * KBN * r * 2  # A (z, fp32) split into 2 bf16 planes
    ks.append(kernel("stage 2 fuse tiles", groups * g_nt * per, comp, flops=simt, tc_flops=tc, grid=f"{groups}x{g_nt}"))
    # stage 3, per transition: u from pq, K^2 scores of H terms
    per = (2 * 2 * H + 2 * K * H + H + K + K * K) * F32
    ks.append(kernel("stage 3 score tiles", Tn * per, Tn * per, instr=Tn * K * K * H * INSTR_FWD_TERM, grid=f"{Tn}"))
    ks[-1]["launches"] = 0
    for k in ks[1:]:
        k["launches"] = 0  # one launch for all stages
    return ks


def total(ks: list[dict]) -> dict:
    n = sum(k["launches"] for k in ks)
    return {"dram_noreuse_gb": sum(k["dram_noreuse_gb"] for k in ks),
            "dram_compulsory_gb": sum(k["dram_compulsory_gb"] for k in ks),
            "gflops_fp32": sum(k["gflops_fp32"] for k in ks), "gflops_tc": sum(k["gflops_tc"] for k in ks),
            "launches": n, "ms_noreuse": sum(k["ms_noreuse"] for k in ks) + n * LAUNCH_US / 1e3,
            "ms_l2": sum(k["ms_l2"] for k in ks) + n * LAUNCH_US / 1e3}


def main() -> None:
    designs = {"today": per_slot(), "new": gemm_shaped(), "forward": forward()}  # the JSON's keys
    out = {"shape": SHAPE, "gpu": GPU, "l2_bw_note": L2_BW_NOTE, "fadd_cycles": FADD_CYCLES, "launch_us": LAUNCH_US,
           "instr_fwd_term": INSTR_FWD_TERM, "instr_bwd_term": INSTR_BWD_TERM, "designs": {}, "totals": {}}
    for name, ks in designs.items():
        ks = [timing(k) for k in ks]
        out["designs"][name], out["totals"][name] = ks, total(ks)
        print(f"\n== {LABELS[name]} ==")
        print(f"{'kernel':<36} {'grid':>16} {'DRAM GB':>9} {'(L2)':>7} {'GF fp32':>8} {'GF tc':>6} {'Ginstr':>7}"
              f" {'ms':>8} {'ms(L2)':>7}")
        for k in ks:
            print(f"{k['kernel']:<36} {str(k['grid']):>16} {k['dram_noreuse_gb']:>9.2f} {k['dram_compulsory_gb']:>7.2f}"
                  f" {k['gflops_fp32']:>8.1f} {k['gflops_tc']:>6.1f} {k['ginstr']:>7.1f} {k['ms_noreuse']:>8.2f}"
                  f" {k['ms_l2']:>7.2f}")
        t = out["totals"][name]
        print(f"{'total (+ ' + str(t['launches']) + ' launches)':<36} {'':>16} {t['dram_noreuse_gb']:>9.2f}"
              f" {t['dram_compulsory_gb']:>7.2f} {t['gflops_fp32']:>8.1f} {t['gflops_tc']:>6.1f} {'':>7}"
              f" {t['ms_noreuse']:>8.2f} {t['ms_l2']:>7.2f}")
    T, f = out["totals"], out["totals"]["forward"]
    out["ratios"] = {k: {"vs_forward_noreuse": T[k]["ms_noreuse"] / f["ms_noreuse"],
                         "vs_forward_l2": T[k]["ms_l2"] / f["ms_l2"]}
                     for k in ("today", "new")}
    out["ratios"]["today_over_new"] = {"noreuse": T["today"]["ms_noreuse"] / T["new"]["ms_noreuse"],
                                       "l2": T["today"]["ms_l2"] / T["new"]["ms_l2"]}
    print("\nbackward / forward (target <= 3):")
    for k in ("today", "new"):
        r_ = out["ratios"][k]
        print(f"  {LABELS[k]:<20} {r_['vs_forward_noreuse']:7.1f}x (no reuse)   {r_['vs_forward_l2']:7.1f}x (L2)")
    print(f"  per-slot / GEMM-shaped: {out['ratios']['today_over_new']['noreuse']:.1f}x (no reuse), "
          f"{out['ratios']['today_over_new']['l2']:.1f}x (L2)")
    path = Path("bench/results/grad-model/grad-model.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
