"""Markdown tables of a pytest-benchmark JSON: median per impl and group, as ratios to the first column
(the forward groups: dcoco with the table; the train groups: dcoco::score forward)."""

import json
import sys
from collections import defaultdict


FORWARD = ["dcoco_table", "dcoco", "native_table", "native", "reference"]
TRAIN = ["dcoco_forward", "dcoco_backward", "dcoco_forward_backward", "native_forward", "native_forward_backward"]


def table(groups: dict, names: list[str], impls: list[str], base: str) -> None:
    print("| group | " + " | ".join(impls) + " |")
    print("|---" * (len(impls) + 1) + "|")
    for group in names:
        row = groups[group]
        cells = [f"{row[i] * 1e3:.2f} ({row[i] / row[base]:.1f}x)" if i in row else "-" for i in impls]
        print(f"| {group} | " + " | ".join(cells) + " |")


def main(path: str) -> None:
    data = json.load(open(path))
    groups = defaultdict(dict)
    for b in data["benchmarks"]:
        groups[b["group"]][b["extra_info"]["impl"]] = b["stats"]["median"]
    order = sorted(groups, key=lambda g: (" cuda" in g, int(g.split("=")[1].split()[0])))
    print(f"{data['machine_info']['cpu']['brand_raw']}, {data['datetime'][:10]}, torch threads "
          f"{data['benchmarks'][0]['extra_info']['threads']}; median ms (x of the first column)\n")
    forward = [g for g in order if g.startswith("forward")]
    train = [g for g in order if g.startswith("train")]
    if forward:
        table(groups, forward, FORWARD, "dcoco_table")
    if train:
        table(groups, train, TRAIN, "dcoco_forward")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/cpu/cpu.json")
