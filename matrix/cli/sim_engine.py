"""`soakmatrix sim-engine`: the simulated vLLM server; the program itself lives with the engine (`jobs/sim/cli.py`)."""

from soakmatrix.jobs.sim.cli import HELP, configure, main

__all__ = ["HELP", "configure", "main"]
