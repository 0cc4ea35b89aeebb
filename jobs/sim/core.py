"""The simulated engine core: continuous batching, realistic step times, a prefix cache, and hangs.

Runs in its own process (`VLLM::EngineCore`, forked by the API server), like vLLM V1's EngineCore:
requests arrive on an input queue, each step is scheduled (running requests first, then waiting
ones while `--max-num-seqs` slots and the `--max-num-batched-tokens` budget last; chunked prefill
splits long prompts; the prefix cache skips shared prompt blocks; a full KV cache preempts the
newest request), broadcast to the model runners (worker processes `VLLM::Worker_TP<i>` for TP > 1,
a thread for TP = 1) which spend the step's time, and the sampled tokens go back to the API server
with the scheduler's stats.

Step times are not scaled by `--time-scale`: a decode step costs about 10 ms plus 0.2 ms per
sequence, a prefill about 0.25 ms per token plus attention over the context, so a long prompt
without chunking makes a legitimately slow step of seconds.

Hangs (see `hangs.py` for when): `silent_stall` parks this process's busy thread in
`Scheduler.schedule`; `event_sync_stall` parks it in `_to_list` -> `_TransferEvent.synchronize`;
`shm_broadcast` silences one model runner while this thread waits in
`shm_broadcast.MessageQueue.acquire_read` (warnings, then `RPC call to sample_tokens timed out`,
a fatal error); `crash` raises in the step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import random
import sys
import threading
import time
import zlib
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, load_or_empty

from .args import BLOCK_SIZE, SimConfig
from .hangs import ArmedHang, HangClock, arm
from .proc import die_with_parent, reset_child_signals, set_process_title, setup_process_logging, vlog
from .shm_broadcast import MessageQueue
from .text import VOCAB

VLLM_VERSION = "0.33.0"
DEFAULT_GPU_BLOCKS = 8192          # per GPU, 16 tokens each (131,072 tokens)


def env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass
class Clocks:
    """vLLM's clocks for this run, before and after `--time-scale`."""

    time_scale: float
    stats_interval_nominal: float
    ring_warning_nominal: float
    rpc_timeout_nominal: float

    STATS_FLOOR_S = 0.5

    @classmethod
    def from_env(cls, time_scale: float) -> "Clocks":
        return cls(time_scale,
                   env_seconds("VLLM_LOG_STATS_INTERVAL", 10.0),
                   env_seconds("VLLM_RINGBUFFER_WARNING_INTERVAL", 60.0),
                   env_seconds("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", 300.0))

    @property
    def stats_interval_s(self) -> float:
        return max(self.STATS_FLOOR_S, self.stats_interval_nominal / self.time_scale)

    @property
    def ring_warning_s(self) -> float:
        return max(0.01, self.ring_warning_nominal / self.time_scale)

    @property
    def rpc_timeout_s(self) -> float:
        return max(0.01, self.rpc_timeout_nominal / self.time_scale)


# ----------------------------------------------------------------------------------------------
# requests and the scheduler


@dataclass(eq=False)
class CoreRequest:
    id: str
    prompt: list[int]
    max_tokens: int
    token_rng: random.Random
    spec_rng: random.Random
    output: list[int] = field(default_factory=list)
    num_computed: int = 0           # tokens whose KV is computed
    target: int = 0                 # tokens to prefill before decoding (prompt, + output after preemption)
    blocks: int = 0
    admitted: bool = False          # counted in the prefix-cache stats
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
        return (f"SchedulerOutput(scheduled_new_reqs={new!r}, scheduled_cached_reqs=CachedRequestData("
                f"req_ids={cached!r}), num_scheduled_tokens={ {i.req.id: i.tokens for i in self.items} !r}, "
                f"total_num_scheduled_tokens={self.total_tokens}, scheduled_spec_decode_tokens={{}}, "
                f"num_common_prefix_blocks=[0], finished_req_ids=[], free_encoder_mm_hashes=[])")


