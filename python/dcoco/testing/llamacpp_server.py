"""llama.cpp's llama-server (scripts/build_llamacpp.sh): started on a free port, waited for until /health answers,
stopped. Used by tests/serve/test_llamacpp.py and bench/llamacpp_serving.py.

    server = LlamaServer(binary, target, draft=d, n_max=7)
    server.complete(ids, 32); server.counters(); server.close()"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx


class LlamaServer:
    """llama-server for target (a GGUF), drafting with draft (a DFlash GGUF, n_max tokens a round) when given; one
    slot per parallel request, every core, /metrics on."""

    def __init__(self, binary: Path, target: Path, draft: Path | None = None, n_max: int = 7, parallel: int = 1):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        args = [str(binary), "-m", str(target), "--port", str(port), "-np", str(parallel), "-c", str(4096 * parallel),
                "--metrics", "-t", str(os.cpu_count() or 1)]
        if draft is not None:
            args += ["-md", str(draft), "--spec-type", "draft-dflash", "--spec-draft-n-max", str(n_max)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        raise RuntimeError(f"llama-server did not start: {self.proc.stdout.read()[-3000:] if self.proc.stdout else ''}")

    def complete(self, ids: list[int], n: int, ignore_eos: bool = False) -> dict:
        """Greedy completion of the token ids: the server's JSON (tokens, tokens_predicted, ...)."""
        r = httpx.post(f"{self.url}/completion", timeout=600, json={
            "prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1, "cache_prompt": False,
            "return_tokens": True, "ignore_eos": ignore_eos})
        r.raise_for_status()
        return r.json()

    def counters(self) -> dict[str, float]:
        """/metrics' llamacpp: counters, by name without the prefix."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {line.split()[0].split(":")[1]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("llamacpp:") and " " in line}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
