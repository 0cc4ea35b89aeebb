"""The simulated engine core's scheduler: requests, continuous batching, the KV cache, a prefix cache.

Each step schedules running requests first, then waiting ones while `--max-num-seqs` slots and the
`--max-num-batched-tokens` budget last; chunked prefill splits long prompts; the prefix cache skips
shared prompt blocks; a full KV cache preempts the newest request. `update_from_output` samples the
step's tokens (seeded per request, so a prompt's text does not depend on its batch) and copies them
back through `_to_list`, as vLLM's model runner does.

Two hangs park the engine core's busy thread here, in frames named as vLLM's: `silent_stall` in
`Scheduler.schedule`, `event_sync_stall` in `_to_list` -> `_TransferEvent.synchronize`.
"""

from __future__ import annotations

import random
import threading
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from .args import BLOCK_SIZE, SimConfig
from .text import VOCAB


@dataclass(eq=False)
class CoreRequest:
    id: str
    prompt: list[int]
    max_tokens: int
    token_rng: random.Random
    spec_rng: random.Random
    output: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is computed
    target: int = 0  # tokens to prefill before decoding (prompt, + output after preemption)
    blocks: int = 0
    admitted: bool = False  # counted in the prefix-cache stats
    first_token_sent: bool = False

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.target

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.output)


@dataclass
class ScheduledItem:
    req: CoreRequest
    tokens: int
    prefill: bool


@dataclass
class SchedulerOutput:
    items: list[ScheduledItem]
    step: int

    @property
    def total_tokens(self) -> int:
        return sum(i.tokens for i in self.items)

    def describe(self) -> str:
        new = [i.req.id for i in self.items if i.prefill and i.req.num_computed == 0]
        cached = [i.req.id for i in self.items if i.req.id not in new]
        return (
            f"SchedulerOutput(scheduled_new_reqs={new!r}, scheduled_cached_reqs=CachedRequestData("
            f"req_ids={cached!r}), num_scheduled_tokens={ {i.req.id: i.tokens for i in self.items}!r}, "
            f"total_num_scheduled_tokens={self.total_tokens}, scheduled_spec_decode_tokens={{}}, "
            f"num_common_prefix_blocks=[0], finished_req_ids=[], free_encoder_mm_hashes=[])"
        )


class TransferEvent(Protocol):
    """What `_to_list` waits on: `_TransferEvent` here, `torch_device.CudaTransferEvent` on a GPU."""

    stuck: bool

    def synchronize(self) -> None: ...


class _TransferEvent:
    """Stands for the CUDA event vLLM's model runner waits on when it copies sampled tokens to the host."""

    def __init__(self) -> None:
        self.stuck = False
        self._never = threading.Event()

    def synchronize(self) -> None:
        while self.stuck:  # seed 000: cuEventSynchronize never returns
            self._never.wait(0.5)


def _to_list(sampled: list[list[int]], event: TransferEvent) -> list[list[int]]:
    """vLLM's `_to_list`: wait for the device->host copy of the sampled token ids, then read them."""
    event.synchronize()
    return [list(t) for t in sampled]


def lock_order_deadlock() -> None:
    """A host deadlock (`--torch-device`'s silent_stall): this thread takes the scheduler's lock then
    the block pool's, a KV-events thread the other way round, each after the other holds its first."""
    scheduler_lock, block_pool_lock = threading.Lock(), threading.Lock()
    both_held = threading.Barrier(2)

    def publish_kv_events() -> None:
        with block_pool_lock:
            both_held.wait()
            with scheduler_lock:
                pass

    threading.Thread(target=publish_kv_events, name="kv-events", daemon=True).start()
    with scheduler_lock:
        both_held.wait()
        with block_pool_lock:
            pass


