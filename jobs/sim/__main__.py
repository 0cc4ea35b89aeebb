"""`python -m soakmatrix.jobs.sim MODEL [vllm serve flags ...]`: how the soak job starts the simulated server.

The same program as `soakmatrix sim-engine`, started without the planner's CLI so the node-side job
depends on nothing but `jobs/` and the shared contracts.
"""

import sys

from .cli import run

try:
    sys.exit(run(sys.argv[1:]))
except KeyboardInterrupt:
    sys.exit(130)
