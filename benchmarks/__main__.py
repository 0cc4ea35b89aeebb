"""Run every benchmark in turn: `python -m benchmarks` (long; each module also runs alone)."""

import importlib
import pkgutil
import sys
from pathlib import Path

if __name__ == "__main__":
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    for name in names:
        print(f"== {name}", flush=True)
        module = importlib.import_module(f"benchmarks.{name}")
        if hasattr(module, "main"):
            module.main(sys.argv[1:])
