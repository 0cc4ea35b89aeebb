"""Dashboard scale: a history of N nights x M cells written to a store, then the dashboard built.

The claim: 30 nights x 2,000 cells builds in under 30 s and the page stays under 20 MB.
The synthetic fleet is shaped like a real one: a few models on H200/H20/RTX-5090, flag axes as in
matrix/examples/nightly.yaml, hangs where the hang model's seeds put them (MTP with
FULL_AND_PIECEWISE, fp8 + prefix caching), with exponential times to hang, infra errors that are
retried, stuck frames and log tails with markup in them.

    python -m benchmarks.bench_dashboard            # 30 x 2000
    python -m benchmarks.bench_dashboard --quick    # 5 x 300
"""

from __future__ import annotations

import argparse
import itertools
import random
import resource
import tempfile
import time
from pathlib import Path
from typing import Sequence

from soakmatrix.matrix.cells import Cell
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.dashboard import build_dashboard
from soakmatrix.reports.history import HistoryStore

MODELS = ["zai-org/GLM-5.1", "Qwen/Qwen3-235B-A22B", "meta-llama/Llama-3.3-70B", "deepseek-ai/DeepSeek-V3.2"]
GPUS = ["H200", "H20", "GeForce-RTX-5090"]
AXES = {
    "tp": [1, 2, 4, 8],
    "mtp": [0, 1, 2],
    "cudagraph_mode": ["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "NONE"],
    "async_scheduling": [True, False],
    "prefix_caching": [True, False],
    "kv_cache_dtype": ["auto", "fp8"],
    "flashinfer_autotune": [True, False],
}
WORKLOADS = ["chat-multiturn", "burst"]
SOAK_S = 4 * 3600.0
FRAMES = {
    "event_sync_stall": ['File "vllm/v1/worker/gpu_model_runner.py", line 2410, in _to_list',
                         "    self.transfer_event.synchronize()",
                         'File "torch/cuda/streams.py", line 227, in synchronize', "    super().synchronize()"],
    "shm_broadcast_timeout": ['File "vllm/distributed/device_communicators/shm_broadcast.py", line 512, in acquire_read',
                              "    time.sleep(RINGBUFFER_SLEEP_INTERVAL)",
                              'File "vllm/v1/executor/multiproc_executor.py", line 260, in collective_rpc'],
    "silent_stall": ['File "vllm/v1/engine/core.py", line 343, in step', "    scheduler_output = self.scheduler.schedule()"],
}


def synthetic_cells(n: int, seed: int = 7) -> list[Cell]:
    """n distinct cells: every model x GPU x workload row gets the same flag combinations, as a
    matrix product does (the last combination may cover only some rows)."""
    rng = random.Random(seed)
    combos = list(itertools.product(*AXES.values()))
    rng.shuffle(combos)
    rows = list(itertools.product(MODELS, GPUS, WORKLOADS))
    cells = []
    for combo in combos:
        for model, gpu, workload in rows:
            if len(cells) >= n:
                return cells
            cells.append(Cell.make(model, gpu, dict(zip(AXES, combo)), workload))
    return cells


def true_mttf_s(cell: Cell) -> tuple[float, str] | None:
    """Where the seeds say hangs live, and how often."""
    f = cell.flag_dict
    if f["mtp"] and f["cudagraph_mode"] == "FULL_AND_PIECEWISE" and cell.gpu in ("H200", "H20"):
        return (2280.0 * (8 if not f["flashinfer_autotune"] else 1), "shm_broadcast_timeout")
    if f["kv_cache_dtype"] == "fp8" and f["prefix_caching"] and f["tp"] >= 4:
        return (6 * 3600.0, "silent_stall")
    if cell.gpu == "GeForce-RTX-5090" and cell.workload == "chat-multiturn" and f["async_scheduling"]:
        return (9 * 3600.0, "event_sync_stall")
    return None


def night_result(cell: Cell, night: int, rng: random.Random, t0: float) -> CellResult:
    started = t0 + night * 86_400.0
    base = dict(cell_id=cell.id, cell_name=cell.name, model=cell.model, gpu_type=cell.gpu, workload=cell.workload,
                flags=cell.flag_dict, node=f"node-{rng.randrange(64):02d}", gpu_count=cell.tp, engine="vllm",
                vllm_version="0.33.0", started_at=started)
    retries = ["ray node died: heartbeat older than 300 s"] if rng.random() < 0.02 else []
    if rng.random() < 0.005:
        return CellResult(outcome="infra_error", exposure_s=0.0, ended_at=started + 400, attempt=3,
                          message="port 8000 taken on every attempt", retries=retries * 2, **base)
    if cell.flag_dict["mtp"] == 2 and cell.flag_dict["cudagraph_mode"] == "NONE" and cell.tp == 1:
        return CellResult(outcome="config_error", exposure_s=0.0, ended_at=started + 60,
                          message="--speculative-config rejected: MTP needs cudagraphs on this model", **base)
    hang = true_mttf_s(cell)
    if hang is not None:
        mttf, signature = hang
        t = rng.expovariate(1.0 / mttf)
        if t < SOAK_S:
            log = [f"Engine 000: Avg prompt throughput: {rng.uniform(900, 2000):.1f} tokens/s, Avg generation "
                   f"throughput: {rng.uniform(300, 900):.1f} tokens/s, Running: 15 reqs, Waiting: 3 reqs"] * 30
            log += ["No available shared memory broadcast block found in 60 seconds. <b>see</b> <script>x()</script>"] * 4
            return CellResult(outcome="hang", signature=signature, detector="token_progress", time_to_hang_s=t,
                              detected_after_s=60.0, exposure_s=t, ended_at=started + t + 300,
                              message=f"generation_tokens_total flat for 60 s with 15 requests running, "
                                      f"{t / 60:.0f} min into the soak",
                              stuck_frames=FRAMES[signature], log_tail=log, retries=retries,
                              attempt=1 + len(retries), tokens=int(t * 600), requests=int(t * 2), **base)
    if rng.random() < 0.002:
        return CellResult(outcome="crash", signature="cuda_illegal_address", detector="process_exit",
                          exposure_s=1200.0, ended_at=started + 1300, message="engine exited with code 1",
                          log_tail=["RuntimeError: CUDA error: an illegal memory access was encountered"], **base)
    return CellResult(outcome="passed", exposure_s=SOAK_S, ended_at=started + SOAK_S + 120, retries=retries,
                      attempt=1 + len(retries), tokens=int(SOAK_S * 600), requests=int(SOAK_S * 2), **base)


def populate(path: Path, nights: int, n_cells: int, seed: int = 7, t0: float = 1_790_000_000.0,
             bisection: bool = True) -> list[str]:
    """Write `nights` finished runs of `n_cells` cells through the store's public API; returns run ids."""
    clock = [t0]   # runs dated a night apart, as a real history is
    with HistoryStore(path, clock=lambda: clock[0]) as store:
        return _populate(store, clock, nights, n_cells, seed, t0, bisection)


def _populate(store: HistoryStore, clock: list[float], nights: int, n_cells: int, seed: int, t0: float,
              bisection: bool) -> list[str]:
    rng = random.Random(seed)
    cells = synthetic_cells(n_cells, seed)
    run_ids = []
    for night in range(nights):
        clock[0] = t0 + night * 86_400.0
        run = store.start_run(matrix="matrix/examples/nightly.yaml", profile="nightly", meta={"night": night})
        store.planned(run, [{"id": c.id, "name": c.name, "model": c.model, "gpu": c.gpu, "flags": c.flag_dict,
                             "workload": c.workload} for c in cells])
        for cell in cells:
            store.record(run, night_result(cell, night, rng, t0))
        clock[0] += SOAK_S + 600
        store.finish_run(run, "found")
        run_ids.append(run)
    if bisection:
        hung = next((c for c in cells if true_mttf_s(c) and true_mttf_s(c)[1] == "shm_broadcast_timeout"), None)
        if hung is not None:
            store.record_bisection(hung.id, {
                "cell": hung.id, "signature": "shm_broadcast_timeout", "minimal_set": {"mtp": 1, "cudagraph_mode": "FULL_AND_PIECEWISE"},
                "confidence": 0.95, "gpu_hours": 96.0,
                "configs": [{"flags": hung.flag_dict, "hangs": 4, "exposure_s": 9120.0, "mttf_s": 2280.0, "ci": [900.0, 8000.0]},
                            {"flags": {"mtp": 0}, "hangs": 0, "exposure_s": 43200.0, "mttf_s": None, "ci": [14400.0, None]}],
                "verdicts": {"mtp": "needed: MTP off never hung in 12 h", "cudagraph_mode": "needed: FULL_DECODE_ONLY never hung",
                             "flashinfer_autotune": "modifier: off multiplies MTTF by about 8"}}, run_id=run_ids[-1])
    return run_ids


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 nights x 300 cells")
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--keep", help="write the store and site here instead of a temporary folder")
    args = parser.parse_args(argv)
    nights, n_cells = (5, 300) if args.quick else (args.nights, args.cells)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.keep or tmp)
        where.mkdir(parents=True, exist_ok=True)
        store_path = where / "history.sqlite"
        store_path.unlink(missing_ok=True)
        t = time.perf_counter()
        populate(store_path, nights, n_cells)
        write_s = time.perf_counter() - t
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t = time.perf_counter()
        page = build_dashboard(store_path, where / "site")
        build_s = time.perf_counter() - t
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        size_mb = page.stat().st_size / 1e6
        results = nights * n_cells
        rows = [
            ("nights x cells", f"{nights} x {n_cells}", ""),
            ("store: write (one transaction per result)", f"{write_s:.1f} s", f"{results / write_s:,.0f} results/s"),
            ("store: size", f"{store_path.stat().st_size / 1e6:.1f} MB", ""),
            ("dashboard: build", f"{build_s:.1f} s", "claim: < 30 s" if not args.quick else ""),
            ("dashboard: index.html", f"{size_mb:.1f} MB", "claim: < 20 MB (plotly.js inlined: 4.8 MB)" if not args.quick else ""),
            ("peak RSS of this process", f"{max(rss_before, rss_after):.0f} MB", ""),
        ]
        width = max(len(r[0]) for r in rows)
        print(f"{'measure':<{width}}  {'value':>12}  note")
        for name, value, note in rows:
            print(f"{name:<{width}}  {value:>12}  {note}")
        if args.keep:
            print(f"site: {page}")
        ok = args.quick or (build_s < 30 and size_mb < 20)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
