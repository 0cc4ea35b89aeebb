"""Scheduling on a simulated heterogeneous fleet: overhead per cell and makespan vs the lower bound.

Fleet (a local multi-node Ray cluster, fake GPUs): 2 x 8 H200, 1 x 8 H20, 4 x 1 RTX 5090. The matrix is
the nightly example (59 cells, TP 1/4/8); each cell is a stand-in soak job that holds its GPUs for its
planned soak + start-up, with time scaled so the whole night takes about a minute. The lower bound is
max over GPU types of (GPU-seconds of that type / GPUs of that type) and the longest single cell.

    python -m benchmarks.bench_schedule [--quick] [--target-s 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLEET = [("H200", 8)] * 2 + [("H20", 8)] + [("GeForce-RTX-5090", 1)] * 4


def scaled_soak(spec, stop=None, on_event=None):
    """Stand-in soak job: holds the cell's GPUs for (soak + start-up) / time_scale wall seconds."""
    from soakmatrix.matrix.contracts.outcomes import Outcome
    from soakmatrix.matrix.contracts.result import CellResult

    t0 = time.time()
    hold = spec.soak_s / spec.time_scale
    if stop is not None:
        stop.wait(hold)
    else:
        time.sleep(hold)
    return CellResult(spec.cell_id, spec.cell_name, Outcome.PASSED, gpu_type=spec.gpu_type,
                      gpu_count=spec.gpu_count, started_at=t0, ended_at=time.time(), attempt=spec.attempt)


class Quiet:
    def __init__(self):
        self.starts: dict[str, float] = {}
        self.ends: dict[str, float] = {}

    def cell_started(self, pc, attempt, node):
        self.starts[pc.id] = time.time()

    def cell_retrying(self, pc, result):
        pass

    def cell_finished(self, pc, result):
        self.ends[pc.id] = time.time()

    def tick(self):
        pass


def simulate_packing(cells, duration, order) -> float:
    """Makespan of the same submission order with zero overhead: whenever GPUs free up, every
    waiting cell that fits a node of its type starts (first fit), as Ray's scheduler does."""
    import heapq

    free = [[label, gpus] for label, gpus in FLEET]
    waiting = list(order(cells))
    running: list[tuple[float, int, int]] = []   # (end, node index, gpus)
    now, seq = 0.0, 0
    while waiting or running:
        still = []
        for pc in waiting:
            node = next((i for i, (label, g) in enumerate(free) if label == pc.ray_label and g >= pc.gpu_count), None)
            if node is None:
                still.append(pc)
                continue
            free[node][1] -= pc.gpu_count
            seq += 1
            heapq.heappush(running, (now + duration(pc), seq, node, pc.gpu_count))
        waiting = still
        if not running:
            break
        now, _, node, gpus = heapq.heappop(running)
        free[node][1] += gpus
    return now


def start_fleet():
    import ray
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    from soakmatrix.matrix.schedule.cluster import loopback_only

    loopback_only()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    for label, gpus in FLEET:
        cluster.add_node(num_cpus=1, num_gpus=gpus, resources={f"accelerator_type:{label}": 1})
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    cluster.wait_for_nodes()
    return cluster


def measure_makespan(cells, matrix, target_s: float, poll_s: float) -> dict:
    from dataclasses import replace

    from soakmatrix.matrix.schedule import RayLauncher, lower_bound_makespan, run_cells
    from soakmatrix.matrix.soak_specs import soak_spec_for

    gpus_by_label: dict[str, float] = {}
    for label, n in FLEET:
        gpus_by_label[label] = gpus_by_label.get(label, 0) + n
    duration = lambda pc: pc.soak_s + pc.startup_s  # noqa: E731
    bound_engine = max(lower_bound_makespan(cells, gpus_by_label, duration), max(map(duration, cells)))
    scale = bound_engine / target_s
    from soakmatrix.matrix.schedule import dispatch_order
    packing_engine = simulate_packing(cells, duration, dispatch_order)

    def make_spec(pc):
        spec = soak_spec_for(pc, matrix, "sim", "/tmp/bench-schedule")
        return replace(spec, soak_s=duration(pc), time_scale=scale)

    events = Quiet()
    launcher = RayLauncher(run_cell=scaled_soak)
    t0 = time.time()
    summary = run_cells(cells, make_spec, launcher, events, retries=0, cap_s=10 * target_s, poll_s=poll_s)
    wall = time.time() - t0
    assert len(summary.results) == len(cells), "every cell must finish"
    held = sum(r.duration_s for r in summary.results) / len(cells)
    return {"cells": len(cells), "bound_s": bound_engine / scale, "makespan_s": wall,
            "packing_s": packing_engine / scale, "packing_ratio": packing_engine / bound_engine,
            "ratio": wall / (bound_engine / scale), "mean_cell_s": held, "scale": scale}


