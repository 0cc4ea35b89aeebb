"""Recorded incident dumps for the tests (fixtures/incidents), and the same hang sampled at another moment."""

from __future__ import annotations

from pathlib import Path

INCIDENTS = Path(__file__).resolve().parent.parent / "fixtures" / "incidents"


def dump(name: str) -> str:
    """A recorded dump without its '# ' comment lines (where it came from)."""
    return "\n".join(l for l in (INCIDENTS / name).read_text().splitlines() if not l.startswith("# "))


# Where py-spy can find a thread stuck in `Event.wait` (Python 3.11's threading.py): inside the C
# acquire, or in one of the pure-Python steps around it. The same hang, sampled at another moment.
WAIT_MOMENTS = {
    "in the acquire": "    Condition.wait (threading.py:331)\n    Event.wait (threading.py:629)\n",
    "in _release_save": "    Condition._release_save (threading.py:283)\n    Condition.wait (threading.py:324)\n"
                        "    Event.wait (threading.py:629)\n",
    "in _acquire_restore": "    Condition._acquire_restore (threading.py:286)\n    Condition.wait (threading.py:335)\n"
                           "    Event.wait (threading.py:629)\n",
    "in _is_owned": "    Condition._is_owned (threading.py:290)\n    Condition.wait (threading.py:320)\n"
                    "    Event.wait (threading.py:629)\n",
    "entering the condition": "    Condition.__enter__ (threading.py:277)\n    Event.wait (threading.py:627)\n",
}


def worker_stuck(text: str, moment: str) -> str:
    """The simulator's TP 2 shm dump with Worker_TP1's wait frames as sampled at `moment`."""
    head, _, rest = text.partition("Process 27256: VLLM::Worker_TP1")
    native = "    PyThread_acquire_lock_timed (libpython3.11.so.1.0)\n    lock_PyThread_acquire_lock (libpython3.11.so.1.0)\n"
    stuck = native + WAIT_MOMENTS["in the acquire"]
    assert stuck in rest
    return head + "Process 27256: VLLM::Worker_TP1" + rest.replace(
        stuck, (native if moment == "in the acquire" else "") + WAIT_MOMENTS[moment], 1)
