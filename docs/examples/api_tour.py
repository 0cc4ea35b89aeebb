"""A tour of soakmatrix's Python API on the simulated engine: plan a matrix, run it on a local Ray
cluster, bisect a hang's flags in virtual time, and watch a simulated server for a few seconds.

    python docs/examples/api_tour.py [OUT_DIR]

Run from a source checkout (it reads the example matrices there). Nothing needs a GPU: the cells
serve the simulated vLLM server, and Ray simulates the matrix's GPUs on this machine. It takes
about half a minute, most of it Ray starting up.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import soakmatrix

HERE = Path(__file__).resolve().parent
TOUR = HERE / "tour.yaml"                                    # two cells, 2 s soaks
DEMO = HERE.parent.parent / "matrix" / "examples" / "demo.yaml"   # a planted MTP x cudagraph hang
FAILING = "tiny-moe|H200|async_scheduling=true,cudagraph_mode=FULL_AND_PIECEWISE,mtp=1,tp=2|staggered"


def show_plan() -> soakmatrix.Plan:
    plan = soakmatrix.plan(soakmatrix.load_matrix(TOUR))
    print(f"{plan.matrix.name}/{plan.profile.name}: {len(plan.cells)} cells")
    for cell in plan.cells:
        print(f"  {cell.id}  {cell.name}  {cell.gpu_hours:.3f} GPU-h  {' '.join(cell.command)}")
    return plan


def run_matrix(out: Path) -> soakmatrix.RunResult:
    def progress(event: soakmatrix.CellEvent) -> None:
        if event.kind == "finished":
            print(f"  {event.result.outcome.value:<6} {event.cell.name} after {event.result.exposure_s:.0f} s of load")

    with open(out / "run-progress.log", "w") as log:   # the progress lines `soakmatrix run` prints
        result = soakmatrix.run(TOUR, out=out / "run", progress=progress, log=log)
    print(f"run: exit {result.exit_code}, {len(result.results)} results, {len(result.findings)} findings; "
          f"JUnit {result.junit}, history {result.store}")
    return result


def bisect(out: Path) -> soakmatrix.FlagBisection:
    answer = soakmatrix.bisect_flags(DEMO, FAILING, virtual=True, seed=3, shrink=False,
                                     store=str(out / "bisect.sqlite"))
    print(f"bisect: {answer.status} (exit {answer.exit_code}): the smallest set that hangs is "
          f"{', '.join(answer.minimal_set)} ({answer.signature}), {answer.result.probes} probes in virtual time")
    return answer


def watch(out: Path) -> soakmatrix.WatchResult:
    with soakmatrix.simulated_server(log=out / "sim-engine.log") as server:
        watched = soakmatrix.watch(server.url, duration_s=3, canary_every_s=0.5, out=out / "incidents",
                                   on_note=lambda line: print(f"  watch: {line}"))
    print(f"watch: exit {watched.exit_code}, {len(watched.incidents)} incident(s)")
    return watched


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    show_plan()
    ran = run_matrix(out)
    found = bisect(out)
    watched = watch(out)
    ok = ran.exit_code == 0 and found.status == "found" and watched.exit_code == 0
    return 0 if ok else 1


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="soakmatrix-tour-"))
    sys.exit(main(folder))
