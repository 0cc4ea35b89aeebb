"""Which thread of a stuck engine is the culprit, and which threads only wait on it.

A hung vLLM tree shows the same bug in several processes: the worker stuck in a CUDA event sync or a
collective, EngineCore waiting on the shm ring for the worker's reply, the API server's event loop
waiting for EngineCore. Only the first is the bug; the others are *victims* (waiting on another
engine process) or *idle* (thread pools, event loops, monitors waiting for work). `classify_thread`
decides which, from the thread's frames alone, with the plain dict `PATTERNS` (users add theirs);
`culprit_report` does it for every thread of every process and orders them per role (API server,
EngineCore, Worker_TP<i>, from the process titles vLLM sets), culprits first; `normalised` turns
frames into what a fingerprint may hash (module and function, no line, address, pid or path).

The rules, innermost frame outwards:

- a *strong* pattern decides at once: a CUDA/event sync or an NCCL/gloo collective is a culprit; a
  shm_broadcast read, an executor's response wait, an RPC future, a ZMQ poll is a victim; an event
  loop, a thread pool worker, a queue `get` is idle;
- a *weak* pattern (a sleep, a lock or condition wait, an I/O wait) decides only when no strong one
  follows: it is a culprit when the thread is doing engine work (a scheduler, model runner, model
  or plugin frame below it), else idle;
- a thread with no pattern at all is a culprit when it is doing engine work (a loop in model code),
  else idle.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CULPRIT, VICTIM, IDLE = "culprit", "victim", "idle"
COLLECTIVE_REASON = "NCCL/gloo collective"  # a culprit's reason jobs.signatures names `collective_stall`
WEAK = "weak"


@dataclass(frozen=True)
class Pattern:
    kind: str  # culprit | victim | idle | weak
    reason: str  # what the finding says about such a thread
    function: re.Pattern  # matched against the bare function name
    module: re.Pattern | None = None  # and, when given, against the frame's file or library


def _p(kind: str, reason: str, function: str, module: str | None = None) -> Pattern:
    return Pattern(kind, reason, re.compile(function), re.compile(module) if module else None)


# Registry order is the order of preference for a thread's reason among patterns of the same kind.
PATTERNS: dict[str, Pattern] = {
    "cuda_sync": _p(
        CULPRIT,
        "CUDA/event sync",
        r"^(?:cu(?:Event|Stream|Ctx|Device)Synchronize|cuda(?:Event|Stream|Device)Synchronize|"
        r".*synchronize(?:Event|Stream|Device)|THPEvent_synchronize|THCPStream_synchronize|"
        r"synchronize|cuMemcpyDtoH\w*|cudaMemcpy(?:Async)?)$",
    ),
    "nccl_native": _p(
        CULPRIT,
        COLLECTIVE_REASON,
        r"^(?:nccl\w+|.*ncclKernel\w*|.*ProcessGroup(?:NCCL|Gloo)\W.*|"
        r"gloo::.*|c10d::.*)$",
    ),
    "collective": _p(
        CULPRIT,
        COLLECTIVE_REASON,
        r"^(?:all_reduce|_all_reduce\w*|custom_all_reduce|all_gather\w*|reduce_scatter\w*|all_to_all\w*|"
        r"broadcast|barrier|send|recv|irecv|isend)$",
        r"distributed|parallel_state|communicat|c10d",
    ),
    "shm_broadcast": _p(
        VICTIM,
        "shm_broadcast wait (on another engine process)",
        r"^(?:acquire_read|acquire_write|dequeue|enqueue)$",
        r"shm_broadcast",
    ),
    "executor_response": _p(
        VICTIM,
        "executor waiting for its workers' response",
        r"^(?:get_response|_wait_for_response|wait_for_response|_get_output|get_output)$",
    ),
    "rpc_future": _p(VICTIM, "RPC future wait", r"^(?:result|wait|_wait_for_tstate_lock)$", r"futures"),
    "zmq_poll": _p(
        VICTIM,
        "ZMQ poll (waiting on another engine process)",
        r"^(?:poll|zmq_poll|recv|recv_multipart|recv_pyobj|_poll)$",
        r"zmq",
    ),
    "event_loop": _p(IDLE, "event loop", r"^(?:run_forever|_run_once|run_until_complete|serve_forever)$"),
    "uvicorn": _p(IDLE, "uvicorn", r".*", r"uvicorn"),
    "thread_pool": _p(IDLE, "thread pool worker", r"^_worker$", r"futures"),
    "queue_get": _p(
        IDLE, "waiting on a queue", r"^(?:get|_SimpleQueue_get\w*|_queue_SimpleQueue_get\w*)$", r"queue|_queuemodule"
    ),
    "sleep": _p(WEAK, "sleep", r"^(?:sleep|clock_nanosleep|nanosleep|time_sleep|pysleep)$"),
    "lock": _p(
        WEAK,
        "lock or condition wait",
        r"^(?:acquire|wait|_acquire_restore|lock_PyThread_acquire_lock|PyThread_acquire_lock_timed|"
        r"futex\w*|__futex\w*|pthread_cond_\w+|sem_\w*wait\w*|do_futex_wait\w*)$",
    ),
    "io_wait": _p(WEAK, "I/O wait", r"^(?:select|epoll_wait|epoll_pwait|poll|read|readinto|recv\w*|accept\w*)$"),
}

# Frames that say the thread is doing engine work: a weak wait under them is the bug, not idleness.
ENGINE_WORK = re.compile(
    r"^(?:schedule|step|step_with_batch_queue|_step|execute_model|sample_tokens|_to_list|"
    r"_bookkeeping_sync|forward|_model_forward|propose|update_from_output|execute_dummy_batch|"
    r"_dummy_run|_sample|_prepare_inputs|_update_states)$"
)
ENGINE_MODULE = re.compile(r"model_executor/|model_runner|/sched/|fault_plugin|/plugins?/")

# Loops every engine step passes through: they name no bug, so a fingerprint leaves them out (the same
# bug seen with async scheduling on, `step_with_batch_queue`, and off, `step`, groups together).
LOOP_FRAMES = re.compile(
    r"^(?:step|step_with_batch_queue|_process_engine_step|run_busy_loop|run_engine_core|"
    r"run_with_fault_tolerance|worker_busy_loop|worker_main|run|_bootstrap|_bootstrap_inner|"
    r"_main|spawn_main|<module>|_run_code|_run_module_as_main|thread_run|__enter__|__exit__)$"
)
PROCESS_START = re.compile(r"(?:^|[/\\])multiprocessing[/\\]process\.py$")
# Native frames that vary by build, load address and Python version, not by bug: raw addresses, the C
# library and the dynamic loader, the interpreter however it is linked (`libpython3.11.so.1.0`, or a
# static `python3.12` / `python` binary as uv's and Debian's builds are), C sources with debug lines.
NATIVE_NOISE = re.compile(
    r"^0x[0-9a-fA-F]+$|"
    r"(?:^|/)(?:lib(?:c|pthread|python[\d.]*|m|dl|rt)|ld-linux[\w.-]*)"
    r"(?:[-.][\d.]+)?(?:\.so.*)?$|"
    r"(?:^|/)(?:python|pypy)[\d.]*[dmu]*$|\.(?:c|h|cc|cpp)(?::\d+)?$|^<frozen "
)
# Interpreter, C library and threading-library internals by function name, wherever the library they
# were found in (a static interpreter, a libc another distribution names otherwise): which of them a
# thread's wait passes through changes with the Python and glibc version, while the bug stays the
# same. CUDA, NCCL and torch's own frames are not among them.
RUNTIME_INTERNALS = re.compile(
    r"^(?:_?Py[A-Z_]\w*|_?PyThread_\w+|take_gil|drop_gil|_?PyEval_\w+|"
    r"(?:method|cfunction|function|builtin|vectorcall|slot|wrapper|thread)_\w+|\w+_vectorcall\w*|"
    r"lock_PyThread_\w+|rlock_\w+|acquire_timed|pythread_wrapper|pymain_\w+|time_sleep|pysleep|"
    r"select_\w+|_queue_\w+|_asyncio_\w+|_?PyObject_\w+|Py_\w+|"
    r"pthread_\w+|__pthread_\w+|__?futex\w*|futex_\w+|__lll_\w+|do_futex_wait\w*|__new_sem_wait\w*|"
    r"sem_\w*wait\w*|__GI_\w+|__libc_\w+|__clock_nanosleep\w*|clock_nanosleep\w*|__?nanosleep\w*|"
    r"syscall|__syscall\w*|clone3?|__clone\w*|start_thread|_start|epoll_p?wait|__?poll|__?select|"
    r"execute_native_thread_routine|std::(?:condition_variable|mutex|thread|__\w+)\b.*|__gthread_\w+)"
    r"(?:\.(?:constprop|isra|part|cold)\.\d+)*$"
)


def runtime_internal(function: str, module: str) -> bool:
    """A frame of the interpreter, the C library or a threading library, not of the code that waits."""
    return bool(
        NATIVE_NOISE.search(function)
        or (module and NATIVE_NOISE.search(module))
        or (not _python_source(module) and RUNTIME_INTERNALS.match(function))
    )


def _python_source(module: str) -> bool:
    return module.endswith(".py") or module.startswith("<")


# Process titles vLLM sets (setproctitle): `VLLM::EngineCore`, `VLLM::Worker_TP0`, `VLLM::Worker`.
ROLE_PATTERNS: dict[str, re.Pattern] = {
    "title": re.compile(r"^VLLM::(?P<role>[\w.-]+)"),
    "API server": re.compile(r"vllm(?:\.entrypoints|/entrypoints| serve)|api_server|uvicorn|soakmatrix\.jobs\.sim\b"),
}
ROLE_RANK = {"Worker": 0, "EngineCore": 1}  # where a culprit usually is; others after, the API server last


@dataclass(frozen=True)
class ThreadClass:
    kind: str  # culprit | victim | idle
    reason: str
    strong: bool  # decided by a strong pattern (a CUDA sync) rather than by being in engine code


@dataclass(frozen=True)
class ThreadView:
    role: str
    pid: str
    thread: str
    kind: str
    reason: str
    frames: tuple[str, ...]  # as printed, innermost first

    def to_dict(self) -> dict:
        return {
            "role": self.role,
            "pid": self.pid,
            "thread": self.thread,
            "kind": self.kind,
            "reason": self.reason,
            "frames": list(self.frames),
        }


@dataclass(frozen=True)
class CulpritReport:
    threads: tuple[ThreadView, ...]  # culprits first, then victims, grouped by role; idle left out
    culprit_index: int | None  # index into the stacks given of the chosen culprit thread
    idle: int = 0  # threads left out as idle
    roles: tuple[str, ...] = field(default=())

    @property
    def culprit(self) -> ThreadView | None:
        return next((t for t in self.threads if t.kind == CULPRIT), None)


def frame_name(function: str) -> str:
    """The bare function name: py-spy prints `Class.method` and `outer.<locals>.inner`."""
    return function if "::" in function else function.rsplit(".", 1)[-1]


def module_of(location: str) -> str:
    """The file (or library) a frame is in, without line number."""
    loc = location.strip()
    return re.sub(r":\d+\S*$", "", loc)


def _matches(p: Pattern, function: str, location: str) -> bool:
    if not p.function.match(frame_name(function)):
        return False
    return p.module is None or bool(p.module.search(module_of(location)))


def classify_thread(frames: Sequence[tuple[str, str]], patterns: dict[str, Pattern] | None = None) -> ThreadClass:
    """Class one thread from its (function, location) frames, innermost first."""
    table = PATTERNS if patterns is None else patterns
    if not frames:
        return ThreadClass(IDLE, "no frames", False)
    weak: Pattern | None = None
    first_strong: Pattern | None = None
    strong_kinds: list[Pattern] = []
    for function, location in frames:
        hits = [p for p in table.values() if _matches(p, function, location)]
        strong = [p for p in hits if p.kind != WEAK]
        if strong and first_strong is None:
            first_strong = strong[0]
        strong_kinds += strong
        if not strong and hits and weak is None and first_strong is None:
            weak = hits[0]
    if first_strong is not None:
        same = [p for p in table.values() if p in strong_kinds and p.kind == first_strong.kind]
        return ThreadClass(first_strong.kind, same[0].reason, True)
    working = any(ENGINE_WORK.match(frame_name(f)) or ENGINE_MODULE.search(module_of(loc)) for f, loc in frames)
    if not working:
        return ThreadClass(IDLE, weak.reason if weak else "no engine work", False)
    where = next((frame_name(f) for f, loc in frames if not runtime_internal(f, module_of(loc))), "?")
    if weak is not None:
        return ThreadClass(CULPRIT, f"{weak.reason} in engine code ({where})", False)
    return ThreadClass(CULPRIT, f"running in engine code ({where})", False)


def role_of(process: str) -> tuple[str, str]:
    """(role, pid) from a dump's `pid: cmdline` process header."""
    pid, _, cmdline = process.partition(": ")
    if not cmdline:
        return ("process", pid) if pid else ("unknown", "")
    m = ROLE_PATTERNS["title"].match(cmdline)
    if m:
        return m.group("role"), pid
    for role, pattern in ROLE_PATTERNS.items():
        if role != "title" and pattern.search(cmdline):
            return role, pid
    return "helper", pid


