"""The engine core <-> model-runner channel, shaped like vLLM's `shm_broadcast.MessageQueue`.

The engine core broadcasts each step to its model runners (worker processes for TP > 1, a thread
for TP = 1) and waits for their answers in `acquire_read`. While it waits past the step's expected
duration it logs vLLM's `No available shared memory broadcast block found in N seconds...` every
`VLLM_RINGBUFFER_WARNING_INTERVAL` seconds (divided by the time scale), and past
`VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS` (divided by the time scale) `acquire_read` raises TimeoutError,
which the caller turns into vLLM's `RPC call to sample_tokens timed out.`

The waits count from the end of the step's expected duration, so a legitimately slow step (a long
prefill) never warns or times out however much the clocks are scaled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from .proc import vlog

SHM_WARNING = (
    "No available shared memory broadcast block found in %d seconds. This typically happens "
    "when some processes are hanging or doing some time-consuming work (e.g. compilation, "
    "weight/kv cache quantization)."
)


class MessageQueue:
    def __init__(
        self,
        writers: Sequence[Connection],
        readers: Sequence[Connection],
        warning_interval_s: float,
        nominal_warning_interval_s: float,
    ) -> None:
        self.writers = list(writers)
        self.readers = list(readers)
        self.warning_interval_s = warning_interval_s
        self.nominal_warning_interval_s = nominal_warning_interval_s

    def enqueue(self, obj: Any) -> None:
        for conn in self.writers:
            conn.send(obj)

    def dequeue(self, expected_s: float, timeout_s: float | None, warning_interval_s: float | None = None) -> list[Any]:
        """Every reader's answer to the last broadcast."""
        return self.acquire_read(expected_s, timeout_s, warning_interval_s)

    def acquire_read(
        self, expected_s: float, timeout_s: float | None, warning_interval_s: float | None = None
    ) -> list[Any]:
        answers: list[Any] = [None] * len(self.readers)
        pending = dict(enumerate(self.readers))
        interval = self.warning_interval_s if warning_interval_s is None else warning_interval_s
        grace_end = time.monotonic() + max(0.0, expected_s) + 0.25
        next_warning = grace_end + interval
        deadline = None if timeout_s is None else grace_end + timeout_s
        while pending:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError
            if now >= next_warning:
                vlog(logging.INFO, "shm_broadcast.py:683", SHM_WARNING, self.nominal_warning_interval_s)
                next_warning += interval
            limit = next_warning if deadline is None else min(next_warning, deadline)
            for conn in wait(list(pending.values()), timeout=max(0.0, limit - now)):
                for index, c in list(pending.items()):
                    if c is conn:
                        answers[index] = c.recv()
                        del pending[index]
        return answers
