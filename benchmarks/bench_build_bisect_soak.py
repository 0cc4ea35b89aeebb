"""Build bisection through real soak jobs: how often the answer is right over many seeds.

`bench_build_bisect` measures the algorithm in virtual time; here every probe is a soak job of the
simulated engine on a local Ray cluster (`tests/test_build_bisect_soak.py`'s matrix: five builds,
the hang planted from b3 on, MTTF 10 min at time scale 240), so the wall-clock parts count too:
start-up, the first request's trip, detection delay, a busy machine's stretched seconds. One seed is
one `soakmatrix bisect --builds` run through the CLI; the table gives, per setting, how often it
named b2-b3, what else it named, and probes, GPU-hours and wall seconds per run.

    python -m benchmarks.bench_build_bisect_soak --seeds 20                     # --parallel 2, 0.99
    python -m benchmarks.bench_build_bisect_soak --seeds 20 --parallel 1 --busy 2   # beside 2 busy loops

A CLI test that asserts one seed's answer stands on one set of draws; this says what fraction of
draws give the right answer, which is what the test's confidence level promises.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.test_build_bisect_soak import CLI, REPO, write

NAMES = [f"b{i}" for i in range(5)]
RIGHT = ("b2", "b3")


def one_run(seed: int, parallel: int, confidence: float) -> dict:
    """One bisection of the planted regression at `seed`; its answer, probes, cost and wall time."""
    with tempfile.TemporaryDirectory(prefix="bench-bbs-") as tmp:
        folder = Path(tmp)
        matrix = write(folder, {n: sys.executable for n in NAMES})
        builds_file = folder / "builds.txt"
        builds_file.write_text("".join(f"{n}\n" for n in NAMES))
        began = time.monotonic()
        proc = subprocess.run([*CLI, "bisect", str(matrix), "--cell", "m|H200||steady|b4", "--builds",
                               str(builds_file), "--json", "--seed", str(seed), "--out", str(folder / "out"),
                               "--confidence", str(confidence), "--parallel", str(parallel)],
                              capture_output=True, text=True, timeout=900, cwd=REPO)
        wall = time.monotonic() - began
        try:
            doc = json.loads(proc.stdout)
        except json.JSONDecodeError:
            return {"seed": seed, "answer": f"exit {proc.returncode}", "wall_s": wall,
                    "stderr": proc.stderr[-400:]}
        rows = {b["build"]: (b["hangs"], round(b["exposure_s"])) for b in doc.get("builds", [])}
        return {"seed": seed, "answer": f"{doc.get('last_good')}-{doc.get('first_bad')}",
                "status": doc.get("status"), "probes": doc.get("probes"), "gpu_hours": doc.get("gpu_hours"),
                "wall_s": wall, "builds": rows}


def busy_loop() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--confidence", type=float, default=0.99)
    p.add_argument("--busy", type=int, default=0, help="busy loops beside the runs (a loaded CI machine)")
    p.add_argument("--jsonl", help="append each run's record here")
    args = p.parse_args(argv)
    loops = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(args.busy)]
    for loop in loops:
        loop.start()
    runs = []
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            run = one_run(seed, args.parallel, args.confidence)
            runs.append(run)
            print(json.dumps(run), flush=True)
            if args.jsonl:
                with open(args.jsonl, "a") as fh:
                    fh.write(json.dumps(run) + "\n")
    finally:
        for loop in loops:
            loop.terminate()
    answers = Counter(r["answer"] for r in runs)
    right = answers.get("-".join(RIGHT), 0)
    mean = lambda key: sum(r.get(key) or 0 for r in runs) / max(1, len(runs))  # noqa: E731
    print(f"\nparallel {args.parallel}, confidence {args.confidence}, {args.busy} busy loop(s): "
          f"{right}/{len(runs)} named b2-b3; others {dict(answers - Counter({'b2-b3': right}))}; "
          f"{mean('probes'):.1f} probes, {mean('gpu_hours'):.2f} GPU-h, {mean('wall_s'):.0f} s wall per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
