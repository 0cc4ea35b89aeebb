"""Misbehaving HTTP servers on 127.0.0.1, for the watch's tests: the shapes a broken API server takes.

Each kind answers every path the same way:

    silent    accepts the connection, reads the request, never answers (a blocked event loop)
    drip      sends a 200's headers, then one byte every 0.2 s without end (slowloris)
    drip_headers  sends a status line, then its headers one byte every 0.2 s without end
    endless   sends a 200's headers, then 64 KB pieces as fast as they are read, without end
    huge      a 200 declaring a 1 GiB body, and sends it
    reset     accepts, then resets the connection (RST) before a byte
    html      a 200 with an HTML page (a proxy's error page, a web app at the wrong URL)
    redirect  a 302 to the same path, for ever (a redirect loop)
    error     a 500 with a JSON error for every request

asyncio in a daemon thread, on a port the OS picks; it stops when the `with` block ends, or by itself
after `lifetime_s`. Run as a script (`python tests/broken_servers.py KIND`) it prints `port N` and
serves in its own process until its lifetime ends or it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import sys
import threading
import time

KINDS = ("silent", "drip", "drip_headers", "endless", "huge", "reset", "html", "redirect", "error")
HTML = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>\n"


async def _read_request(reader: asyncio.StreamReader) -> str:
    head = await reader.readuntil(b"\r\n\r\n")
    first = head.split(b"\r\n", 1)[0].decode("latin-1")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    parts = first.split(" ")
    return parts[1] if len(parts) > 1 else "/"


def _response(status: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode() + body


class BrokenServer:
    def __init__(self, kind: str, lifetime_s: float = 120.0) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
        self.kind, self.lifetime_s = kind, lifetime_s
        self.port = 0
        self.connections = 0
        self.bytes_sent = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name=f"broken-{kind}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "BrokenServer":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"broken server {self.kind} did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __enter__(self) -> "BrokenServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        ends = time.monotonic() + self.lifetime_s
        while not self._stop.is_set() and time.monotonic() < ends:
            await asyncio.sleep(0.05)
        server.close()
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.kind == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            path = await _read_request(reader)
            await getattr(self, f"_{self.kind}")(writer, path)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.bytes_sent += len(data)

    async def _silent(self, writer: asyncio.StreamWriter, path: str) -> None:
        await asyncio.sleep(self.lifetime_s)

    async def _drip(self, writer: asyncio.StreamWriter, path: str) -> None:
        await self._send(writer, _response("200 OK", {"Content-Type": "text/plain"}))
        while True:
            await self._send(writer, b"#")
            await asyncio.sleep(0.2)

    async def _drip_headers(self, writer: asyncio.StreamWriter, path: str) -> None:
        await self._send(writer, b"HTTP/1.1 200 OK\r\nX-Padding: ")
        while True:
            await self._send(writer, b"a")
            await asyncio.sleep(0.2)

    async def _endless(self, writer: asyncio.StreamWriter, path: str) -> None:
        await self._send(writer, _response("200 OK", {"Content-Type": "text/event-stream"}))
        piece = b"data: " + b"x" * 65_000 + b"\n"
        while True:
            await self._send(writer, piece)

    async def _huge(self, writer: asyncio.StreamWriter, path: str) -> None:
        size = 1 << 30
        await self._send(writer, _response("200 OK", {"Content-Type": "text/plain", "Content-Length": str(size)}))
        piece = b"# padding\n" * 6_553
        while size > 0:
            await self._send(writer, piece[:size])
            size -= len(piece)

    async def _html(self, writer: asyncio.StreamWriter, path: str) -> None:
        await self._send(writer, _response("200 OK", {"Content-Type": "text/html; charset=utf-8",
                                                      "Content-Length": str(len(HTML))}, HTML))

    async def _redirect(self, writer: asyncio.StreamWriter, path: str) -> None:
        await self._send(writer, _response("302 Found", {"Location": path, "Content-Length": "0"}))

    async def _error(self, writer: asyncio.StreamWriter, path: str) -> None:
        body = b'{"error": "internal server error"}'
        await self._send(writer, _response("500 Internal Server Error", {"Content-Type": "application/json",
                                                                         "Content-Length": str(len(body))}, body))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a misbehaving HTTP server on 127.0.0.1")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--lifetime", type=float, default=120.0, help="seconds before it stops by itself")
    args = p.parse_args(argv)
    server = BrokenServer(args.kind, args.lifetime).start()
    print(f"port {server.port}", flush=True)
    try:
        server._thread.join()
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