def _role_rank(role: str) -> int:
    base = role.split("_", 1)[0]
    if base in ROLE_RANK:
        return ROLE_RANK[base]
    return 9 if role == "API server" else 5


def culprit_report(stacks: Sequence, patterns: dict[str, Pattern] | None = None, max_frames: int = 40) -> CulpritReport:
    """Every thread of every process classed; culprits first, ordered per role (`stacks`: objects with
    `.process`, `.thread`, `.frames` of objects with `.function` and `.location`)."""
    rows: list[tuple[tuple, int, ThreadView]] = []
    idle = 0
    kind_rank = {CULPRIT: 0, VICTIM: 1}
    for i, t in enumerate(stacks):
        frames = [(f.function, f.location) for f in t.frames]
        cls = classify_thread(frames, patterns)
        if cls.kind == IDLE:
            idle += 1
            continue
        role, pid = role_of(t.process)
        view = ThreadView(
            role, pid, t.thread, cls.kind, cls.reason, tuple(_frame_text(f, loc) for f, loc in frames[:max_frames])
        )
        # strong culprits (a CUDA sync) before engine-code ones; workers before EngineCore before the API;
        # then a key that names the thread, not where py-spy happened to list it
        rows.append(
            ((kind_rank[cls.kind], 0 if cls.strong else 1, _role_rank(role), *_stable_key(view, frames), i), i, view)
        )
    rows.sort(key=lambda r: r[0])
    culprit_index = next((i for key, i, v in rows if v.kind == CULPRIT), None)
    # the page groups by role: the culprit's role first, each role's culprits before its victims
    order: list[str] = []
    for _, _, v in rows:
        if v.role not in order:
            order.append(v.role)
    grouped = sorted(rows, key=lambda r: (order.index(r[2].role), r[0]))
    return CulpritReport(tuple(v for _, _, v in grouped), culprit_index, idle, tuple(order))


