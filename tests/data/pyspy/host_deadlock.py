"""An engine core that deadlocks on the host, shaped as vLLM's: the scheduler takes the scheduler lock,
then the block pool's; a KV-events thread takes them the other way round. Pure standard library, so
every Python on a node can run it, and `py-spy dump --native` of it under two versions shows which
frames are the interpreter's (tests/test_fingerprint_versions.py). `--where update` parks the
scheduler in another function: another bug, another fingerprint.

    exec -a VLLM::EngineCore python3.12 tests/data/pyspy/host_deadlock.py [--where schedule|update]
"""

from __future__ import annotations

import sys
import threading
import time

SCHEDULER_LOCK = threading.Lock()
BLOCK_POOL_LOCK = threading.Lock()
BOTH_HELD = threading.Barrier(2)


class BlockPool:
    def take_events(self) -> None:
        with BLOCK_POOL_LOCK:
            BOTH_HELD.wait()
            with SCHEDULER_LOCK:
                pass


class KVEventPublisher:
    def run(self) -> None:
        BlockPool().take_events()


class KVCacheManager:
    def allocate_slots(self) -> None:
        with BLOCK_POOL_LOCK:
            pass


class Scheduler:
    def __init__(self, where: str) -> None:
        self.where = where
        self.kv_cache_manager = KVCacheManager()

    def schedule(self) -> None:
        with SCHEDULER_LOCK:
            if self.where == "schedule":
                BOTH_HELD.wait()
                self.kv_cache_manager.allocate_slots()

    def update_from_output(self) -> None:
        with SCHEDULER_LOCK:
            if self.where == "update":
                BOTH_HELD.wait()
                self.kv_cache_manager.allocate_slots()


class EngineCore:
    def __init__(self, where: str) -> None:
        self.scheduler = Scheduler(where)

    def step(self) -> None:
        self.scheduler.schedule()
        self.scheduler.update_from_output()

    def run_busy_loop(self) -> None:
        while True:
            self.step()
            time.sleep(0.001)


def main() -> None:
    where = sys.argv[sys.argv.index("--where") + 1] if "--where" in sys.argv else "schedule"
    threading.Thread(target=KVEventPublisher().run, name="kv-events", daemon=True).start()
    print("ready", flush=True)
    EngineCore(where).run_busy_loop()


if __name__ == "__main__":
    main()
