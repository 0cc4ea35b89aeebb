"""Server-sent events as OpenAI-compatible servers stream them: the payload of each `data:` line.

One reader for every streaming client of ours (the load driver, the watch canary, the simulated
engine's test load): a line is `data: <json>`, the stream ends at `data: [DONE]`, and every other
line (blank keep-alives, `: comments`, `event:` and `id:` fields) carries no payload.
"""

from __future__ import annotations

DONE = "[DONE]"  # the payload that ends an OpenAI-compatible stream


def data_payload(line: str | bytes) -> str | None:
    """The payload of one `data:` line, surrounding whitespace stripped (bytes are read as UTF-8,
    a bad byte replaced); None for any other line. The stream's end is the payload `DONE`."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.strip()
    if not line.startswith("data:"):
        return None
    return line[5:].strip()
