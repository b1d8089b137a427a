#!/usr/bin/env bash
# Line coverage of cuda/ under the emulated tests (tests/ops/test_cuda_emulated.py, test_emulated_mma.py,
# tests/emulate): the runners are built with gcc --coverage, the tests run, gcov says which lines ran. The lines
# counted: gcov's executable lines of what the emulation compiles, plus every code line (not blank, comment,
# preprocessor or a lone brace) of what it never compiles: the launchers *.cu, the tensor-core policies sm*_*.cuh
# and code under __CUDACC__, all unexecuted until the emulation runs them.
# Prints one line per file and the total. Uses .venv from scripts/setup.sh.
# `--report DIR`: only the report, from runners a test run already built and ran in DIR with DCOCO_EMU_DIR=DIR
# DCOCO_EMU_FLAGS="-O1 --coverage -fprofile-update=single" (what .ci/run does, so the emulated tests run once).
# -fprofile-update=single: the runners are threaded, and gcc then updates every counter atomically; line coverage
# needs no exact counts, and the emulated tests take 6.2 min instead of 9.6 (2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--report" ]; then
  dir=$2
else
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  DCOCO_EMU_DIR="$dir" DCOCO_EMU_FLAGS="-O1 --coverage -fprofile-update=single" .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/ops/test_cuda_emulated.py tests/ops/test_emulated_mma.py >"$dir/pytest.log" 2>&1 || { tail -20 "$dir/pytest.log"; exit 1; }
fi
for g in "$dir"/*.gcda; do  # each runner's report in its own folder: they share header names
  out="$dir/gcov-$(basename "$g" .gcda)"
  mkdir -p "$out" && (cd "$out" && gcov -p -o "$dir" "$g" >/dev/null 2>&1 || true)
done
.venv/bin/python - "$dir" <<'PY'
import re, sys
from pathlib import Path

dir, cuda = Path(sys.argv[1]), Path("cuda").resolve()
ran: dict[str, set[int]] = {}
code: dict[str, set[int]] = {}  # gcov's executable lines of the files the emulation compiles
for g in dir.glob("gcov-*/*.gcov"):  # one per source file per runner; a line counts if any runner executed it
    src = next((ln.split("Source:", 1)[1].strip() for ln in g.read_text().splitlines() if "Source:" in ln), "")
    name = Path(src).name
    if Path(src).resolve().parent != cuda:
        continue
    for ln in g.read_text().splitlines():
        m = re.match(r"\s*([^:]+):\s*(\d+):", ln)
        if not m or m.group(2) == "0" or m.group(1).strip() == "-":
            continue
        code.setdefault(name, set()).add(int(m.group(2)))
        if m.group(1).strip() not in ("#####", "====="):
            ran.setdefault(name, set()).add(int(m.group(2)))


def code_lines(path: Path) -> set[int]:  # a file gcov never saw: every line that is neither blank, comment nor brace
    out, block = set(), False
    for i, ln in enumerate(path.read_text().splitlines(), 1):
        s = ln.strip()
        if block:
            block = "*/" not in s
            continue
        if s.startswith("/*"):
            block = "*/" not in s
            continue
        if s and not s.startswith(("//", "#")) and s not in ("{", "}", "};", "} else {", "namespace {"):
            out.add(i)
    return out


def device_only(path: Path) -> set[int]:  # code lines under #if(def) __CUDACC__ / __CUDA_ARCH__ (the GPU's side)
    out, stack, lines = set(), [], code_lines(path)
    for i, ln in enumerate(path.read_text().splitlines(), 1):
        s = ln.strip()
        if s.startswith("#if"):
            stack.append("__CUDACC__" in s or "__CUDA_ARCH" in s)
        elif s.startswith("#el") and stack:
            stack[-1] = False
        elif s.startswith("#endif") and stack:
            stack.pop()
        elif any(stack) and i in lines:
            out.add(i)
    return out


total_ran = total = 0
for f in sorted(p for p in cuda.iterdir() if p.suffix in (".cu", ".cuh")):
    lines = code.get(f.name, set()) | (device_only(f) if f.name in code else code_lines(f))
    hit = len(ran.get(f.name, set()) & lines)
    total_ran, total = total_ran + hit, total + len(lines)
    print(f"{f.name:<22}{hit:>5} / {len(lines):<5}{100 * hit / max(1, len(lines)):6.1f}%")
print(f"cuda/ line coverage under emulation: {total_ran} / {total} = {100 * total_ran / max(1, total):.1f}%")
PY
