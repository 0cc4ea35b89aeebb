"""The simulated engine on a real GPU (`--torch-device cuda:0`): torch drives the device as a model
runner does, so a hang the hang model plants stalls in real CUDA and real collective calls.

- every model runner (a `VLLM::Worker_TP<i>` process, or the engine core's thread at TP 1) holds its
  weights on the device and multiplies with them each step, so NVML lists each engine process with
  memory of its own;
- `event_sync_stall`: `_to_list`'s transfer event is a CUDA event recorded behind a kernel that spins
  (`torch.cuda._sleep`), and the engine core waits in `Event.synchronize` -> `cuEventSynchronize`
  with the GPU busy, as seed 000 did;
- `shm_broadcast` at TP > 1: the silent worker enters a gloo all-reduce its peers never join (a lost
  collective: the others skipped it), the GPU idle, the engine core waiting on the shm ring;
- `silent_stall`: a host deadlock in `Scheduler.schedule` (scheduler.py's `lock_order_deadlock`: two
  threads, two locks, opposite orders), the GPU idle.

`--torch-device cpu` runs the same tree and collective with torch on the CPU (no CUDA event: the
event sync stall stays the simulator's own), so the process tree and the lost collective are tried
where there is no GPU. Gloo, not NCCL: the GPU tests put two workers on one GPU, which NCCL
refuses. torch is imported only here and only when `--torch-device` asks for it, and CUDA is first
touched after the workers are forked (a forked child cannot use a CUDA context its parent made).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

SPIN_CYCLES = 1 << 50  # torch.cuda._sleep: days of one SM spinning at any clock a GPU has
WEIGHTS = (2048, 2048)  # float32: 16 MiB a model runner holds, so NVML lists the process
COLLECTIVE_TIMEOUT = datetime.timedelta(days=1)  # gloo's own timeout must not end the lost collective


def _torch() -> Any:
    import torch

    return torch


@dataclass
class DeviceRunner:
    """One model runner's share of the device: weights, a step's work, and its place in the TP group."""

    device: str
    rank: int = 0
    world: int = 1
    store: str | None = None  # where gloo's ranks meet (TP > 1): an init_method such as tcp://127.0.0.1:PORT

    def __post_init__(self) -> None:
        torch = _torch()
        if self.cuda:
            torch.cuda.set_device(torch.device(self.device))
        self.weights = torch.randn(*WEIGHTS, device=self.device)
        self.group = None
        if self.world > 1 and self.store:
            import torch.distributed as dist

            dist.init_process_group(
                "gloo", init_method=self.store, rank=self.rank, world_size=self.world, timeout=COLLECTIVE_TIMEOUT
            )
            self.group = dist.group.WORLD

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def step(self) -> None:
        """A matmul with the weights, waited for: the device is really used each step."""
        (self.weights @ self.weights[:, :64]).sum()
        if self.cuda:
            _torch().cuda.current_stream().synchronize()

    def lost_all_reduce(self) -> None:
        """Enter an all-reduce no other rank joins: the worker waits for peers that never arrive."""
        torch = _torch()
        import torch.distributed as dist

        if self.group is None:
            raise RuntimeError("a lost collective needs TP > 1 (a gloo group of the workers)")
        dist.all_reduce(torch.ones(1))


class CudaTransferEvent:
    """vLLM's `_to_list` transfer event as a real CUDA event (the sim's `_TransferEvent` interface)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.stuck = False

    def synchronize(self) -> None:
        torch = _torch()
        with torch.cuda.device(torch.device(self.device)):
            if self.stuck:
                torch.cuda._sleep(SPIN_CYCLES)  # the kernel that never finishes
            event = torch.cuda.Event()
            event.record()
            event.synchronize()
