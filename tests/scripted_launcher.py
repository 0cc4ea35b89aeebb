"""A fake of the scheduler's launcher (`matrix.schedule.loop.Launcher`) for the soak oracles' tests:
it answers each soak job at once through `script(spec, n)` (n: the job's number, from 1) and keeps
the specs it was given, so a test checks what each probe's job was asked to do without Ray;
`most_at_once` is the most jobs it held at one time (submitted, not yet collected)."""

from __future__ import annotations


class ScriptedLauncher:
    def __init__(self, script, gpus: int = 8, gpu_type: str = "H200"):
        self.script, self.specs, self._pending = script, [], {}
        self.gpus, self.gpu_type = gpus, gpu_type
        self.most_at_once = 0

    def submit(self, spec, ray_label, avoid_nodes, cap_s):
        self.specs.append(spec)
        self._pending[len(self.specs)] = spec
        self.most_at_once = max(self.most_at_once, len(self._pending))
        return len(self.specs)

    def wait(self, handles, timeout_s):
        return [h for h in handles if h in self._pending]

    def result(self, handle):
        return self.script(self._pending.pop(handle), handle)

    def cancel(self, handle, force):
        self._pending.pop(handle, None)

    def nodes(self):
        from soakmatrix.matrix.schedule.placement import Node

        return [Node("n1", self.gpus, frozenset({self.gpu_type}))]

    def started(self):
        return []
