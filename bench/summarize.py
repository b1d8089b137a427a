"""Markdown table of a pytest-benchmark JSON: median per impl and group, and ratios to dcoco's forward."""

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    data = json.load(open(path))
    groups = defaultdict(dict)
    for b in data["benchmarks"]:
        groups[b["group"]][b["extra_info"]["impl"]] = b["stats"]["median"]
    impls = ["dcoco_table", "dcoco", "torch_table", "torch", "reference"]
    print(f"{data['machine_info']['cpu']['brand_raw']}, {data['datetime'][:10]}, torch threads "
          f"{data['benchmarks'][0]['extra_info']['threads']}; median ms (x slower than dcoco_table)\n")
    print("| group | " + " | ".join(impls) + " |")
    print("|---" * (len(impls) + 1) + "|")
    for group in sorted(groups, key=lambda g: (" cuda" in g, int(g.split("=")[1].split()[0]))):
        row = groups[group]
        base = row["dcoco_table"]
        cells = [f"{row[i] * 1e3:.2f} ({row[i] / base:.1f}x)" if i in row else "-" for i in impls]
        print(f"| {group} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/cpu.json")
