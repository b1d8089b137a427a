"""`dcoco bench` against a real vLLM OpenAI server (vllm-cpu 0.32.0 in .venv-vllm; scripts/test_vllm.sh): the tiny
random Qwen3 target of test_vllm.py with a byte-level tokenizer and a chat template, served with its tiny DCOCO
drafter and without speculation. A run with a few rows per suite (greedy and a seed, concurrency 1 and 4) gives
tokens/s and tau from the server's real counters; a run whose server is killed midway reports the failed requests
and exits 1, and the same command after a restart redoes those and the ones no counters measured; compare joins the
no-spec and DCOCO runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup_vllm.sh)")
pytest.importorskip("httpx", reason="dcoco bench needs httpx")

from helpers.tiny_vllm import N, SUITES, make_drafter, make_target, make_tokenizer

from dcoco.benchmark import client as sb
from dcoco.cli import main
from dcoco.testing.vllm_server import VLLMServer

class Server(VLLMServer):
    """The tiny target served as "tiny", with a drafter (or none); start() again after a kill: the same port."""

    def __init__(self, root: Path, drafter: str | None):
        super().__init__(root / "target", drafter and root / drafter, N, log=root / f"serve-{drafter or 'plain'}.log",
                         name="tiny", max_model_len=512, max_num_seqs=8, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                         timeout=300)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_bench")
    make_target(root / "target")
    make_tokenizer(root / "target")
    make_drafter(root / "dcoco")
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


class Gate:
    """An HTTP proxy in front of a server: it passes `answers` chat completions, then answers every request with
    503, as a dead server would (its /metrics too), until opened again. A run that loses its server midway, at a
    point the test chooses instead of a point a race chooses."""

    def __init__(self, upstream: str, answers: int):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.upstream, self.answers = upstream, answers
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def _pass(self):
                with gate.lock:
                    chat = self.path.startswith("/v1/chat/")
                    shut = gate.answers <= 0
                    if chat and not shut:
                        gate.answers -= 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                if shut:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = urllib.request.Request(gate.upstream + self.path, body, method=self.command,
                                             headers={"Content-Type": self.headers.get("Content-Type", "")})
                try:
                    with urllib.request.urlopen(req, timeout=600) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _pass

            def log_message(self, *args):
                pass

        self.lock = threading.Lock()
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def open(self) -> None:
        with self.lock:
            self.answers = 10 ** 9


def test_server_lost_midway_then_resume(root, spec_run, spec_server):
    """The server dies right after the 3rd GSM8K answer, before that batch's counters are read: GSM8K's answers are
    all in, but no counters measured them; HumanEval's requests fail. The same command against a restarted server
    (counters from zero) sends HumanEval's requests and GSM8K's again, and every cell gets a tau."""
    gate = Gate(spec_server.url, answers=1 + 3)  # dcoco bench's check request, then GSM8K's three rows
    out = root / "killed"
    cmd = [sys.executable, "-m", "dcoco.cli", "bench", "--endpoint", gate.url, "--model", "tiny", "--out", str(out),
           "--suites", str(root / "suites"), "--no-progress", "--only", "gsm8k,humaneval", "--rows", "all",
           "--max-tokens", "48", "--seeds", "greedy"]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 1, first.stderr
    assert "requests failed" in first.stderr and "rerun the same command" in first.stderr
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert [(r["suite"], r["status"] == "ok") for r in recs] == [("gsm8k", True)] * 3 + [("humaneval", False)] * 2
    assert [b["counters"] for b in (json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines())] == \
        [None, None]  # /metrics was gone when each batch ended
    assert "Failed requests" in (out / "table.md").read_text()
    spec_server.kill()
    spec_server.start()  # the same port, counters from zero
    gate.open()
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 5 + 5 and [json.loads(x) for x in lines[:5]] == recs  # appended, never rewritten
    assert all(json.loads(x)["status"] == "ok" for x in lines[5:])
    res = json.loads((out / "run.json").read_text())
    assert [(c["suite"], c["n_failed"]) for c in res["summary"]["cells"]] == [("gsm8k", 0), ("humaneval", 0)]
    assert all(c["tau"] is not None and 1 <= c["tau"] <= 1 + N for c in res["summary"]["cells"])
    third = subprocess.run(cmd, capture_output=True, text=True)  # nothing left: nothing is sent
    assert third.returncode == 0 and len((out / "requests.jsonl").read_text().splitlines()) == 10


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
