"""Hostile command lines: every subcommand's path, number, duration and address options fed what a
hostile but fair user might give, each case in its own process (bounded time and memory), the
outcome of each tabulated per class.

    python -m benchmarks.bench_cli_hostile [--soakmatrix PATH] [--only CLASS] [--timeout S] [--json FILE]

A case expects a refusal (exit 2, no traceback) or, for a value that is legal but does nothing useful,
at least a warning. Outcomes: `clean` (exit 2, no traceback, the option or path named), `unnamed`
(exit 2 without naming them), `traceback`, `hang` (past --timeout), `memory` (over 200 MB resident),
`accepted` (exit 0 or 1 where a refusal was due), `other` (another exit code, no traceback),
`warned` (a warning case that warned or refused). Wall time on a loaded machine is mostly Python
starting up; the CPU seconds are the command's own. `--soakmatrix` runs another checkout's command
(e.g. /work/main/.venv/bin/soakmatrix) for a before/after comparison; the fixtures are made here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "matrix" / "examples" / "demo.yaml"
HANG_CELL = "e9c7d9144023"        # demo's mtp=1 x FULL_AND_PIECEWISE cell, which hangs
MEMORY_MB = 200


def fixtures(tmp: Path) -> dict[str, str]:
    """Valid inputs for the base command lines, and the hostile things to point options at."""
    from soakmatrix.reports.history import HistoryStore

    (tmp / "matrix.yaml").write_text(DEMO.read_text().replace("hangs/demo.yaml",
                                                              str(DEMO.parent / "hangs" / "demo.yaml")))
    with HistoryStore(tmp / "store.sqlite") as store:
        run_id = store.start_run(matrix="demo", profile="demo", kind="run")
        store.finish_run(run_id, "finished")
    (tmp / "junit.xml").write_text('<?xml version="1.0"?><testsuites><testsuite name="s" tests="1">'
                                   '<testcase classname="c" name="n"/></testsuite></testsuites>\n')
    (tmp / "builds.txt").write_text("a: vllm==0.1\nb: vllm==0.2\n")
    (tmp / "file").write_text("x\n")
    (tmp / "dir").mkdir()
    for name in ("report", "bisect", "watch"):   # one each: a command that starts a store in it fills it
        (tmp / f"empty-{name}.sqlite").write_bytes(b"")
    os.mkfifo(tmp / "fifo")
    with open(tmp / "sparse", "wb") as f:     # 4 GiB that takes no disk
        f.truncate(4 << 30)
    # devices of our own: a command that renames its output over a device node (as root) replaces that
    # node with a file, which must never happen to the system's /dev/full and /dev/zero
    full, zero = "/dev/full", "/dev/zero"
    if os.geteuid() == 0:
        os.mknod(tmp / "full", 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        os.mknod(tmp / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        full, zero = str(tmp / "full"), str(tmp / "zero")
    ro = tmp / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                             capture_output=True).returncode == 0
    return {"M": str(tmp / "matrix.yaml"), "S": str(tmp / "store.sqlite"), "J": str(tmp / "junit.xml"),
            "B": str(tmp / "builds.txt"), "T": str(tmp), "FILE": str(tmp / "file"), "DIR": str(tmp / "dir"),
            "FIFO": str(tmp / "fifo"), "UNDER": str(tmp / "file" / "x"), "SPARSE": str(tmp / "sparse"),
            **{f"EMPTY_{n}": str(tmp / f"empty-{n}.sqlite") for n in ("report", "bisect", "watch")}, "RO": str(ro / "x") if mounted else "",
            "RODIR": str(ro / "d") if mounted else "", "FULL": full, "ZERO": zero}


BASE = {
    "plan": "plan {M} --no-validate",
    "run": "run {M} --ray-address 127.0.0.1:1 --out {T}/run-out",
    "smoke": "smoke {M} --ray-address 127.0.0.1:1 --out {T}/smoke-out",
    "bisect": f"bisect {{M}} --cell {HANG_CELL} --virtual --quiet --max-probes 3",
    "report": "report {S}",
    "merge": "report --merge {J} -o {T}/merged.xml",
    "watch": "watch http://127.0.0.1:1 --duration 2s --canary 1s --out {T}/watch-out",
}

IN_FILE = ["{FIFO}", "{ZERO}", "{FULL}", "{DIR}", "{UNDER}", "/proc/self/mem", "{SPARSE}", "{T}/missing"]
OUT_FILE = ["{FULL}", "{ZERO}", "{DIR}", "{UNDER}", "/proc/self/x", "{RO}"]
OUT_DIR = ["{FILE}", "{UNDER}", "{FULL}", "/proc/self/x", "{RODIR}"]

PATHS: list[tuple[str, str, str, list[str]]] = [
    # (command, option as written, how it is given, values)
    ("plan", "MATRIX", "plan {V} --no-validate", IN_FILE),
    ("run", "MATRIX", "run {V} --ray-address 127.0.0.1:1 --out {T}/run-out", IN_FILE[:5]),
    ("bisect", "MATRIX", f"bisect {{V}} --cell {HANG_CELL} --virtual --quiet", IN_FILE[:5]),
    ("bisect", "--hang-model", "{bisect} --hang-model {V}", IN_FILE),
    ("bisect", "--builds", "{bisect} --builds {V}", IN_FILE),
    ("smoke", "--changed-files", "{smoke} --changed-files {V}", IN_FILE[:6]),
    ("report", "STORE", "report {V}", IN_FILE),
    ("report", "--known-issues", "{report} --known-issues {V}", IN_FILE[:6]),
    ("merge", "--merge", "report --merge {V} -o {T}/merged.xml", IN_FILE[:6]),
    ("watch", "--log", "{watch} --log {V}", ["{FIFO}", "{ZERO}", "{DIR}", "{UNDER}", "/proc/self/mem"]),
    ("bisect", "--checkout", f"bisect {{M}} --cell {HANG_CELL} --virtual --quiet --builds a1b2c3..d4e5f6 "
                             "--build-template x@{{sha}} --checkout {V}", ["{FILE}", "{ZERO}", "{UNDER}"]),
    ("report", "--junit", "{report} --junit {V}", OUT_FILE),
    ("merge", "-o", "report --merge {J} -o {V}", OUT_FILE),
    ("bisect", "--emit-test", "{bisect} --emit-test {V}", OUT_FILE),
    ("bisect", "--store", "{bisect} --store {V}", OUT_FILE),
    ("run", "--store", "{run} --store {V}", OUT_FILE),
    ("watch", "--store", "{watch} --store {V}", OUT_FILE),
    ("report", "--out", "{report} --out {V}", OUT_DIR),
    ("bisect", "--out", "{bisect} --out {V}", OUT_DIR),
    ("run", "--out", "run {M} --ray-address 127.0.0.1:1 --out {V}", OUT_DIR),
    ("watch", "--out", "watch http://127.0.0.1:1 --duration 2s --canary 1s --out {V}", OUT_DIR),
]

HUGE = "9" * 5000
NUMBERS: list[tuple[str, str, list[str]]] = [
    ("watch", "--pid", ["-1", "0", "99999999", "4194305", HUGE]),
    ("watch", "--metrics-port", ["0", "-1", "65536", "99999999"]),
    ("watch", "--canary-tokens", ["0", "-5", "10000000"]),
    ("watch", "--max-incidents", ["0", "-1"]),
    ("bisect", "--seed", ["-1", HUGE]),
    ("bisect", "--parallel", ["100000000", "0"]),
    ("bisect", "--max-probes", ["0", "1000000000000"]),
    ("bisect", "--calibration-hangs", ["0", "100000000"]),
    ("bisect", "--confidence", ["1", "0", "nan"]),
    ("bisect", "--budget-gpu-hours", ["0", "inf", "1e308"]),
    ("report", "--limit", ["0", "1000000000000"]),
    ("smoke", "--budget", ["0", "-1", "inf"]),
]
DURATIONS: list[tuple[str, str, list[str]]] = [
    ("watch", "--duration", ["-5s", HUGE, HUGE + "s", "1e400s"]),
    ("watch", "--floor", ["0", "-1s", HUGE]),
    ("watch", "--ceiling", ["0", HUGE]),
    ("watch", "--canary", ["-1s", HUGE]),
    ("watch", "--evidence-budget", ["0", "-1s", HUGE]),
    ("watch", "--on-hang-timeout", ["0", HUGE]),
    ("bisect", "--mttf-cap", ["0", HUGE]),
    ("bisect", "--max-soak", ["0", HUGE]),
]
ADDRESSES: list[tuple[str, str, list[str]]] = [
    ("watch", "--metrics-addr", ["not an address", "999.1.1.1", "-", "a" * 300]),
]
URLS: list[tuple[str, str, list[str]]] = [
    ("watch", "URL", ["ftp://x", "http://", "http://127.0.0.1:99999", "not-a-url"]),
]
WARNINGS: list[tuple[str, str]] = [
    ("watch --duration 0", "{watch} --duration 0"),
    ("bisect --signature unknown", "{bisect} --signature no_such_hang"),
    ("report on a zero-byte store", "report {EMPTY_report}"),
    ("bisect --store zero-byte", "{bisect} --store {EMPTY_bisect}"),
    ("watch --store zero-byte", "{watch} --store {EMPTY_watch}"),
]


def cases(fx: dict[str, str]) -> list[dict]:
    def fill(template: str, value: str = "") -> list[str]:
        bases = {k: v.format(**fx) for k, v in BASE.items()}
        text = template.format(**bases, **fx, V="{V}") if "{V}" in template else template.format(**bases, **fx)
        return [a.replace("{V}", value) for a in text.split()]

    out = []
    for command, option, template, values in PATHS:
        for raw in values:
            value = raw.format(**fx)
            if not value:
                continue   # a read-only mount was not possible here
            out.append({"class": "path", "what": f"{command} {option} {raw}", "argv": fill(template, value),
                        "expect": "refuse", "option": option})
    for klass, table in (("number", NUMBERS), ("duration", DURATIONS), ("address", ADDRESSES)):
        for command, option, values in table:
            for value in values:
                argv = fill(BASE[command]) + [option, value]
                out.append({"class": klass, "what": f"{command} {option} {value[:24]}", "argv": argv,
                            "expect": "refuse", "option": option})
    for command, option, values in URLS:
        for value in values:
            argv = fill(BASE[command])
            argv[1] = value
            out.append({"class": "url", "what": f"{command} {option} {value}", "argv": argv, "expect": "refuse",
                        "option": "URL"})
    for what, template in WARNINGS:
        out.append({"class": "warning", "what": what, "argv": fill(template), "expect": "warn", "option": ""})
    return out


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    os.setsid()


def run_case(command: list[str], case: dict, timeout: float, cwd: Path) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen(command + case["argv"], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                preexec_fn=_limits, cwd=cwd)
        code: object = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                proc.returncode = code
                break
            if time.monotonic() - started > timeout:
                os.killpg(proc.pid, 9)
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = code = "timeout"
                break
            time.sleep(0.05)
        seconds = time.monotonic() - started
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    return {"code": code, "seconds": round(seconds, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "rss_mb": round(usage.ru_maxrss / 1024),
            "stderr": stderr[-1500:], "outcome": outcome(case, code, stderr, usage.ru_maxrss / 1024)}


def outcome(case: dict, code: object, stderr: str, rss_mb: float) -> str:
    if code == "timeout":
        return "hang"
    if rss_mb > MEMORY_MB or "MemoryError" in stderr:
        return "memory"
    if "Traceback" in stderr:
        return "traceback"
    if case["expect"] == "warn":
        return "warned" if code == 2 or "warning" in stderr.lower() else "accepted"
    if code == 2:
        named = case["option"] in stderr or case["option"] in ("MATRIX", "STORE", "URL")
        return "clean" if named else "unnamed"
    if code in (0, 1):
        return "accepted"
    return "other"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--soakmatrix", default=None, help="the command to try (default: this checkout's)")
    parser.add_argument("--only", help="one class: path, number, duration, address, url, warning")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a case counts as a hang")
    parser.add_argument("--json", help="write every case's outcome here")
    args = parser.parse_args(argv)
    command = [args.soakmatrix] if args.soakmatrix else [sys.executable, "-m", "soakmatrix.matrix.cli"]
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        fx = fixtures(tmp)
        try:
            todo = [c for c in cases(fx) if not args.only or c["class"] == args.only]
            results = []
            for case in todo:
                got = run_case(command, case, args.timeout, tmp)
                results.append({**case, **got})
                print(f"{got['outcome']:<10} exit {got['code']!s:<8} {got['seconds']:6.1f} s {got['cpu_s']:5.1f} s CPU "
                      f"{got['rss_mb']:5d} MB  {case['what']}", flush=True)
        finally:
            if fx["RO"]:
                subprocess.run(["umount", str(Path(fx["RO"]).parent)], capture_output=True)
    table: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        table[r["class"]][r["outcome"]] += 1
    kinds = ["clean", "warned", "unnamed", "other", "accepted", "traceback", "hang", "memory"]
    print(f"\n{'class':<10} {'cases':>5} " + " ".join(f"{k:>9}" for k in kinds))
    for klass, counts in table.items():
        print(f"{klass:<10} {sum(counts.values()):5d} " + " ".join(f"{counts[k]:9d}" for k in kinds))
    total = Counter()
    for counts in table.values():
        total.update(counts)
    print(f"{'total':<10} {sum(total.values()):5d} " + " ".join(f"{total[k]:9d}" for k in kinds))
    print(f"slowest case {max(r['seconds'] for r in results):.1f} s ({max(r['cpu_s'] for r in results):.1f} s of CPU), "
          f"most memory {max(r['rss_mb'] for r in results)} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
