"""Where the tests' CPU goes between pytest's own processes and the processes the tests start.

CI_PROCESS_COSTS=/tmp/costs.jsonl PYTHONPATH=.ci/process_costs pytest
python .ci/process_costs/summary.py /tmp/costs.jsonl
"""

import json
import sys
from collections import defaultdict


def _cpu(lines: list[dict]) -> float:
    return sum(line["cpu_s"] for line in lines)


def summarise(lines: list[dict], top: int = 15) -> str:
    own = [line for line in lines if not line["test"]]
    started = [line for line in lines if line["test"]]
    by_test: dict[str, list[dict]] = defaultdict(list)
    for line in started:
        by_test[line["test"]].append(line)
    with_avalanche = [line for line in started if line["avalanche"]]
    rows = [
        f"pytest's own processes: {len(own)}, {_cpu(own):,.0f} s of CPU",
        f"processes the tests started: {len(started)} from {len(by_test)} tests, {_cpu(started):,.0f} s of "
        f"CPU; {len(with_avalanche)} imported Avalanche ({_cpu(with_avalanche):,.0f} s)",
        "",
        "| CPU s | processes | test |",
        "|---:|---:|---|",
    ]
    for test, group in sorted(by_test.items(), key=lambda item: -_cpu(item[1]))[:top]:
        rows.append(f"| {_cpu(group):.1f} | {len(group)} | {test} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python .ci/process_costs/summary.py LOG.jsonl")
    try:
        with open(sys.argv[1]) as log:
            lines = [json.loads(text) for text in log if text.strip()]
    except (OSError, json.JSONDecodeError) as error:
        sys.exit(f"error: cannot read {sys.argv[1]}: {error}")
    print(summarise(lines))