class _TransferEvent:
    """Stands for the CUDA event vLLM's model runner waits on when it copies sampled tokens to the host."""

    def __init__(self) -> None:
        self.stuck = False
        self._never = threading.Event()

    def synchronize(self) -> None:
        while self.stuck:      # seed 000: cuEventSynchronize never returns
            self._never.wait(0.5)


def _to_list(sampled: list[list[int]], event: _TransferEvent) -> list[list[int]]:
    """vLLM's `_to_list`: wait for the device->host copy of the sampled token ids, then read them."""
    event.synchronize()
    return [list(t) for t in sampled]


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
        self.transfer_event = _TransferEvent()
        self.stalled = False
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
            h = zlib.crc32(repr((h, tokens[start:start + BLOCK_SIZE])).encode())
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
        return min(hit, len(req.prompt) - 1)    # vLLM always computes the last prompt token

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
            if need > self.free_blocks:        # only this request is left to give room: it waits
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
        while True:            # silent_stall: the scheduler step never returns
            self._never.wait(0.5)

    def update_from_output(self, sched: SchedulerOutput, spec: dict[str, Any] | None
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
                        if req.spec_rng.random() >= 0.8 * (0.75 ** pos):
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
        for item, tokens in zip(sched.items, token_lists):
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
        return (f"SchedulerStats(num_running_reqs={len(self.running)}, num_waiting_reqs={len(self.waiting)}, "
                f"step_counter={self.step_counter}, current_wave=0, kv_cache_usage={self.kv_usage():.3f}, "
                f"prefix_cache_stats=PrefixCacheStats(reset=False, requests={self.stat_prefix_requests}, "
                f"queries={self.stat_prefix_queries}, hits={self.stat_prefix_hits}), "
                f"spec_decoding_stats={'None' if not self.spec_k else 'SpecDecodingStats(...)'}, "
                f"num_corrupted_reqs=0)")


def step_time_s(config: SimConfig, sched: SchedulerOutput, rng: random.Random) -> float:
    """How long a GPU would take for this step (not scaled by --time-scale)."""
    if not sched.items:
        return 0.0
    f = config.flags
    decode = [i for i in sched.items if not i.prefill]
    prefill = [i for i in sched.items if i.prefill]
    t_decode = 0.008 + 0.00022 * len(decode) + 2e-8 * sum(i.req.num_computed for i in decode)
    if config.spec_tokens and decode:
        t_decode *= 1.0 + 0.12 * config.spec_tokens
    if f.get("enforce_eager") or f.get("cudagraph_mode") == "NONE":
        t_decode *= 1.5
    t_prefill = sum(0.00025 * i.tokens + 1.5e-8 * i.tokens * (i.req.num_computed + i.tokens) for i in prefill)
    tp = int(f.get("tp") or 1)
    t = (t_decode + t_prefill) / tp ** 0.8 + (0.0005 * math.log2(tp) if tp > 1 else 0.0)
    return max(0.001, t * (1.0 + max(-0.1, min(0.1, rng.gauss(0.0, 0.04)))))


# ----------------------------------------------------------------------------------------------
# model runners: worker processes (TP > 1) or a thread (TP = 1)


def sample_tokens_stuck() -> None:
    """The model runner of an shm_broadcast hang: it never answers the engine core again."""
    never = threading.Event()
    while True:
        never.wait(1.0)


def execute_model(step: dict[str, Any], rank: int) -> None:
    if step.get("hang_rank") == rank:
        sample_tokens_stuck()
    if step["step_s"] > 0:
        time.sleep(step["step_s"])


def runner_loop(inbox: Any, outbox: Any, rank: int) -> None:
    while True:
        try:
            step = inbox.recv()
        except (EOFError, OSError):
            return
        if step is None:
            return
        execute_model(step, rank)
        try:
            outbox.send(rank)
        except (BrokenPipeError, OSError):
            return


def _worker_main(inbox: Any, outbox: Any, rank: int, config: SimConfig, parent_pid: int) -> None:
    set_process_title(f"VLLM::Worker_TP{rank}")
    die_with_parent(parent_pid)
    reset_child_signals()
    setup_process_logging(f"Worker_TP{rank}")
    vlog(logging.INFO, "parallel_state.py:1325",
         "rank %d in world size %d is assigned as DP rank 0, PP rank 0, TP rank %d, EP rank %d",
         rank, config.flags["tp"], rank, rank)
    runner_loop(inbox, outbox, rank)
    os._exit(0)


class Executor:
    def __init__(self, config: SimConfig, clocks: Clocks) -> None:
        import multiprocessing as mp

        self.tp = int(config.flags["tp"])
        self.clocks = clocks
        ctx = mp.get_context("fork")
        writers, readers = [], []
        self.procs: list[Any] = []
        self.threads: list[threading.Thread] = []
        for rank in range(self.tp):
            in_r, in_w = ctx.Pipe(duplex=False)
            out_r, out_w = ctx.Pipe(duplex=False)
            writers.append(in_w)
            readers.append(out_r)
            if self.tp == 1:
                t = threading.Thread(target=runner_loop, args=(in_r, out_w, rank), name="model-runner", daemon=True)
                t.start()
                self.threads.append(t)
            else:
                p = ctx.Process(target=_worker_main, args=(in_r, out_w, rank, config, os.getpid()),
                                name=f"Worker_TP{rank}", daemon=False)
                p.start()
                in_r.close()
                out_w.close()
                self.procs.append(p)
        self.mq = MessageQueue(writers, readers, clocks.ring_warning_s, int(clocks.ring_warning_nominal))
        self.hang_rank: int | None = None
        self.crash_next = False

    def execute_model(self, step_s: float) -> None:
        if self.crash_next:
            raise RuntimeError(
                "CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")
        msg = {"step_s": step_s}
        if self.hang_rank is not None:
            msg["hang_rank"] = self.hang_rank
        self.mq.enqueue(msg)

    def sample_tokens(self, step_s: float) -> list[Any]:
        # Only a planted hang runs on the scaled clocks: a worker that is merely slow (two busy cores,
        # a long prefill) waits on vLLM's real ones, so the simulator never invents a hang of its own.
        planted = self.hang_rank is not None
        timeout = self.clocks.rpc_timeout_s if planted else self.clocks.rpc_timeout_nominal
        warning = self.clocks.ring_warning_s if planted else self.clocks.ring_warning_nominal
        try:
            return self.mq.dequeue(step_s, timeout, warning)
        except TimeoutError as exc:
            raise TimeoutError("RPC call to sample_tokens timed out.") from exc

    def shutdown(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=2)


# ----------------------------------------------------------------------------------------------
# the engine core


class EngineCore:
    def __init__(self, config: SimConfig, inbox: Any, outbox: Any, clocks: Clocks) -> None:
        self.config = config
        self.inbox = inbox
        self.outbox = outbox
        self.clocks = clocks
        tp = int(config.flags["tp"])
        per_gpu = config.num_gpu_blocks or DEFAULT_GPU_BLOCKS
        if config.flags.get("kv_cache_dtype", "auto").startswith("fp8"):
            per_gpu *= 2
        self.num_gpu_blocks = per_gpu if config.num_gpu_blocks else per_gpu * tp
        self.scheduler = Scheduler(config, self.num_gpu_blocks)
        self.rng = random.Random(f"soakmatrix-sim-steps:{config.seed}")
        self.hang_model = load_or_empty(config.hang_model)
        self.clock = HangClock(arm(self.hang_model, config.flags, config.gpu_type, config.seed,
                                   config.time_scale))
        self.executor = Executor(config, clocks)
        self.hung: ArmedHang | None = None

    def spec_text(self) -> str:
        c = self.config
        if not c.spec_tokens:
            return "None"
        method = "mtp" if c.flags.get("mtp") else "ngram"
        return f"SpeculativeConfig(method='{method}', num_spec_tokens={c.spec_tokens})"

    def log_startup(self) -> None:
        c = self.config
        f = c.flags
        spec = self.spec_text()
        vlog(logging.INFO, "core.py:93",
             "Initializing a V1 LLM engine (v%s) with config: model=%r, speculative_config=%s, tokenizer=%r, "
             "dtype=torch.bfloat16, max_seq_len=%d, tensor_parallel_size=%d, pipeline_parallel_size=1, "
             "data_parallel_size=1, quantization=None, enforce_eager=%s, kv_cache_dtype=%s, device_config=cuda, "
             "seed=%d, served_model_name=%s, enable_prefix_caching=%s, enable_chunked_prefill=%s, "
             "async_scheduling=%s, compilation_config={\"cudagraph_mode\": %r}",
             VLLM_VERSION, c.model, spec, c.model, c.max_model_len, f["tp"], f["enforce_eager"],
             f["kv_cache_dtype"], c.seed, c.model_name, f["prefix_caching"], f["chunked_prefill"],
             f["async_scheduling"], f["cudagraph_mode"])
        vlog(logging.INFO, "gpu_model_runner.py:2957", "Model loading took 1.21 GiB memory and 0.42 seconds")
        tokens = self.num_gpu_blocks * BLOCK_SIZE
        vlog(logging.INFO, "kv_cache_utils.py:1087", "GPU KV cache size: %s tokens", f"{tokens:,}")
        vlog(logging.INFO, "kv_cache_utils.py:1091", "Maximum concurrency for %s tokens per request: %.2fx",
             f"{c.max_model_len:,}", tokens / c.max_model_len)
        for a in self.clock.armed:
            vlog(logging.DEBUG, "sim_hangs.py:1", "armed hang %s (%s): effective MTTF %.1f s, fires after %.3f s "
                 "of load (time scale %g)", a.hang.id, a.hang.style, a.mttf_s, a.fires_after_s, c.time_scale)
        vlog(logging.INFO, "core.py:220", "init engine (profile, create kv cache, warmup model) took 0.51 seconds")

    # -- messages from the API server
    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "add":
            _, req_id, prompt, max_tokens, req_seed = msg
            salt = f"{self.config.seed}:{req_seed}:{zlib.crc32(repr(prompt).encode())}"
            self.scheduler.add(CoreRequest(req_id, prompt, max_tokens, random.Random("tok:" + salt),
                                           random.Random("spec:" + salt)))
        elif kind == "abort":
            self.scheduler.abort(msg[1])
        elif kind == "shutdown":
            raise SystemExit(0)

    def _drain(self, timeout: float) -> None:
        try:
            msg = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        self._handle(msg)
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(msg)

    # -- the busy loop
    def run(self) -> None:
        self.outbox.put(("ready", {"num_gpu_blocks": self.num_gpu_blocks, "pid": os.getpid()}))
        last = time.monotonic()
        while True:
            running = len(self.scheduler.running)
            if self.scheduler.has_work() or self.hung is not None:
                self._drain(0)
            else:
                deadline = self.clock.next_deadline(0)
                self._drain(0.25 if deadline is None else min(0.25, max(0.001, deadline)))
            if self.scheduler.has_work() or self.hung is not None:
                self._step()
            now = time.monotonic()
            fired = self.clock.advance(now - last, running)
            last = now
            if fired is not None and self.hung is None:
                self._begin_hang(fired)

    @contextmanager
    def log_error_detail(self, sched: SchedulerOutput) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, SystemExit):
                c = self.config
                vlog(logging.ERROR, "dump_input.py:69",
                     "Dumping input data for V1 LLM engine (v%s) with config: model=%r, tensor_parallel_size=%d, "
                     "speculative_config=%s, enforce_eager=%s, seed=%d", VLLM_VERSION, c.model, c.flags["tp"],
                     self.spec_text(), c.flags["enforce_eager"], c.seed)
                vlog(logging.ERROR, "dump_input.py:76", "Dumping scheduler output for model execution: %s",
                     sched.describe())
                vlog(logging.ERROR, "dump_input.py:79", "Dumping scheduler stats: %s", self.scheduler.stats_text())
            raise

    def _step(self) -> None:
        sched = self.scheduler.schedule()          # silent_stall never returns from here
        step_s = step_time_s(self.config, sched, self.rng) * self.config.step_time_scale
        with self.log_error_detail(sched):
            self.executor.execute_model(step_s)     # crash raises here
            self.executor.sample_tokens(step_s)     # shm_broadcast: warnings, then TimeoutError
        spec = None
        if self.scheduler.spec_k:
            k = self.scheduler.spec_k
            spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_pos": [0] * k}
        outputs, prompt_tokens, gen_tokens = self.scheduler.update_from_output(sched, spec)  # event_sync_stall
        s = self.scheduler
        self.outbox.put(("out", {
            "outputs": outputs,
            "running": len(s.running), "waiting": len(s.waiting), "kv": s.kv_usage(),
            "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "iter_tokens": sched.total_tokens,
            "preempted": s.stat_preempted, "prefix_requests": s.stat_prefix_requests,
            "prefix_queries": s.stat_prefix_queries, "prefix_hits": s.stat_prefix_hits, "spec": spec,
            "step_s": step_s,
        }))

    # -- hangs
    def _begin_hang(self, armed: ArmedHang) -> None:
        self.hung = armed
        style = armed.hang.style
        record = {
            "hang_id": armed.hang.id, "style": style, "signature": STYLE_SIGNATURE[style],
            "began_at": time.time(), "engine_time_s": round(self.clock.exposure_s, 6),
            "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
            "mttf_s": armed.mttf_s, "fires_after_s": armed.fires_after_s, "accrued_s": round(armed.accrued_s, 6),
            "time_scale": self.config.time_scale, "pid": os.getpid(),
        }
        if self.config.hang_record:
            path = self.config.hang_record
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, sort_keys=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        vlog(logging.DEBUG, "sim_core.py:1", "soakmatrix sim: hang %s (%s) began: %s",
             armed.hang.id, style, json.dumps(record, sort_keys=True))
        if style == "silent_stall":
            self.scheduler.stalled = True
        elif style == "event_sync_stall":
            self.scheduler.transfer_event.stuck = True
        elif style == "shm_broadcast":
            self.executor.hang_rank = self.executor.tp - 1
        elif style == "crash":
            self.executor.crash_next = True


def run_engine_core(config: SimConfig, inbox: Any, outbox: Any, parent_pid: int) -> None:
    """The engine-core process's entry point (after fork from the API server `parent_pid`)."""
    set_process_title("VLLM::EngineCore")
    die_with_parent(parent_pid)
    reset_child_signals()
    setup_process_logging("EngineCore_DP0")
    core: EngineCore | None = None
    code = 1
    try:
        clocks = Clocks.from_env(config.time_scale)
        core = EngineCore(config, inbox, outbox, clocks)
        core.log_startup()
        core.run()
    except SystemExit:
        code = 0
    except BaseException as exc:  # noqa: BLE001 - the engine's last word
        if core is None:
            vlog(logging.ERROR, "core.py:708", "EngineCore failed to start.", exc_info=True)
        else:
            vlog(logging.ERROR, "core.py:866", "EngineCore encountered a fatal error.", exc_info=True)
        try:
            outbox.put(("dead", f"{type(exc).__name__}: {exc}"))
        except Exception:  # noqa: BLE001
            pass
    finally:
        if core is not None:
            core.executor.shutdown()
        try:
            outbox.close()
            outbox.join_thread()
        except Exception:  # noqa: BLE001
            pass
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
