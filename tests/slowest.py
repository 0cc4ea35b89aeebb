"""The slowest tests of a run, read from its JUnit XML (setup, call and teardown together), printed
last by CI so that a test that grew slow is seen where the run ends: `python -m tests.slowest FILE [N]`.
It ends with the run's counts as one plain line (`tests: N passed, N failed, N skipped`), so the
output still closes on the verdict."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def slowest(junit_xml: str, count: int) -> list[tuple[float, str]]:
    cases = ET.parse(junit_xml).getroot().iter("testcase")
    timed = [(float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}") for case in cases]
    return sorted(timed, reverse=True)[:count]


def counts(junit_xml: str) -> tuple[int, int, int]:
    """(passed, failed, skipped): a case with a failure or an error failed."""
    passed = failed = skipped = 0
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed += 1
        elif "skipped" in kinds:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def main(argv: list[str]) -> int:
    count = int(argv[1]) if len(argv) > 1 else 15
    rows = slowest(argv[0], count)
    total = sum(float(case.get("time") or 0) for case in ET.parse(argv[0]).getroot().iter("testcase"))
    print(f"\n{len(rows)} slowest tests (of {total / 60:.1f} test-minutes in all):")
    for seconds, name in rows:
        print(f"{seconds:8.1f} s  {name}")
    passed, failed, skipped = counts(argv[0])
    print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
