"""The shared contracts: what the planner (`matrix/`), the node-side job (`jobs/`) and the reports
(`reports/`) all read. Outcomes and exit codes, the cell result, the flag registry, workload kinds,
the hang-model file, the YAML source with line numbers, durations, and the statistics of hangs.

Nothing here imports any other part of soakmatrix, so every side can depend on it without a cycle
(tests/test_import_rule.py holds that).
"""
