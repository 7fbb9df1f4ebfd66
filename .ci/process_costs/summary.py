"""Where the tests' CPU goes between pytest's own processes and the processes the tests start.

CI_PROCESS_COSTS=/tmp/costs.jsonl PYTHONPATH=.ci/process_costs pytest
python .ci/process_costs/summary.py /tmp/costs.jsonl
"""

import json
import sys
from collections import defaultdict


def summarise(lines: list[dict], top: int = 15) -> str:
    started = [line for line in lines if line["test"]]
    own = [line for line in lines if not line["test"]]
    by_test: dict[str, list[dict]] = defaultdict(list)
    for line in started:
        by_test[line["test"]].append(line)
    with_avalanche = [line for line in started if line["avalanche"]]
    rows = [
        f"pytest's own processes: {len(own)}, {sum(line['cpu_s'] for line in own):,.0f} s of CPU",
        f"processes the tests started: {len(started)} from {len(by_test)} tests, "
        f"{sum(line['cpu_s'] for line in started):,.0f} s of CPU; {len(with_avalanche)} imported Avalanche "
        f"({sum(line['cpu_s'] for line in with_avalanche):,.0f} s)",
        "",
        "| CPU s | processes | test |",
        "|---:|---:|---|",
    ]
    heaviest = sorted(by_test.items(), key=lambda item: -sum(line["cpu_s"] for line in item[1]))
    for test, group in heaviest[:top]:
        rows.append(f"| {sum(line['cpu_s'] for line in group):.1f} | {len(group)} | {test} |")
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
