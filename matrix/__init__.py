"""What to run and how to decide: the matrix spec, the flag registry, planning and coverage,
scheduling, bisection, statistics and the `soakmatrix` CLI."""
