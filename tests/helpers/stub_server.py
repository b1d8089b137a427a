"""A stub OpenAI-compatible chat server in a thread, for `dcoco bench` and `dcoco data generate`: answers of known
lengths and timing, Prometheus spec-decode counters that requests advance, and failures on demand."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dcoco.benchmark import client as sb


WORDS = ("apples", "red cubes", "small stones", "paper cranes", "glass marbles", "wooden blocks", "old coins")


class Server(ThreadingHTTPServer):
    # the listen backlog: socketserver's default of 5 resets connections when a loaded machine accepts 16 clients
    # slowly (seen in CI as httpx ReadErrors)
    request_queue_size = 128


class Stub:
    """A chat-completions server: the answer to a prompt has 3 + len(prompt) % 5 tokens and takes `per_token`
    seconds per token (raw completions: `completion`, by default a question drawn from the request's seed); each
    chat request advances the spec-decode counters (split over two engines) by drafts = tokens,
    accepted = tokens + len(prompt) % 3, logged per request. fail: {prompt substring: "500" | "hang" | "drop" | a bad
    answer: "bad_ids" | "empty" | "null" | "bad_prompt_ids", or "once:" and one of those for the first answer only}."""

    def __init__(self, spec: bool = True, per_token: float = 0.002):
        self.spec, self.per_token, self.fail = spec, per_token, {}
        self.log: list[dict] = []  # {body, tokens, drafts, accepted}
        self.lock = threading.Lock()
        self.counts = {e: {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos0": 0, "pos1": 0} for e in (0, 1)}
        self.in_flight = self.max_in_flight = 0
        self.on_request = None
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else headers and body wait on delayed ACKs (40 ms per answer)

            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "stub"}]}).encode())
                elif self.path == "/metrics":
                    self._send(200, stub.metrics().encode(), "text/plain")
                else:
                    self._send(404, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/completions":
                    return self._complete(body)
                prompt = body["messages"][-1]["content"]
                mode = next((m for s, m in stub.fail.items() if s in prompt), None)
                if mode in ("drop", "hang"):
                    time.sleep(1.5 if mode == "hang" else 0)  # past the client's timeout
                    self.close_connection = True  # no answer at all
                    return
                if mode == "500":
                    return self._send(500, b'{"error": "stub failure"}')
                if stub.on_request and prompt != sb.WARMUP:
                    stub.on_request()
                n = 3 + len(prompt) % 5
                with stub.lock:
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                time.sleep(stub.per_token * n)
                with stub.lock:
                    stub.in_flight -= 1
                    d, a = n, n + len(prompt) % 3
                    if stub.spec:
                        c = stub.counts[len(stub.log) % 2]
                        c["drafts"] += d
                        c["draft_tokens"] += 3 * d
                        c["accepted"] += a
                        c["pos0"] += d
                        c["pos1"] += a - d
                    answer = f"answer {len(stub.log)} to <{prompt[:24]}>"
                    stub.log.append({"body": body, "tokens": n, "drafts": d, "accepted": a, "answer": answer})
                choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "length"}
                data = {"choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n}}
                if body.get("return_token_ids"):  # as vLLM does
                    choice["token_ids"] = [7 + (len(prompt) + i) % 50 for i in range(n)]
                if mode and mode.startswith("once:"):  # a bad answer the first time only
                    del stub.fail[next(s for s, m in stub.fail.items() if m == mode)]
                    mode = mode[5:]
                if mode == "bad_ids":
                    choice["token_ids"] = [3, -1, 10 ** 6]
                elif mode == "empty":
                    choice["token_ids"], choice["message"]["content"] = [], ""
                elif mode == "null":
                    choice["token_ids"], choice["message"]["content"] = None, None
                elif mode == "bad_prompt_ids":
                    data["prompt_token_ids"] = [5, 6]
                self._send(200, json.dumps(data).encode())

            def _complete(self, body):
                """A raw completion (dcoco data prompts): stub.completion(body) -> (text, finish_reason), or an
                error when its seed is in stub.fail_seeds."""
                with stub.lock:
                    stub.log.append({"body": body})
                if body.get("seed") in stub.fail_seeds:
                    return self._send(500, b'{"error": "stub failure"}')
                text, finish = stub.completion(body)
                self._send(200, json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}],
                                            "usage": {"completion_tokens": len(text.split())}}).encode())

        self.completion = lambda body: (f" How many {WORDS[body['seed'] % 7]} fit in {body['seed'] % 1000} "
                                        f"{WORDS[(body['seed'] // 7) % 7]} boxes?", "stop")
        self.fail_seeds: set[int] = set()
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def metrics(self) -> str:
        lines = ["# HELP vllm:num_requests_running running", "# TYPE vllm:num_requests_running gauge",
                 'vllm:num_requests_running{engine="0",model_name="stub"} 0.0']
        if self.spec:
            with self.lock:
                for e, c in self.counts.items():
                    lab = f'engine="{e}",model_name="stub"'
                    lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(c['drafts'])}",
                              f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e9",
                              f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(c['draft_tokens'])}",
                              f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(c['accepted'])}",
                              f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="0"}} {c["pos0"]}',
                              f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="1"}} {c["pos1"]}']
        return "\n".join(lines) + "\n"

    def requests(self) -> list[dict]:
        """The logged requests but the start-up check's."""
        return [r for r in self.log if r["body"]["messages"][-1]["content"] != sb.WARMUP]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
