"""The simulated engine core: the busy loop of one `VLLM::EngineCore` process, and where hangs begin.

Runs in its own process (forked by the API server), like vLLM V1's EngineCore: requests arrive on an
input queue, each step is scheduled (`scheduler.py`), broadcast to the model runners which spend the
step's time (`executor.py`), and the sampled tokens go back to the API server with the scheduler's
stats. The loop advances the hang clock (`hangs.py`); when a hang fires, `_begin_hang` plants it
where vLLM was seen stuck, then records it (`hang_record.py`): `silent_stall` parks the busy thread
in `Scheduler.schedule`; `event_sync_stall` in `_to_list` -> `_TransferEvent.synchronize`;
`shm_broadcast` silences one model runner while this thread waits in
`shm_broadcast.MessageQueue.acquire_read` (warnings, then `RPC call to sample_tokens timed out`,
a fatal error); `crash` raises in the step.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from soakmatrix.matrix.contracts.hangmodel import STYLE_SIGNATURE, load_or_empty

from .args import BLOCK_SIZE, SimConfig
from .clocks import Clocks
from .executor import Executor, step_time_s
from .hang_record import HangRecorder
from .hangs import ArmedHang, HangClock, arm
from .proc import die_with_parent, reset_child_signals, set_process_title, setup_process_logging, vlog
from .scheduler import CoreRequest, Scheduler, SchedulerOutput

VLLM_VERSION = "0.33.0"
DEFAULT_GPU_BLOCKS = 8192  # per GPU, 16 tokens each (131,072 tokens)


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
        self.clock = HangClock(
            arm(self.hang_model, config.flags, config.gpu_type, config.seed, config.time_scale, config.build)
        )
        self.executor = Executor(config, clocks)
        device = config.torch_device
        if device and device.startswith("cuda"):  # after the workers' fork: CUDA is touched from now
            from .torch_device import CudaTransferEvent

            self.scheduler.transfer_event = CudaTransferEvent(device)
            self.scheduler.transfer_event.synchronize()  # CUDA's set-up now, not in the first step
        self.hung: ArmedHang | None = None
        self.recorder = HangRecorder(config.hang_record)

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
        vlog(
            logging.INFO,
            "core.py:93",
            "Initializing a V1 LLM engine (v%s) with config: model=%r, speculative_config=%s, tokenizer=%r, "
            "dtype=torch.bfloat16, max_seq_len=%d, tensor_parallel_size=%d, pipeline_parallel_size=1, "
            "data_parallel_size=1, quantization=None, enforce_eager=%s, kv_cache_dtype=%s, device_config=cuda, "
            "seed=%d, served_model_name=%s, enable_prefix_caching=%s, enable_chunked_prefill=%s, "
            'async_scheduling=%s, compilation_config={"cudagraph_mode": %r}',
            VLLM_VERSION,
            c.model,
            spec,
            c.model,
            c.max_model_len,
            f["tp"],
            f["enforce_eager"],
            f["kv_cache_dtype"],
            c.seed,
            c.model_name,
            f["prefix_caching"],
            f["chunked_prefill"],
            f["async_scheduling"],
            f["cudagraph_mode"],
        )
        vlog(logging.INFO, "gpu_model_runner.py:2957", "Model loading took 1.21 GiB memory and 0.42 seconds")
        tokens = self.num_gpu_blocks * BLOCK_SIZE
        vlog(logging.INFO, "kv_cache_utils.py:1087", "GPU KV cache size: %s tokens", f"{tokens:,}")
        vlog(
            logging.INFO,
            "kv_cache_utils.py:1091",
            "Maximum concurrency for %s tokens per request: %.2fx",
            f"{c.max_model_len:,}",
            tokens / c.max_model_len,
        )
        for a in self.clock.armed:
            vlog(
                logging.DEBUG,
                "sim_hangs.py:1",
                "armed hang %s (%s): effective MTTF %.1f s, fires after %.3f s of load (time scale %g)",
                a.hang.id,
                a.hang.style,
                a.mttf_s,
                a.fires_after_s,
                c.time_scale,
            )
        vlog(logging.INFO, "core.py:220", "init engine (profile, create kv cache, warmup model) took 0.51 seconds")

    # -- messages from the API server
    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "add":
            _, req_id, prompt, max_tokens, req_seed = msg
            salt = f"{self.config.seed}:{req_seed}:{zlib.crc32(repr(prompt).encode())}"
            self.scheduler.add(
                CoreRequest(req_id, prompt, max_tokens, random.Random("tok:" + salt), random.Random("spec:" + salt))
            )
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
        running = 0
        while True:
            if self.scheduler.has_work() or self.hung is not None:
                self._drain(0)
            else:
                deadline = self.clock.next_deadline(0)
                self._drain(0.25 if deadline is None else min(0.25, max(0.001, deadline)))
            # The time since the last turn ran with the requests running then. A hang whose clock ran
            # out begins before the next step, so that step (with the requests now running) is the
            # one that sticks: begun after it, a step that finished every request left a hang with
            # none of its own, and the gauges said 0 running.
            now = time.monotonic()
            fired = self.clock.advance(now - last, running)
            last = now
            if fired is not None and self.hung is None:
                self._begin_hang(fired, running)
            if self.scheduler.has_work() or self.hung is not None:
                self._step()
            running = len(self.scheduler.running)

    @contextmanager
    def log_error_detail(self, sched: SchedulerOutput) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, SystemExit):
                c = self.config
                vlog(
                    logging.ERROR,
                    "dump_input.py:69",
                    "Dumping input data for V1 LLM engine (v%s) with config: model=%r, tensor_parallel_size=%d, "
                    "speculative_config=%s, enforce_eager=%s, seed=%d",
                    VLLM_VERSION,
                    c.model,
                    c.flags["tp"],
                    self.spec_text(),
                    c.flags["enforce_eager"],
                    c.seed,
                )
                vlog(
                    logging.ERROR,
                    "dump_input.py:76",
                    "Dumping scheduler output for model execution: %s",
                    sched.describe(),
                )
                vlog(logging.ERROR, "dump_input.py:79", "Dumping scheduler stats: %s", self.scheduler.stats_text())
            raise

    def _step(self) -> None:
        sched = self.scheduler.schedule()  # silent_stall never returns from here
        step_s = step_time_s(self.config, sched, self.rng) * self.config.step_time_scale
        with self.log_error_detail(sched):
            self.executor.execute_model(step_s)  # crash raises here
            self.executor.sample_tokens(step_s)  # shm_broadcast: warnings, then TimeoutError
        spec = None
        if self.scheduler.spec_k:
            k = self.scheduler.spec_k
            spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_pos": [0] * k}
        outputs, prompt_tokens, gen_tokens = self.scheduler.update_from_output(sched, spec)  # event_sync_stall
        s = self.scheduler
        self.outbox.put(
            (
                "out",
                {
                    "outputs": outputs,
                    "running": len(s.running),
                    "waiting": len(s.waiting),
                    "kv": s.kv_usage(),
                    "prompt_tokens": prompt_tokens,
                    "gen_tokens": gen_tokens,
                    "iter_tokens": sched.total_tokens,
                    "preempted": s.stat_preempted,
                    "prefix_requests": s.stat_prefix_requests,
                    "prefix_queries": s.stat_prefix_queries,
                    "prefix_hits": s.stat_prefix_hits,
                    "spec": spec,
                    "step_s": step_s,
                },
            )
        )

    # -- hangs
    def _signature_of(self, style: str) -> str:
        """What the soak job must call this hang: with torch driving a device at TP > 1 the silent
        worker of `shm_broadcast` waits in a lost collective (torch_device.py)."""
        if style == "shm_broadcast" and self.config.torch_device and self.executor.tp > 1:
            return "collective_stall"
        return STYLE_SIGNATURE[style]

    def _begin_hang(self, armed: ArmedHang, running: int) -> None:
        """`running`: the requests running while the hang's clock ran out (the step just taken may
        have finished them since)."""
        self.hung = armed
        style = armed.hang.style
        record = {
            "hang_id": armed.hang.id,
            "style": style,
            "signature": self._signature_of(style),
            "began_at": time.time(),
            "engine_time_s": round(self.clock.exposure_s, 6),
            "running": running,
            "waiting": len(self.scheduler.waiting),
            "mttf_s": armed.mttf_s,
            "fires_after_s": armed.fires_after_s,
            "accrued_s": round(armed.accrued_s, 6),
            "time_scale": self.config.time_scale,
            "pid": os.getpid(),
        }
        if style == "silent_stall":
            self.scheduler.stalled = True
        elif style == "event_sync_stall":
            self.scheduler.transfer_event.stuck = True
        elif style == "shm_broadcast":
            self.executor.hang_rank = self.executor.tp - 1
        elif style == "crash":
            self.executor.crash_next = True
        # the record after the hang is planted, and off this thread: see hang_record.py
        self.recorder.write(record)
        vlog(
            logging.DEBUG,
            "sim_core.py:1",
            "soakmatrix sim: hang %s (%s) began: %s",
            armed.hang.id,
            style,
            json.dumps(record, sort_keys=True),
        )


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
            core.recorder.close()
        try:
            outbox.close()
            outbox.join_thread()
        except Exception:  # noqa: BLE001
            pass
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