def _stable_key(view: ThreadView, frames: Sequence[tuple[str, str]]) -> tuple:
    """Among equal candidates: a main thread first, then by role, normalised frames (no pid, line or
    address) and thread name (a name, or py-spy's thread id), so two dumps of one hang choose alike."""
    return (view.thread != "MainThread", view.role, tuple(normalised(frames)), view.thread)


def _frame_text(function: str, location: str) -> str:
    return f"{function} ({location})" if location else function


def normalised(frames: Iterable[tuple[str, str]]) -> list[str]:
    """`module:function` of each frame that may identify a bug: no line numbers, addresses or paths
    (only the file's stem, or the library's name without its version), no interpreter, C library or
    threading-library internals (`runtime_internal`: one bug under Python 3.11 and 3.12 hashes
    alike), no engine loops, and nothing outward of the process's start (`multiprocessing`'s
    `_bootstrap`): in a forked worker those are the parent's frames at the fork, the same for every
    worker and absent where the model runs in the engine core (TP 1), so a stuck step would be another
    finding at every TP size."""
    out = []
    for function, location in frames:
        module = module_of(location)
        if PROCESS_START.search(module) and frame_name(function) == "_bootstrap":
            break
        if runtime_internal(function, module):
            continue
        name = frame_name(function)
        if LOOP_FRAMES.match(name):
            continue
        out.append(f"{_stem(module)}:{name}")
    return out


# The standard library's own waits: which of their frames a sample lands in (Condition.wait,
# _release_save, _acquire_restore, _is_owned) is the moment of the sample, not the bug.
SYNC_MODULES = {"threading", "queue"}


def from_call_site(names: Sequence[str]) -> list[str]:
    """`normalised` names without the standard library's wait frames at the inside: a thread stuck
    in a lock or condition wait is identified by the engine code that waits, so every sampling
    moment inside the wait gives one fingerprint. Names that are all such frames stay as they are."""
    i = 0
    while i < len(names) and names[i].split(":", 1)[0] in SYNC_MODULES:
        i += 1
    return list(names[i:]) if i < len(names) else list(names)


def _stem(module: str) -> str:
    base = module.replace("\\", "/").rsplit("/", 1)[-1]
    if ".so" in base:
        return base.split(".so", 1)[0]
    return base[:-3] if base.endswith(".py") else base
