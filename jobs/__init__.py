"""What runs on one node for one cell: engines, load, watchdog, evidence, signatures, teardown."""
