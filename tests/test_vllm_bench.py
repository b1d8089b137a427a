"""`dcoco bench` against a real vLLM OpenAI server (vllm-cpu 0.32.0 in .venv-vllm; scripts/test_vllm.sh): the tiny
random Qwen3 target of test_vllm.py with a byte-level tokenizer and a chat template, served with its tiny DCOCO
drafter and without speculation. A run with a few rows per suite (greedy and a seed, concurrency 1 and 4) gives
tokens/s and tau from the server's real counters; a run whose server is killed midway reports the failed requests
and exits 1, and the same command after a restart redoes only those; compare joins the no-spec and DCOCO runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup_vllm.sh)")
pytest.importorskip("httpx", reason="dcoco bench needs httpx")

from test_vllm import N, V, _drafter, _target  # noqa: E402  (the tiny target and drafter)

from dcoco import serve_bench as sb  # noqa: E402
from dcoco.cli import main  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SUITES = {"gsm8k": [["Tom has 3 apples and buys 5 more. How many apples does he have?"],
                    ["A train travels 60 km in 1.5 hours. What is its average speed?"],
                    ["What is 17 times 23?"]],
          "humaneval": [["def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n"],
                        ["def is_even(n):\n    \"\"\"True when n is even.\"\"\"\n"]],
          "mt-bench": [["Write a haiku about rain.", "Now rewrite it about snow."],
                       ["Name three primes.", "Which of them is the largest?"]]}


def _tokenizer(path: Path) -> None:
    """Bytes as ids 0-255, ChatML markers, placeholders up to V: what vLLM needs to serve chat completions."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", *(f"<|x{i}|>" for i in range(V - 258))])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", chat_template=CHATML).save_pretrained(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vllm serve` (the module: vllm-cpu 0.32.0's `vllm` script fails on its own version lookup) in its own
    process group, so that a kill takes its engine process too."""

    def __init__(self, root: Path, drafter: str | None):
        self.root, self.port = root, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(root / "target"),
                    "--port", str(self.port), "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "8",
                    "--enforce-eager", "--served-model-name", "tiny", "--seed", "0"]
        if drafter:
            self.cmd += ["--speculative-config", json.dumps({"method": "dflash", "model": str(root / drafter),
                                                             "num_speculative_tokens": N})]
        self.log = root / f"serve-{drafter or 'plain'}.log"

    def start(self) -> None:
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=5)
                return
            except OSError:
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                assert time.time() < deadline, "vllm serve did not come up in 300 s"
                time.sleep(1)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_bench")
    _target(root / "target")
    _tokenizer(root / "target")
    _drafter(root / "dcoco")
    suites = root / "suites"
    suites.mkdir()
    for name, rows in SUITES.items():
        (suites / f"{name}.jsonl").write_text("".join(json.dumps({"turns": t}) + "\n" for t in rows))
    return root


@pytest.fixture(scope="module")
def spec_server(root):
    s = Server(root, "dcoco")
    s.start()
    yield s
    s.kill(signal.SIGTERM)


def _cmd(server: Server, root: Path, out: str, *extra: str) -> list[str]:
    return ["bench", "--endpoint", server.url, "--model", "tiny", "--out", str(root / out), "--suites",
            str(root / "suites"), "--no-progress", *extra]


@pytest.fixture(scope="module")
def spec_run(root, spec_server):
    t = time.time()
    assert main(_cmd(spec_server, root, "dcoco", "--rows", "2", "--max-tokens", "16", "--seeds", "greedy,42",
                     "--concurrency", "1,4")) == 0
    print(f"\nspec run: {time.time() - t:.1f} s")
    return json.loads((root / "dcoco" / "run.json").read_text())


def test_bench_on_vllm_with_dcoco(root, spec_run, spec_server):
    out = root / "dcoco"
    print((out / "table.md").read_text())
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(recs) == 3 * 2 * 2 * 2 and all(r["status"] == "ok" for r in recs)  # suites, rows, seeds, concurrency
    assert all(len(r["turns"]) == (2 if r["suite"] == "mt-bench" else 1) for r in recs)
    assert all(0 < t["tokens"] <= 16 and t["latency"] > 0 for r in recs for t in r["turns"])
    s = spec_run["summary"]
    assert s["spec"] is True and len(s["cells"]) == 3 * 2 * 2
    for c in s["cells"]:
        assert c["n_ok"] == 2 and c["tps"] > 0
        assert 1 <= c["tau"] <= 1 + N and len(c["accept_rate"]) == N  # vLLM's counters, read from /metrics
    batches = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    for b in batches:  # the real counter names: every batch drafted, accepted counted per drafted position
        assert b["counters"]["drafts"] > 0 and b["counters"]["draft_tokens"] == N * b["counters"]["drafts"]
        assert sorted(b["counters"]["per_pos"]) == [str(i) for i in range(N)]
        assert b["counters"]["accepted"] == sum(b["counters"]["per_pos"].values())
    text = urllib.request.urlopen(spec_server.url + "/metrics", timeout=30).read().decode()
    assert sb.counters(text)["drafts"] >= sum(b["counters"]["drafts"] for b in batches)
    md = (out / "table.md").read_text()
    assert "| Math | GSM8K |" in md and "| General | MT-Bench |" in md and "Throughput as concurrency grows" in md
    for p in ("tps.png", "concurrency.png"):
        assert (out / p).read_bytes()[:4] == b"\x89PNG"


def test_server_killed_midway_then_resume(root, spec_run, spec_server):
    out = root / "killed"
    cmd = [sys.executable, "-m", "dcoco.cli", *_cmd(spec_server, root, "killed", "--only", "gsm8k,humaneval",
                                                     "--rows", "all", "--max-tokens", "48", "--seeds", "greedy")]
    err = root / "killed.err"
    with err.open("w") as e:
        bench = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=e)
    deadline = time.time() + 120
    while not (out / "requests.jsonl").exists() or (out / "requests.jsonl").read_text().count('"ok"') < 2:
        assert bench.poll() is None and time.time() < deadline, err.read_text()
        time.sleep(0.05)
    spec_server.kill()  # mid-run: one answer in flight, two more to send
    assert bench.wait(120) == 1, err.read_text()
    assert "requests failed" in err.read_text() and "rerun the same command" in err.read_text()
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    ok, bad = [r["key"] for r in recs if r["status"] == "ok"], [r for r in recs if r["status"] != "ok"]
    assert len(recs) == 5 and len(ok) >= 2 and bad
    print("\nafter the kill:", *{r["error"][:80] for r in bad}, sep="\n  ")
    assert "Failed requests" in (out / "table.md").read_text()
    first = (out / "requests.jsonl").read_text().splitlines()
    spec_server.start()  # the same port: the same command resumes
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert lines[:len(first)] == first and len(lines) == len(first) + len(bad)  # only the failed ones again
    again = [json.loads(x) for x in lines[len(first):]]
    assert sorted(r["key"] for r in again) == sorted(r["key"] for r in bad) and all(r["status"] == "ok" for r in again)
    res = json.loads((out / "run.json").read_text())
    assert all(c["n_failed"] == 0 and c["tau"] is not None for c in res["summary"]["cells"])


def test_compare_no_spec_and_dcoco(root, spec_run):
    plain = Server(root, None)
    plain.start()
    try:
        assert main(_cmd(plain, root, "nospec", "--rows", "2", "--max-tokens", "16", "--seeds", "greedy,42",
                         "--concurrency", "1,4")) == 0
    finally:
        plain.kill(signal.SIGTERM)
    res = json.loads((root / "nospec" / "run.json").read_text())
    assert res["summary"]["spec"] is False and all(c["tau"] is None for c in res["summary"]["cells"])
    out = root / "cmp"
    assert main(["bench", "compare", str(root / "nospec"), str(root / "dcoco"), "--out", str(out)]) == 0
    md = (out / "compare.md").read_text()
    print("\n" + md)
    assert json.loads((out / "compare.json").read_text())["baseline"] == "nospec"
    assert "×)" in md and (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"
