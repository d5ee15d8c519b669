"""The clients' own records: one JSON object per line, written in the order things happened in the client process.

Kinds (field `e`):
  send  {c: publisher, seq, qos, node, dup}          a PUBLISH handed to the socket (dup=True on a resend)
  ack   {c: publisher, seq, qos, rc, stage}          PUBACK / PUBREC / PUBCOMP received (stage says which)
  conn  {c: client, node, sp}                        CONNACK received (sp: session present)
  sub   {c: subscriber, qos}                         SUBACK granted `qos` for the test topic filter
  rel   {c: subscriber, pid, known}                  PUBREL received (known: the packet id was awaiting it)
  recv  {c: subscriber, pub, seq, qos, dup, app, node, pid, intact}
        a PUBLISH received; app=False for a QoS2 retransmission of a packet id still awaiting PUBREL (the receiver
        already has it, [MQTT-4.3.3-9]: it is not delivered to the application again); intact=False when the
        payload does not match the user properties
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

Event = dict[str, Any]


class HistoryWriter:
    """Appends events to a JSON Lines file; buffered, flushed on close."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] = path.open("w", encoding="utf-8", buffering=1 << 16)
        self.count = 0

    def write(self, e: str, **fields: Any) -> None:
        """Record one event."""
        fields["e"] = e
        self._fh.write(json.dumps(fields, separators=(",", ":")) + "\n")
        self.count += 1

    def close(self) -> None:
        """Flush and close the file."""
        self._fh.close()


def read_history(path: Path) -> Iterator[Event]:
    """Events of a history file, in order; a torn last line (writer killed) is skipped."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                return
            yield json.loads(line)


def payload_for(publisher: str, seq: int) -> bytes:
    """The payload a publisher sends for `seq` (the checker verifies it against the user properties)."""
    return f"{publisher}:{seq}:".encode() + b"x" * 32
