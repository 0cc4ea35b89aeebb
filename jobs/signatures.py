"""Classify a hang or crash into a named signature, and fingerprint its stuck frames.

The input is `Clues`: thread stacks (`jobs.stacks` parses py-spy dumps, vLLM's faulthandler `VLLM_STACK_DUMP_*`
files), server log lines and what the watchdog saw. `SIGNATURES` is a plain dict users extend; the
first signature (by priority) whose `match` accepts the clues wins. The stuck frames are the
culprit's (`jobs.culprit`: the thread blocked in a CUDA sync, a collective, a lock or a loop in engine
code, not the threads waiting on it); the fingerprint hashes its normalised frames (module and
function, no line numbers, addresses or pids), so the same bug found in many cells, builds and hosts
groups together. Without stacks (py-spy could not attach) it falls back to the log's tracebacks.
The log counts from the server's readiness on (start-up prints what a hang prints), and what the
stacks show stuck now outweighs an shm warning from earlier (`_shm_log_is_stale`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .culprit import (
    COLLECTIVE_REASON,
    CulpritReport,
    culprit_report,
    from_call_site,
    module_of,
    normalised,
    runtime_internal,
)
from .stacks import Frame, ThreadStack, log_tracebacks, parse_stacks

# ---------------------------------------------------------------- clues and signatures


@dataclass(frozen=True)
class Clues:
    stacks: Sequence[ThreadStack] = ()
    log_lines: Sequence[str] = ()
    verdict_kind: str | None = None  # "hang" | "crash" | None (classifying a bare excerpt)
    exit_code: int | None = None
    hint: str | None = None  # the signature the firing detector pointed at
    gpu: str | None = None  # "busy" | "idle" at the hang (NVML), None when not measured

    def log_has(self, pattern: re.Pattern) -> bool:
        return any(pattern.search(line) for line in self.log_lines)

    def stack_has(self, pattern: re.Pattern) -> bool:
        return any(pattern.search(f.name) for t in self.stacks for f in t.frames)


@dataclass(frozen=True)
class Signature:
    name: str
    outcome: str  # "hang" | "crash"
    description: str
    match: Callable[[Clues], bool]
    priority: int = 100  # lower is tried first
    anchor: re.Pattern | None = None  # function names that mark the stuck frame
    fingerprint_depth: int = 6  # frames from the anchor (or the top) that identify the bug


@dataclass(frozen=True)
class Classification:
    signature: str | None
    outcome: str | None
    fingerprint: str | None
    stuck_frames: tuple[str, ...] = ()
    reason: str = ""
    causes: tuple[str, ...] = ()  # e.g. ("cuda_error", "engine_dead") under a `crash`
    culprit: str = ""  # why the stuck frames' thread is the culprit, with its role
    threads: tuple[dict, ...] = ()  # per role, culprits first then victims (jobs.culprit.ThreadView)
    attributes: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"gpu": "busy"}


OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|\bout of memory\b|Cannot allocate memory|oom-kill")
CUDA_ERROR = re.compile(
    r"CUDA error|cudaError\w+|illegal memory access|CUBLAS_STATUS_\w+|"
    r"cuda runtime error|device-side assert|\bXid\b"
)
NCCL_TIMEOUT = re.compile(
    r"NCCL[^\n]*(?:time(?:d)? ?out|Timeout)|Watchdog caught collective operation timeout|"
    r"ncclRemoteError|ncclSystemError|ncclInternalError|NCCL error"
)
SHM_WARNING = re.compile(r"No available shared memory broadcast block found in \d+ seconds")
RPC_TIMEOUT = re.compile(r"RPC call to \w+ timed out")
ENGINE_DEAD = re.compile(
    r"EngineDeadError|EngineCore encountered a fatal error|"
    r"EngineCore encountered an issue"
)
TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\)|^\s*Traceback:")
ZERO_STATS = re.compile(
    r"Avg prompt throughput: 0\.0 tokens/s, Avg generation throughput: 0\.0 tokens/s, "
    r"Running: ([1-9]\d*) reqs"
)
EVENT_SYNC_FRAME = re.compile(
    r"^(?:_to_list|cuEventSynchronize|cudaEventSynchronize|.*synchronizeEvent|"
    r"THPEvent_synchronize)$"
)
SHM_FRAME = re.compile(r"^(?:acquire_read|dequeue)$")


COLLECTIVE_FRAME = re.compile(
    r"^(?:all_reduce|_all_reduce\w*|custom_all_reduce|all_gather\w*|reduce_scatter\w*|"
    r"all_to_all\w*|broadcast|barrier)$"
)


def _culprit_in_collective(c: Clues) -> bool:
    culprit = culprit_report(c.stacks).culprit if c.stacks else None
    return culprit is not None and culprit.reason == COLLECTIVE_REASON


def _hangish(c: Clues) -> bool:
    return c.verdict_kind in (None, "hang")


SIGNATURES: dict[str, Signature] = {}


def register(sig: Signature) -> Signature:
    SIGNATURES[sig.name] = sig
    return sig


def _shm_wait_for_response(c: Clues) -> bool:
    """The engine side of the shm ring waiting for its workers' reply (not a worker idling on it)."""
    for t in c.stacks:
        names = [f.name for f in t.frames]
        if any(SHM_FRAME.match(n) for n in names) and any(RESPONSE_WAIT.match(n) for n in names):
            return True
    return False


