"""`soakmatrix watch`: guard a running vLLM server, catch a hang in seconds, keep the evidence.

The soak job watches a server it started under its own load; this package watches someone else's
server under their traffic and idle hours. `loop.py` decides (pure: observations in, state, canary
and verdict out), `detectors.py` holds the passive variants of the soak's detectors, `canary.py`
sends the tiny liveness request, `target.py` finds the server's processes, `logsource.py` follows
its log, `incident.py` keeps the evidence and runs the user's hook, `metrics.py` exports our own
Prometheus metrics, `bounded_http.py` gives every request a total deadline and a size cap, and
`runner.py` wires them to the soak's `Watchdog` observer.
"""
