"""A named logger held at another level for the length of a block, then put back as it was.

vLLM logs to the stdout it saw at import while its parser validates a cell's flags (and `plan
--json` owns stdout); Ray says "ray.init() on this node will now connect to the new instance" when
our local cluster starts, which is not true (schedule/cluster.py keeps the address file as it was).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def logger_level(name: str, level: int) -> Iterator[None]:
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)