RESPONSE_WAIT = re.compile(r"^(?:get_response|_wait_for_response|sample_tokens|collective_rpc|execute_model)$")


def _shm_log_is_stale(c: Clues) -> bool:
    """EngineCore prints the shm warning from its wait on the ring; when its stacks show it stuck in
    engine work of its own and nothing waits on the ring, that wait has ended: the warning is from a
    slow step before the hang, not the hang."""
    if not c.stacks or _shm_wait_for_response(c):
        return False
    culprit = culprit_report(c.stacks).culprit
    return culprit is not None and culprit.role == "EngineCore"


def _shm_broadcast(c: Clues) -> bool:
    if c.log_has(RPC_TIMEOUT) or (_hangish(c) and _shm_wait_for_response(c)):
        return True
    return (c.log_has(SHM_WARNING) or c.hint == "shm_broadcast_timeout") and not _shm_log_is_stale(c)


# Findings first: a hang's own story, then "the engine died" (the hang model's `crash` style), then
# the causes that also name a death's reason (kept as `causes`), then the catch-all silent stall.
register(
    Signature(
        "nccl_timeout",
        "hang",
        "an NCCL collective timed out or NCCL reported an error",
        lambda c: c.log_has(NCCL_TIMEOUT),
        priority=30,
    )
)
register(
    Signature(
        "event_sync_stall",
        "hang",
        "seed 000: the engine thread parked in _to_list -> transfer_event.synchronize (cuEventSynchronize)",
        lambda c: _hangish(c) and c.stack_has(EVENT_SYNC_FRAME),
        priority=40,
        anchor=re.compile(r"^_to_list$"),
        fingerprint_depth=6,
    )
)
register(
    Signature(
        "collective_stall",
        "hang",
        "a worker waits in an NCCL/gloo collective whose peer never arrives (a lost all-reduce), seen in its "
        "stacks before NCCL's or gloo's own timeout says so in the log",
        lambda c: _hangish(c) and _culprit_in_collective(c),
        priority=45,
        anchor=COLLECTIVE_FRAME,
    )
)
register(
    Signature(
        "shm_broadcast_timeout",
        "hang",
        "seeds 002-004: the engine waits on the shm ring for its workers (warnings, then `RPC call to "
        "sample_tokens timed out` and EngineDeadError)",
        _shm_broadcast,
        priority=50,
        anchor=SHM_FRAME,
        fingerprint_depth=2,
    )
)
register(
    Signature(
        "crash",
        "crash",
        "the engine died (process exit, or a fatal error with the API server left serving 500s)",
        lambda c: c.verdict_kind == "crash" or (c.exit_code not in (None, 0) and c.log_has(TRACEBACK)),
        priority=60,
    )
)
register(Signature("oom", "crash", "out of memory (CUDA or host)", lambda c: c.log_has(OOM), priority=65))
register(
    Signature(
        "cuda_error",
        "crash",
        "a CUDA error (illegal address, device assert, Xid, cuBLAS)",
        lambda c: c.log_has(CUDA_ERROR),
        priority=66,
    )
)
register(
    Signature(
        "engine_dead",
        "crash",
        "EngineDeadError without an earlier shm_broadcast or RPC timeout",
        lambda c: c.log_has(ENGINE_DEAD),
        priority=70,
    )
)
register(
    Signature(
        "silent_stall",
        "hang",
        "seeds 000/001: tokens stop with requests running, /health 200, no error, the stats line falls silent",
        lambda c: c.verdict_kind == "hang" or c.log_has(ZERO_STATS),
        priority=80,
    )
)

# Signatures that also explain *why* something died or stuck; reported next to the signature.
CAUSES = ("oom", "cuda_error", "nccl_timeout", "engine_dead")


def classify(clues: Clues, signatures: Mapping[str, Signature] | None = None) -> Classification:
    """The first signature (by priority) matching the clues, with the stuck frames and fingerprint."""
    table = SIGNATURES if signatures is None else signatures
    clues = replace(clues, log_lines=after_startup(clues.log_lines))
    report = culprit_report(clues.stacks)
    attributes = {"gpu": clues.gpu} if clues.gpu else {}
    for sig in sorted(table.values(), key=lambda s: (s.priority, s.name)):
        if sig.match(clues):
            frames, culprit = stuck_frames(clues, sig.anchor, report), ""
            if report.culprit is not None:
                culprit = f"{report.culprit.role} {report.culprit.thread}: {report.culprit.reason}"
            causes = tuple(n for n in CAUSES if n != sig.name and n in table and table[n].match(clues))
            return Classification(
                sig.name,
                sig.outcome,
                fingerprint(sig, frames, clues, report),
                tuple(str(f) for f in frames[:STUCK_FRAMES_KEPT]),
                sig.description,
                causes,
                culprit,
                tuple(t.to_dict() for t in report.threads),
                attributes,
            )
    return Classification(
        None,
        None,
        None,
        (),
        "no signature matched",
        threads=tuple(t.to_dict() for t in report.threads),
        attributes=attributes,
    )