def measure_overhead(cells, matrix, n: int) -> dict:
    """Per-cell overhead with zero-length cells: one at a time (latency) and all at once (throughput)."""
    from dataclasses import replace

    from soakmatrix.matrix.schedule import RayLauncher, run_cells
    from soakmatrix.matrix.soak_specs import soak_spec_for

    small = [pc for pc in cells if pc.gpu_count == 1][:n] or cells[:n]

    def make_spec(pc):
        return replace(soak_spec_for(pc, matrix, "sim", "/tmp/bench-schedule"), soak_s=0.0, time_scale=1.0)

    launcher = RayLauncher(run_cell=scaled_soak)
    latencies = []
    for pc in small:
        t0 = time.time()
        run_cells([pc], make_spec, launcher, Quiet(), retries=0, cap_s=60, poll_s=0.05)
        latencies.append(time.time() - t0)
    t0 = time.time()
    run_cells(small, make_spec, launcher, Quiet(), retries=0, cap_s=60, poll_s=0.05)
    together = time.time() - t0
    latencies.sort()
    return {"n": len(small), "latency_p50_s": latencies[len(latencies) // 2], "latency_max_s": latencies[-1],
            "throughput_per_cell_s": together / len(small)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_schedule", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 20 s night and 8 overhead cells")
    parser.add_argument("--target-s", type=float, help="wall seconds the lower bound is scaled to (default 60)")
    parser.add_argument("--matrix", default=str(REPO / "matrix" / "examples" / "nightly.yaml"))
    parser.add_argument("--profile", default="nightly")
    args = parser.parse_args(argv)
    target = args.target_s or (20.0 if args.quick else 60.0)

    import ray

    from soakmatrix.matrix.plan import plan
    from soakmatrix.matrix.spec import load_matrix

    matrix = load_matrix(args.matrix)
    cells = plan(matrix, args.profile).cells
    t0 = time.time()
    cluster = start_fleet()
    started = time.time() - t0
    try:
        overhead = measure_overhead(cells, matrix, 8 if args.quick else 20)
        makespan = measure_makespan(cells, matrix, target, poll_s=0.2)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"fleet: {', '.join(f'{n} x {label}' for label, n in FLEET)} ({len(FLEET)} Ray nodes, started in {started:.1f} s)"
          f" on {os.cpu_count()} cores")
    print(f"{'measure':<44} {'value':>10}  target")
    print(f"{'overhead, one cell alone (p50, submit->result)':<44} {overhead['latency_p50_s']:>9.3f}s  < 1 s")
    print(f"{'overhead, one cell alone (max)':<44} {overhead['latency_max_s']:>9.3f}s")
    print(f"{'overhead per cell, ' + str(overhead['n']) + ' submitted together':<44} {overhead['throughput_per_cell_s']:>9.3f}s  < 1 s")
    print(f"{'matrix':<44} {makespan['cells']:>10d}  {args.matrix.split('/')[-1]}:{args.profile}")
    print(f"{'lower bound (scaled)':<44} {makespan['bound_s']:>9.1f}s")
    print(f"{'same order, zero overhead (simulated)':<44} {makespan['packing_s']:>9.1f}s  "
          f"({makespan['packing_ratio']:.3f} x bound: the packing's own loss)")
    print(f"{'makespan':<44} {makespan['makespan_s']:>9.1f}s")
    print(f"{'makespan / lower bound':<44} {makespan['ratio']:>10.3f}  <= 1.10")
    print(f"{'time scale (engine s per wall s)':<44} {makespan['scale']:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
