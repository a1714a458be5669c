"""``python -m benchmarks collect``: collects one device run (GPU test outcomes + scenario figures + machine
facts) into the JSON committed under benchmarks/results/."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET

from ..speed.suite import machine


def outcomes(*junits: str) -> dict:
    """{test name: {"status", "seconds"}} over every junit file given."""
    result = {}
    cases = [case for junit in junits for case in ET.parse(junit).getroot().iter("testcase")]
    for case in cases:
        if not case.get("name"):  # the nameless case pytest writes for a run stopped by SIGINT: no test
            continue
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = child.tag if child.tag != "failure" else "failed"
        result[case.get("name")] = {"status": status, "seconds": float(case.get("time", 0))}
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks collect", description=__doc__.split("\n\n")[0])
    p.add_argument("--junit", required=True, nargs="+", help="one or more junit files (a device call's phases)")
    p.add_argument("--scenarios", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    scenarios = []
    try:
        with open(args.scenarios) as f:
            scenarios = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        pass
    tests = outcomes(*args.junit)
    doc = {
        "machine": machine(),
        "command": args.command,
        "tests": tests,
        "summary": {
            s: sum(1 for t in tests.values() if t["status"] == s) for s in ("passed", "failed", "error", "skipped")
        },
        "scenarios": scenarios,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc["summary"]), "->", args.out)


if __name__ == "__main__":
    main()
