"""False hangs on a host that freezes the engine now and then, with and without the hang confirmation.

A noisy neighbour, CPU-quota throttling of a container or memory pressure can stop a healthy engine
for longer than the stall threshold (6 s); every detector then sees what a hang looks like. Here the
freeze is real: the simulated engine's whole process tree (API server, engine core, workers) gets
SIGSTOP for 7-12 s at random moments, then SIGCONT, while the soak job's load driver and watchdog
run on. Healthy cells (no hang planted) must pass, their freezes kept as stalls; cells with a
planted silent stall (`stall_hangs.yaml`, MTTF 40 s) must still be hangs, with the right signature. Each
cell runs twice, with the soak job's default `SoakOptions.confirmation` and with `None` (every
verdict stands: the soak job before the confirmation), on the same seeds and freeze schedule.

    python -m benchmarks.bench_stalls                 # 12 healthy and 6 hang cells per mode
    python -m benchmarks.bench_stalls --quick         # 3 and 2
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import psutil

from soakmatrix.jobs.soak import SoakOptions, run_cell
from soakmatrix.jobs.soak_spec import SoakSpec

from .bench_detection import hang_spec, workload

HANG_MODEL = Path(__file__).resolve().parent / "stall_hangs.yaml"
MODES = {"confirmed": SoakOptions(), "unconfirmed": SoakOptions(confirmation=None)}


def healthy_spec(out: Path, i: int, soak_s: float) -> SoakSpec:
    return SoakSpec(
        cell_id=f"healthy-{i}", cell_name=f"sim|bench|healthy|{i}", model="tiny", model_path="tiny",
        gpu_type="H200", gpu_count=1, flags={}, serve_args=(),
        workload=workload("steady", concurrency=4, input_len=[64, 512], output_len=[16, 128]),
        soak_s=soak_s, startup_timeout_s=120, backend="sim", artifacts_dir=str(out / f"healthy-{i}"),
        time_scale=1.0, seed=3000 + i)


def engine_tree(marker: str) -> list[psutil.Process]:
    """The server whose command line names `marker` (the cell's folder), and all its descendants."""
    roots = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and "bench_stalls" not in " ".join(p.info["cmdline"]):
                roots.append(p)
        except psutil.Error:
            continue
    tree = {p.pid: p for p in roots}
    for p in roots:
        try:
            tree.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.Error:
            continue
    return list(tree.values())


def freezer(marker: str, seed: int, stop: threading.Event, frozen: list[float],
            every_s: tuple[float, float] = (12.0, 25.0), freeze_s: tuple[float, float] = (7.0, 12.0)) -> None:
    """Freeze the cell's engine tree at random moments (the same schedule for the same seed)."""
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(*every_s)):
        length = rng.uniform(*freeze_s)
        procs = engine_tree(marker)
        if not procs:
            continue
        for p in procs:
            try:
                p.suspend()
            except psutil.Error:
                pass
        stop.wait(length)
        for p in procs:
            try:
                p.resume()
            except psutil.Error:
                pass
        frozen.append(length)


def one_cell(spec: SoakSpec, options: SoakOptions, seed: int) -> dict:
    stop, frozen = threading.Event(), []
    thread = threading.Thread(target=freezer, args=(spec.artifacts_dir, seed, stop, frozen), daemon=True)
    thread.start()
    try:
        r = run_cell(spec, options=options)
    finally:
        stop.set()
        thread.join(20)
    return {"cell": spec.cell_id, "outcome": r.outcome.value, "signature": r.signature, "freezes": len(frozen),
            "stalls": len(r.stalls), "exposure_s": r.exposure_s, "message": r.message,
            "fired": bool(r.true_hang), "latency_s": r.latency_from_true_start_s}


def run(out: Path, healthy: int, hangs: int, soak_s: float, parallel: int) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for mode, options in MODES.items():
        jobs = [(replace(healthy_spec(out, i, soak_s), artifacts_dir=str(out / mode / f"healthy-{i}")), 100 + i)
                for i in range(healthy)]
        jobs += [(replace(hang_spec(out, "silent_stall", i), artifacts_dir=str(out / mode / f"hang-{i}"),
                          hang_model=str(HANG_MODEL)), 200 + i) for i in range(hangs)]
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            rows[mode] = list(pool.map(lambda job: one_cell(job[0], options, job[1]), jobs))
        for row in rows[mode]:
            print(f"  {mode:<11} {row['cell']:<14} {row['outcome']:<7} {str(row['signature']):<14} "
                  f"freezes {row['freezes']}, stalls {row['stalls']}, planted hang fired {row['fired']}, "
                  f"verdict {row['latency_s']} s after it", flush=True)
    return rows


def summarise(rows: dict[str, list[dict]]) -> str:
    lines = ["", "Healthy and hanging simulated engines, their process trees frozen 7-12 s every 12-25 s",
             "", f"{'mode':<11} {'healthy':>7} {'soak h':>6} {'freezes':>7} {'false hangs':>11} {'stalls kept':>11}"
             f" | {'hangs':>5} {'fired':>5} {'found':>5} {'sig ok':>6}"]
    for mode, rs in rows.items():
        ok = [r for r in rs if r["cell"].startswith("healthy")]
        bad = [r for r in rs if not r["cell"].startswith("healthy")]
        # found: a hang verdict on the planted hang itself (after it began), not on a freeze before it
        found = [r for r in bad if r["outcome"] == "hang" and r["fired"] and (r["latency_s"] or -1) >= 0]
        lines.append(f"{mode:<11} {len(ok):>7} {sum(r['exposure_s'] for r in ok) / 3600:>6.2f} "
                     f"{sum(r['freezes'] for r in ok):>7} {sum(r['outcome'] != 'passed' for r in ok):>11} "
                     f"{sum(r['stalls'] for r in ok):>11} | {len(bad):>5} {sum(r['fired'] for r in bad):>5} "
                     f"{len(found):>5} {sum(r['signature'] == 'silent_stall' for r in found):>6}"
                     + (f"  detection {min(lat):.1f}-{max(lat):.1f} s" if (lat := [r['latency_s'] for r in found]) else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 healthy and 2 hang cells per mode")
    p.add_argument("--healthy", type=int, default=12)
    p.add_argument("--hangs", type=int, default=6)
    p.add_argument("--soak-s", type=float, default=90.0, help="wall seconds of load per healthy cell")
    p.add_argument("--parallel", type=int, default=3)
    args = p.parse_args(argv)
    if args.quick:
        args.healthy, args.hangs = 3, 2
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-stalls-") as tmp:
        rows = run(Path(tmp), args.healthy, args.hangs, args.soak_s, args.parallel)
    print(summarise(rows))
    print(f"\n{time.time() - t0:.0f} s of wall time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
