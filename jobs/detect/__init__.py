"""Hang detectors: one per file, each a pure state machine over what the watchdog observes.

The interface, the observations and the registry are in `protocol.py`; `progress.py` (tokens flat
while requests run), `stream.py` (no token on any open stream), `logs.py` (vLLM's own warning and
error lines), `exit.py` (the server process died) and `errors.py` (a dead engine behind a living API
server) register themselves there. A new detector is a new file plus its name in `load_builtin`.
"""
