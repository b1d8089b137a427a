"""`dcoco bench`: the serving benchmark against an OpenAI-compatible server, and `dcoco bench compare`."""

from __future__ import annotations

import argparse

from .arguments import seconds
from .exits import exits


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", help="the server's base URL, e.g. http://localhost:8000 (required)")
    p.add_argument("--model", help="the served model name (required)")
    p.add_argument("--out", help="run folder: requests.jsonl, batches.jsonl, run.json, table.md, PNGs (required); "
                                 "rerunning with the same --out resumes: requests done are kept, failed ones redone")
    p.add_argument("--suites", nargs="+", help="folders of *.jsonl suites or .jsonl files, every turn of each "
                                               "{\"turns\": [...]} line used (default: the suites shipped in "
                                               "dcoco/data/suites)")
    p.add_argument("--only", help="comma-separated suite names (default: every suite found)")
    p.add_argument("--hub", action="store_true", help="fetch Alpaca and SPEED-Bench from the Hugging Face hub when "
                                                      "--suites lacks them (needs `datasets` and a network)")
    p.add_argument("--rows", help="rows per suite drawn with seed 1234, or 'all' (default: the paper's subsets: 128, "
                                  "all of AIME-25 and MT-Bench, 80 per SPEED-Bench category)")
    p.add_argument("--max-tokens", type=int, default=2048, help="new tokens per answer, at most (%(default)s)")
    p.add_argument("--seeds", default="greedy,42,43,44", help="'greedy' and sampling seeds (%(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="of the seeded runs (%(default)s)")
    p.add_argument("--concurrency", default="1", help="requests in flight, comma-separated to sweep, e.g. "
                                                      "1,4,8,16,32 (%(default)s)")
    p.add_argument("--timeout", type=seconds, default=600.0, help="seconds to wait for each answer (%(default)s)")
    p.add_argument("--thinking", action="store_true", help="thinking on (chat_template_kwargs.enable_thinking)")
    p.add_argument("--no-progress", action="store_true")
    sub = p.add_subparsers(dest="bench_cmd", metavar="compare")
    c = sub.add_parser("compare", help="join runs into one table with speedups over the no-spec run, plus plots")
    c.add_argument("runs", nargs="+", metavar="RUN", help="run folders of `dcoco bench` or their run.json")
    c.add_argument("--out", required=True, help="folder for compare.md, compare.json and the PNGs")
    c.add_argument("--labels", help="comma-separated run names (default: each run's folder name)")
    c.add_argument("--baseline", help="the no-spec run's name (default: the run without spec-decode counters)")


def run(args: argparse.Namespace) -> int:
    from ..benchmark import client, report
    from ..suites import parse_rows

    with exits("dcoco bench"):
        if args.bench_cmd == "compare":
            j = report.compare(args.runs, args.labels.split(",") if args.labels else None, args.baseline)
            print(report.compare_table(j))
            print(f"wrote {', '.join(map(str, report.write_compare(j, args.out)))}")
            return 0
        missing = [f"--{k}" for k in ("endpoint", "model", "out") if getattr(args, k) is None]
        if missing:
            raise ValueError(f"the following arguments are required: {', '.join(missing)}")
        cfg = client.BenchConfig(
            endpoint=args.endpoint, model=args.model, out=args.out, suites=args.suites,
            only=args.only.split(",") if args.only else None, use_hub=args.hub, rows=parse_rows(args.rows),
            max_tokens=args.max_tokens, seeds=client.parse_seeds(args.seeds), temperature=args.temperature,
            concurrency=client.parse_concurrency(args.concurrency), timeout=args.timeout,
            thinking=args.thinking)
        _, failed = client.run(cfg, progress=not args.no_progress)
    return 1 if failed else 0
