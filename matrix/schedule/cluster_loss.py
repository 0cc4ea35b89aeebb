"""Telling a lost Ray cluster from a cell's own trouble, and the error a run ends with when it is lost.

A worker node's death reaches the driver as the failure of the cells it ran: each is an infra_error,
retried elsewhere. The head's death, or the death of the node the driver is attached to, reaches it
as an error of the driver's own calls to Ray: the start mailbox (an actor on the driver's node) is
unavailable, nothing answers at the head's GCS address, a Ray Client connection drops. No cell can
run or report any more, so the run ends there (`ClusterLost`), keeping what finished; `--resume`
reruns the rest once the cluster is back. Ray's own driver gives up on a GCS it cannot reach after
60 s and ends the process, so the run must notice and wrap up well before that.

`cluster_lost` is the decision, a pure function of the exception (it matches Ray's exception classes
by name and never imports Ray); the loop applies it to the launcher's calls only, never to a cell's
result nor to the result writers' errors.
"""

from __future__ import annotations

MESSAGE_CHARS = 240  # Ray's messages carry RPC details over several hundred characters


class ClusterLost(Exception):
    """The Ray cluster the run was on is gone; the message is the one line a command prints."""


class HeadUnreachable(ConnectionError):
    """Nothing answers at the Ray head's GCS address (the launcher checks it before calls that would
    otherwise wait for the GCS until Ray ends the process)."""


# Ray's errors that, raised by the driver's own calls (not a cell's task), mean the cluster is gone:
# an actor error can only be the start mailbox's, which lives on the driver's node; a system or RPC
# error is the driver's connection to its raylet or the GCS failing
_DRIVER_NODE_ERRORS = ("RayActorError",)
_CONNECTION_ERRORS = ("RaySystemError", "RpcError")


def cluster_lost(exc: BaseException) -> str | None:
    """Why `exc`, raised by one of the driver's own calls to Ray, means the cluster is gone (one line);
    None when it does not (a bug or a usage error: raised as it is)."""
    ray_classes = {cls.__name__ for cls in type(exc).__mro__ if cls.__module__.split(".")[0] == "ray"}
    if isinstance(exc, HeadUnreachable):
        return f"lost the Ray cluster: the Ray head is gone ({_first_line(exc)})"
    if ray_classes & set(_DRIVER_NODE_ERRORS):
        return (
            "lost the Ray cluster: the Ray head or the driver's own node is gone "
            f"(the driver's mailbox actor: {type(exc).__name__}: {_first_line(exc)})"
        )
    if ray_classes & set(_CONNECTION_ERRORS):
        return f"lost the Ray cluster: {type(exc).__name__}: {_first_line(exc)}"
    if type(exc) is ConnectionError:  # Ray Client's lost connection; never a subclass (a broken pipe)
        return f"lost the Ray cluster: the Ray Client connection dropped ({_first_line(exc)})"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."