class Scheduler:
    def __init__(self, config: SimConfig, num_gpu_blocks: int) -> None:
        f = config.flags
        self.max_num_seqs = int(f["max_num_seqs"])
        self.budget = config.max_num_batched_tokens
        self.chunked = bool(f["chunked_prefill"])
        self.prefix_caching = bool(f["prefix_caching"])
        self.spec_k = config.spec_tokens
        self.max_model_len = config.max_model_len
        self.total_blocks = num_gpu_blocks
        self.free_blocks = num_gpu_blocks
        self.waiting: deque[CoreRequest] = deque()
        self.running: list[CoreRequest] = []
        self.by_id: dict[str, CoreRequest] = {}
        self.prefix: OrderedDict[int, None] = OrderedDict()
        self.step_counter = 0
        self.transfer_event: TransferEvent = _TransferEvent()
        self.stalled = False
        self.stall_as_deadlock = bool(config.torch_device)  # the GPU tree's host stall: a true deadlock
        self._never = threading.Event()
        self._reset_step_stats()

    def _reset_step_stats(self) -> None:
        self.stat_preempted = 0
        self.stat_prefix_requests = 0
        self.stat_prefix_queries = 0
        self.stat_prefix_hits = 0

    # -- queue management
    def add(self, req: CoreRequest) -> None:
        req.target = len(req.prompt)
        self.waiting.append(req)
        self.by_id[req.id] = req

    def abort(self, req_id: str) -> None:
        req = self.by_id.pop(req_id, None)
        if req is None:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._free(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0

    # -- KV blocks and the prefix cache
    def _free(self, req: CoreRequest) -> None:
        self.free_blocks += req.blocks
        req.blocks = 0

    @staticmethod
    def _blocks_for(tokens: int) -> int:
        return -(-tokens // BLOCK_SIZE)

    def _block_hashes(self, tokens: list[int]) -> list[int]:
        hashes, h = [], 0
        for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
            h = zlib.crc32(repr((h, tokens[start : start + BLOCK_SIZE])).encode())
            hashes.append(h)
        return hashes

    def _cached_tokens(self, req: CoreRequest) -> int:
        if not self.prefix_caching or req.num_computed:
            return 0
        hit = 0
        for h in self._block_hashes(req.prompt):
            if h not in self.prefix:
                break
            hit += BLOCK_SIZE
        return min(hit, len(req.prompt) - 1)  # vLLM always computes the last prompt token

    def _remember_prefix(self, req: CoreRequest) -> None:
        if not self.prefix_caching:
            return
        for h in self._block_hashes(req.prompt):
            self.prefix[h] = None
            self.prefix.move_to_end(h)
        while len(self.prefix) > self.total_blocks:
            self.prefix.popitem(last=False)

    def _preempt_last(self) -> CoreRequest:
        victim = self.running.pop()
        self._free(victim)
        victim.num_computed = 0
        victim.target = len(victim.prompt) + len(victim.output)
        self.waiting.appendleft(victim)
        self.stat_preempted += 1
        return victim

    # -- one step
    def schedule(self) -> SchedulerOutput:
        if self.stalled:
            self._stall()
        self.step_counter += 1
        self._reset_step_stats()
        budget = self.budget
        items: list[ScheduledItem] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.prefilling:
                n = req.target - req.num_computed
                if self.chunked:
                    n = min(n, budget)
                elif n > budget:
                    i += 1
                    continue
            else:
                n = min(1 + self.spec_k, budget)
            need = self._blocks_for(req.num_computed + n) - req.blocks
            while need > self.free_blocks and self.running[-1] is not req:
                self._preempt_last()
                preempted = True
            if need > self.free_blocks:  # only this request is left to give room: it waits
                self._preempt_last()
                preempted = True
                break
            self.free_blocks -= need
            req.blocks += need
            items.append(ScheduledItem(req, n, req.prefilling))
            budget -= n
            i += 1
        while not preempted and self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            cached = self._cached_tokens(req)
            n = req.target - max(req.num_computed, cached)
            if self.chunked:
                n = min(n, budget)
            elif n > budget:
                break
            need = self._blocks_for(max(req.num_computed, cached) + n) - req.blocks
            if need > self.free_blocks:
                break
            self.waiting.popleft()
            if not req.admitted:
                req.admitted = True
                self.stat_prefix_requests += 1
                self.stat_prefix_queries += len(req.prompt)
                self.stat_prefix_hits += cached
            req.num_computed = max(req.num_computed, cached)
            self.free_blocks -= need
            req.blocks += need
            self.running.append(req)
            items.append(ScheduledItem(req, n, True))
            budget -= n
        return SchedulerOutput(items, self.step_counter)

    def _stall(self) -> None:
        if self.stall_as_deadlock:
            lock_order_deadlock()
        while True:  # silent_stall: the scheduler step never returns
            self._never.wait(0.5)

    def update_from_output(
        self, sched: SchedulerOutput, spec: dict[str, Any] | None
    ) -> tuple[list[tuple[str, list[int], str | None]], int, int]:
        """Advance the scheduled requests; returns outputs, prompt tokens and generated tokens."""
        sampled: list[list[int]] = []
        for item in sched.items:
            req = item.req
            if item.prefill:
                req.num_computed += item.tokens
                if req.prefilling or req.remaining <= 0:
                    sampled.append([])
                    continue
                if not req.first_token_sent:
                    self._remember_prefix(req)
                sampled.append([req.token_rng.randrange(len(VOCAB))])
            else:
                accepted = 0
                if self.spec_k:
                    for pos in range(min(self.spec_k, item.tokens - 1)):
                        if req.spec_rng.random() >= 0.8 * (0.75**pos):
                            break
                        accepted += 1
                    if spec is not None:
                        spec["drafts"] += 1
                        spec["draft_tokens"] += self.spec_k
                        spec["accepted"] += accepted
                        for pos in range(accepted):
                            spec["accepted_pos"][pos] += 1
                new = min(1 + accepted, req.remaining)
                sampled.append([req.token_rng.randrange(len(VOCAB)) for _ in range(new)])
        token_lists = _to_list(sampled, self.transfer_event)
        outputs: list[tuple[str, list[int], str | None]] = []
        prompt_tokens = gen_tokens = 0
        for item, tokens in zip(sched.items, token_lists, strict=True):
            req = item.req
            if not tokens:
                continue
            if not item.prefill:
                req.num_computed += len(tokens)
            if not req.first_token_sent:
                req.first_token_sent = True
                prompt_tokens += len(req.prompt)
            req.output.extend(tokens)
            gen_tokens += len(tokens)
            finish = "length" if req.remaining <= 0 else None
            if finish:
                self.running.remove(req)
                self.by_id.pop(req.id, None)
                self._free(req)
            outputs.append((req.id, tokens, finish))
        return outputs, prompt_tokens, gen_tokens

    def stats_text(self) -> str:
        return (
            f"SchedulerStats(num_running_reqs={len(self.running)}, num_waiting_reqs={len(self.waiting)}, "
            f"step_counter={self.step_counter}, current_wave=0, kv_cache_usage={self.kv_usage():.3f}, "
            f"prefix_cache_stats=PrefixCacheStats(reset=False, requests={self.stat_prefix_requests}, "
            f"queries={self.stat_prefix_queries}, hits={self.stat_prefix_hits}), "
            f"spec_decoding_stats={'None' if not self.spec_k else 'SpecDecodingStats(...)'}, "
            f"num_corrupted_reqs=0)"
        )