# The server is up: what vLLM logged before this (EngineCore waiting on the shm ring while the worker
# profiles and warms up prints the same warning a hang does, once start-up outlasts
# VLLM_RINGBUFFER_WARNING_INTERVAL, i.e. whenever the host is busy) says nothing about a later hang.
READY = re.compile(r"Application startup complete|Uvicorn running on")


def after_startup(lines: Sequence[str]) -> Sequence[str]:
    """The log lines after the server last said it was ready (all of them when it never did)."""
    last = max((i for i, line in enumerate(lines) if READY.search(line)), default=-1)
    return lines[last + 1 :]


def stuck_frames(clues: Clues, anchor: re.Pattern | None, report: CulpritReport | None = None) -> tuple[Frame, ...]:
    """The frames of the thread that is stuck: the culprit (`jobs.culprit`), else the one holding the
    anchor, else the best guess."""
    report = culprit_report(clues.stacks) if report is None else report
    if report.culprit_index is not None:
        return clues.stacks[report.culprit_index].frames
    candidates: list[tuple[Frame, ...]] = [t.frames for t in clues.stacks if t.frames]
    tracebacks = log_tracebacks(clues.log_lines)
    if anchor is not None:
        for frames in [*candidates, *tracebacks]:
            if any(anchor.search(f.name) for f in frames):
                return frames
    busy = [t for t in clues.stacks if t.frames and t.active and not _looks_idle(t)]
    if busy:
        return busy[-1].frames  # children are dumped after parents: the engine over the API server
    mains = [t for t in clues.stacks if t.frames and t.thread == "MainThread" and not _looks_idle(t)]
    if mains:
        return mains[-1].frames
    if tracebacks:
        return tracebacks[-1]
    return candidates[-1] if candidates else ()


_IDLE_LOOP = re.compile(r"^(?:run_forever|_run_once|serve_forever|select|epoll_wait|poll)$")


def _looks_idle(t: ThreadStack) -> bool:
    """An event loop waiting for I/O (the API server), not a stuck engine step."""
    return any(f.name in ("run_forever", "serve_forever") for f in t.frames) and any(
        _IDLE_LOOP.match(f.name) for f in t.frames[:6]
    )


CULPRIT_DEPTH = 6  # normalised culprit frames hashed when the signature's anchor is not among them
STUCK_FRAMES_KEPT = 12  # the stuck thread's innermost frames a result keeps (matrix/refingerprint.py reads them back)


def fingerprint(sig: Signature, frames: Sequence[Frame], clues: Clues, report: CulpritReport | None = None) -> str:
    """A short stable hash of the stuck frames: the culprit's normalised frames (module and function,
    from the anchor down when the culprit holds it, else from the call site of a standard-library
    wait), else the function names of the best guess."""
    if report is not None and report.culprit_index is not None:
        names = normalised((f.function, f.location) for f in frames)
        idx = next(
            (i for i, n in enumerate(names) if sig.anchor is not None and sig.anchor.search(n.rsplit(":", 1)[-1])), None
        )
        names = names[idx : idx + sig.fingerprint_depth] if idx is not None else from_call_site(names)[:CULPRIT_DEPTH]
        if names:
            return hashlib.sha1((sig.name + "|culprit|" + "|".join(names)).encode()).hexdigest()[:12]
    # native frames (raw addresses, libc, the interpreter) vary by build, load address and Python version: not the bug
    names = [f.name for f in frames if not runtime_internal(f.function, module_of(f.location))]
    if sig.anchor is not None:
        idx = next((i for i, n in enumerate(names) if sig.anchor.search(n)), None)
        if idx is not None:
            names = names[idx:]
    names = names[: sig.fingerprint_depth]
    if not names:
        names = [_normalise_line(line) for line in clues.log_lines if sig.match(Clues(log_lines=[line]))][:1]
    basis = sig.name + "|" + "|".join(names)
    return hashlib.sha1(basis.encode()).hexdigest()[:12]


def _normalise_line(line: str) -> str:
    return re.sub(r"\d+", "N", line.strip())


def clues_from_texts(stack_texts: Iterable[str] = (), log_lines: Sequence[str] = (), **kw) -> Clues:
    stacks = [t for text in stack_texts for t in parse_stacks(text)]
    return Clues(stacks=tuple(stacks), log_lines=tuple(log_lines), **kw)
