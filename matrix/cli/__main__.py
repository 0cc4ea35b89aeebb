"""`python -m soakmatrix.matrix.cli ...`: the `soakmatrix` command when the console script is not on PATH."""

import sys

from . import main

sys.exit(main())
