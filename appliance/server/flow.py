"""Fan-in backpressure: while a client cannot drain its socket, stop reading from the others, for a bounded time."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger("appliance.flow")

SLOW_CONSUMER_S = 2.0  # a client congested longer than this no longer holds the others back: its QoS0 is dropped


class Readable(Protocol):
    """What flow control needs of a connection."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class FlowControl:
    """Publishers are read only as fast as the slowest (not hopelessly slow) subscriber drains, like TCP end to end."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Readable]) -> None:
        self._loop = loop
        self._connections = connections
        self._congested: dict[Readable, float] = {}  # connection -> when its buffer passed the high-water mark
        self._slow: set[Readable] = set()  # congested too long: excluded until it drains
        self.paused = False
        self.pauses = 0  # times reading was paused (metrics)

    def congested(self, conn: Readable) -> None:
        """`conn`'s write buffer passed its high-water mark."""
        if conn in self._slow:
            return
        self._congested[conn] = self._loop.time()
        if not self.paused:
            self.paused = True
            self.pauses += 1
            for other in self._connections:
                if other not in self._congested:
                    other.pause_reading()

    def drained(self, conn: Readable) -> None:
        """`conn`'s write buffer fell below its low-water mark (or the connection is gone)."""
        self._slow.discard(conn)
        if self._congested.pop(conn, None) is not None:
            self._maybe_resume()

    def is_slow(self, conn: Readable) -> bool:
        """True for a client that stayed congested past SLOW_CONSUMER_S (its QoS0 messages are dropped)."""
        return conn in self._slow

    def admit(self, conn: Readable) -> None:
        """A new connection while reading is paused waits like the others."""
        if self.paused:
            conn.pause_reading()

    def tick(self) -> None:
        """Release the others from clients that stayed congested longer than SLOW_CONSUMER_S."""
        now = self._loop.time()
        for conn, since in list(self._congested.items()):
            if now - since > SLOW_CONSUMER_S:
                del self._congested[conn]
                self._slow.add(conn)
                log.info("slow consumer: its QoS0 messages are dropped while it cannot keep up")
        self._maybe_resume()

    def _maybe_resume(self) -> None:
        if self.paused and not self._congested:
            self.paused = False
            for conn in self._connections:
                conn.resume_reading()
