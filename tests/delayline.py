"""Added network latency for one test host.

`tc qdisc ... netem delay` is the tool when the kernel has sch_netem; where
it does not (many VM kernels), `DelayRelay` is a TCP relay in the root
namespace that holds every chunk from the client for a fixed time before
passing it on, in order: the same added round-trip time, with real TCP on
both sides. Replies pass undelayed, like netem on the host's own interface.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import List, Optional, Set, Tuple


class DelayRelay:
    """Listen on (host, port); forward to target; delay client->server bytes."""

    def __init__(self, listen_host: str, target: Tuple[str, int], delay_s: float) -> None:
        self.listen_host = listen_host
        self.target = target
        self.delay_s = delay_s
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: Optional[asyncio.base_events.Server] = None
        self._writers: Set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-relay", daemon=True)

    def start(self) -> "DelayRelay":
        self._thread.start()
        ready = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = ready.result(timeout=10)
        return self

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0, family=socket.AF_INET)
        return self._server.sockets[0].getsockname()[1]

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        self.connections += 1
        self._writers.update((client_writer, server_writer))
        pumps: List[asyncio.Task] = [
            asyncio.ensure_future(self._pump_delayed(client_reader, server_writer)),
            asyncio.ensure_future(self._pump(server_reader, client_writer))]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for writer in (client_writer, server_writer):
            self._writers.discard(writer)
            writer.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            writer.write(data)
            await writer.drain()

    async def _pump_delayed(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: "asyncio.Queue[Tuple[float, bytes]]" = asyncio.Queue()

        async def release() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        releaser = asyncio.ensure_future(release())
        try:
            while True:
                data = await reader.read(65536)
                queue.put_nowait((time.monotonic() + self.delay_s, data))
                if not data:
                    break
            await releaser
        finally:
            releaser.cancel()

    def close(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()
            others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()
