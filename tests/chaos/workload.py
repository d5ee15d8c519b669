"""The chaos clients in one asyncio process: sequence-numbered QoS1/QoS2 publishers and churning persistent subscribers.

Run as `python -m tests.chaos.workload SPEC.json`; prints `READY` once every subscriber holds its subscription (the
driver starts the nemesis then), `DONE <json>` at the end. Every loop is bounded by the spec's deadlines.
Records go to OUT/history.jsonl (the checker's input) and, through ReceiptLogger, to OUT/receipts (delivery-log v1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.deliverylog.receipts import ReceiptLogger
from appliance.protocol.packets import (
    Packet,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
)

from .history import HistoryWriter, payload_for
from .mqttio import Conn, Gone

TOPIC_PREFIX = "chaos/"
SESSION_EXPIRY = 3600
CONNECT_TIMEOUT = 3.0
SILENCE_LIMIT = 4.0  # no byte from the broker for this long with work outstanding: treat the node as gone
PING_EVERY = 1.0


@dataclass
class Spec:
    """What one workload run does (written by the driver as JSON)."""

    nodes: list[str]  # "host:port", index = node number
    out: str
    seed: int = 1
    qos1_publishers: int = 2
    qos2_publishers: int = 2
    subscribers: int = 3
    subscriber_qos: list[int] = field(default_factory=lambda: [2])  # cycled over subscribers
    rate: float = 25.0  # messages per second per publisher
    window: int = 8  # in-flight QoS>0 messages per publisher
    traffic_s: float = 20.0
    drain_s: float = 30.0
    quiet_s: float = 3.0  # after the publishers finished, a subscriber stops once it has every acknowledged message,
    # or once it was connected and heard nothing for this long (what it still misses the checker calls lost)
    churn_s: tuple[float, float] = (1.5, 5.0)  # subscribers disconnect after a random time in this range
    max_messages: int = 100_000  # per publisher, a hard bound
    fleet: str = "chaos"
    device: str = "chaos-clients"

    @classmethod
    def load(cls, path: Path) -> Spec:
        """Read a spec file."""
        raw = json.loads(path.read_text())
        raw["churn_s"] = tuple(raw.get("churn_s", (1.5, 5.0)))
        return cls(**raw)


class Clients:
    """Shared state of all clients in the process: records, node list, phase events, randomness."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        out = Path(spec.out)
        (out / "receipts").mkdir(parents=True, exist_ok=True)
        self.history = HistoryWriter(out / "history.jsonl")
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.traffic_end = self.t0 + spec.traffic_s
        self.deadline = self.traffic_end + spec.drain_s
        self.publishers_done = asyncio.Event()
        self.acked: set[tuple[str, int]] = set()  # (publisher, seq) acknowledged with a success code
        self.loggers: list[ReceiptLogger] = []
        self.stats: dict[str, int] = {"reconnects": 0, "connect_failures": 0}

    def now(self) -> float:
        """Seconds since the workload started."""
        return round(self.loop.time() - self.t0, 4)

    def receipts(self, client_id: str) -> ReceiptLogger:
        """A receipt logger for one client (threads only, no writer child process)."""
        logger = ReceiptLogger(str(Path(self.spec.out) / "receipts"), client_id=client_id, fleet=self.spec.fleet,
                               device=self.spec.device, firmware="chaos", process=False, clock_synced=True,
                               format="jsonl.gz")  # nodes write Parquet: the Spark job gets both formats
        self.loggers.append(logger)
        return logger

    async def async_connect(self, client_id: str, clean: bool) -> tuple[Conn, bool]:
        """Connect to a random node until one answers (bounded by the run deadline)."""
        while self.loop.time() < self.deadline:
            node = self.rng.randrange(len(self.spec.nodes))
            host, port = self.spec.nodes[node].rsplit(":", 1)
            conn: Conn | None = None
            try:
                conn = await Conn.async_open(host, int(port), node, CONNECT_TIMEOUT)
                connack = await conn.async_connect(client_id, clean, SESSION_EXPIRY, CONNECT_TIMEOUT)
                self.history.write("conn", c=client_id, node=node, sp=connack.session_present, t=self.now())
                return conn, connack.session_present
            except (Gone, OSError):  # OSError: a socket reset under our feet
                if conn is not None:
                    conn.abort()
                self.stats["connect_failures"] += 1
                await asyncio.sleep(0.1 + self.rng.random() * 0.3)
        raise Gone(f"{client_id}: no node answered before the deadline")


@dataclass
class InFlight:
    """One publish awaiting its acknowledgement."""

    seq: int
    qos: int
    stamp: Any
    released: bool = False  # QoS2: PUBREC received, PUBREL sent


class Publisher:
    """Publishes seq 1, 2, ... at one QoS on its own topic; resends unacknowledged ones in order after reconnects."""

    def __init__(self, clients: Clients, client_id: str, qos: int) -> None:
        self.c = clients
        self.id = client_id
        self.qos = qos
        self.topic = f"{TOPIC_PREFIX}{client_id}"
        self.receipts = clients.receipts(client_id)
        self.inflight: dict[int, InFlight] = {}  # packet id -> message, insertion order = send order
        self.next_pid = 1
        self.sent = 0

    def _pid(self) -> int:
        while self.next_pid in self.inflight:
            self.next_pid = self.next_pid % 65535 + 1
        pid = self.next_pid
        self.next_pid = pid % 65535 + 1
        return pid

    def _publish_packet(self, pid: int, m: InFlight, dup: bool) -> Publish:
        props = Properties(user_properties=list(m.stamp.user_properties))
        return Publish(self.topic, payload_for(self.id, m.seq), m.qos, False, dup, pid, props)

    def _on_ack(self, packet: Any) -> None:
        """Record PUBACK / PUBREC / PUBCOMP; answer PUBREC with PUBREL. A refusal (error reason code: a netsplit
        policy, a minority side) ends the message under its sequence number, never resent under it: the checker
        counts it refused and flags its delivery as unexpected; what the publisher sends next takes the next
        numbers, so its stream stays in order. (3.1.1 would close the connection: resent in order, DUP.)"""
        m = self.inflight.get(packet.packet_id)
        if m is None:
            return
        stage = {Puback: "puback", Pubrec: "pubrec", Pubcomp: "pubcomp"}[type(packet)]
        self.c.history.write("ack", c=self.id, seq=m.seq, qos=m.qos, rc=packet.reason_code, stage=stage,
                             t=self.c.now())
        if packet.reason_code < 0x80 and not isinstance(packet, Pubcomp):
            self.c.acked.add((self.id, m.seq))
        if isinstance(packet, Pubrec) and packet.reason_code < 0x80:
            m.released = True
            return
        del self.inflight[packet.packet_id]
        self.receipts.acked(packet.packet_id, packet.reason_code or None)

    async def async_run(self) -> None:
        """Send until the traffic phase ends, then until every message is acknowledged or the deadline passes."""
        c = self.c
        first = True
        while c.loop.time() < c.deadline:
            done_sending = c.loop.time() >= c.traffic_end or self.sent >= c.spec.max_messages
            if done_sending and not self.inflight:
                break
            try:
                conn, present = await c.async_connect(self.id, first)
            except Gone:
                break
            first = False
            try:
                await self._async_session(conn, present)
            except (Gone, OSError):  # OSError: a socket reset under our feet
                c.stats["reconnects"] += 1
            finally:
                conn.abort()
        self.receipts.flush()

    async def _async_session(self, conn: Conn, present: bool) -> None:
        """One connection: resend what is outstanding, then publish at the configured rate."""
        c = self.c
        for pid, m in list(self.inflight.items()):  # resend in original order [MQTT-4.4.0-1]
            if m.released:
                conn.send(Pubrel(pid))
            else:
                conn.send(self._publish_packet(pid, m, dup=True))
                c.history.write("send", c=self.id, seq=m.seq, qos=m.qos, node=conn.node, dup=True, t=c.now())
        interval = 1.0 / c.spec.rate
        next_send = c.loop.time()
        last_ping = c.loop.time()
        while c.loop.time() < c.deadline:
            now = c.loop.time()
            sending = now < c.traffic_end and self.sent < c.spec.max_messages
            if not sending and not self.inflight:
                return
            if sending and now >= next_send and len(self.inflight) < c.spec.window:
                stamp = self.receipts.stamp(self.topic, payload_for(self.id, self.sent + 1), self.qos)
                self.sent += 1
                pid = self._pid()
                m = InFlight(stamp.seq, self.qos, stamp)
                self.inflight[pid] = m
                c.history.write("send", c=self.id, seq=m.seq, qos=m.qos, node=conn.node, dup=False, t=c.now())
                self.receipts.published(stamp, pid)
                conn.send(self._publish_packet(pid, m, dup=False))
                next_send = max(next_send + interval, now - 1.0)
            if self.inflight and now - conn.last_rx > SILENCE_LIMIT:
                raise Gone("broker silent")
            if now - last_ping > PING_EVERY:
                conn.send(Pingreq())
                last_ping = now
            await conn.async_drain(SILENCE_LIMIT)
            can_send = sending and len(self.inflight) < c.spec.window
            wait = min(max(next_send - c.loop.time(), 0.001), 0.25) if can_send else 0.25
            packet: Packet | None
            try:
                packet = await conn.async_recv(wait)
            except Gone:
                if conn.closed:
                    raise Gone("closed") from None
                continue
            while packet is not None:
                if isinstance(packet, Puback | Pubrec | Pubcomp):
                    self._on_ack(packet)
                    if isinstance(packet, Pubrec) and packet.reason_code < 0x80:
                        conn.send(Pubrel(packet.packet_id))
                packet = conn.inbox.get_nowait() if not conn.inbox.empty() else None
            if conn.closed:
                raise Gone("closed")


class Subscriber:
    """A persistent session subscribed to every publisher's topic; disconnects and reconnects to random nodes."""

    def __init__(self, clients: Clients, client_id: str, qos: int) -> None:
        self.c = clients
        self.id = client_id
        self.qos = qos
        self.receipts = clients.receipts(client_id)
        self.awaiting_rel: dict[int, tuple[str, int]] = {}  # QoS2 packet id -> (publisher, seq) [MQTT-4.3.3-9]
        self.subscribed = asyncio.Event()
        self.last_delivery = clients.loop.time()
        self.got: set[tuple[str, int]] = set()

    def drained(self) -> bool:
        """Publishers are done and this subscriber has every acknowledged message, or has been quiet long enough."""
        c = self.c
        if not c.publishers_done.is_set():
            return False
        quiet = c.loop.time() - self.last_delivery
        return (c.acked <= self.got and quiet > 0.5) or quiet > c.spec.quiet_s

    async def async_run(self) -> None:
        """Connect, subscribe once, then receive with churn until the drain is over."""
        c = self.c
        first = True
        while c.loop.time() < c.deadline:
            try:
                conn, present = await c.async_connect(self.id, first)
            except Gone:
                break
            if not present:
                self.awaiting_rel.clear()
            try:
                if first or not present:
                    await self._async_subscribe(conn)
                first = False
                if await self._async_receive(conn):
                    break
            except (Gone, OSError):  # OSError: a socket reset under our feet
                c.stats["reconnects"] += 1
            finally:
                conn.abort()
            if c.loop.time() < c.traffic_end:
                await asyncio.sleep(c.rng.random() * 0.5)
        self.subscribed.set()  # never block the start on a subscriber that gave up
        self.receipts.flush()

    async def _async_subscribe(self, conn: Conn) -> None:
        """SUBSCRIBE to chaos/# and wait for the SUBACK."""
        conn.send(Subscribe(1, [SubscriptionRequest(f"{TOPIC_PREFIX}#", self.qos)]))
        deadline = self.c.loop.time() + CONNECT_TIMEOUT
        while True:
            packet = await conn.async_recv(max(0.01, deadline - self.c.loop.time()))
            if isinstance(packet, Suback):
                code = packet.reason_codes[0]
                if code >= 0x80:
                    raise Gone(f"SUBACK refused 0x{code:02x}")
                self.c.history.write("sub", c=self.id, qos=code, node=conn.node, t=self.c.now())
                self.subscribed.set()
                return
            if isinstance(packet, Publish):
                self._on_publish(conn, packet)

    def _on_publish(self, conn: Conn, p: Publish) -> None:
        """Record a delivery and acknowledge it (QoS2: PUBREC now, PUBCOMP on PUBREL)."""
        props = p.properties.user_properties
        pub = next((v for k, v in props if k == "pub"), "")
        seq_text = next((v for k, v in props if k == "seq"), "")
        seq = int(seq_text) if seq_text.isdigit() else -1
        app = True
        if p.qos == 2 and p.packet_id in self.awaiting_rel:
            app = self.awaiting_rel[p.packet_id] != (pub, seq)  # a retransmission is not a new delivery
        self.c.history.write("recv", c=self.id, pub=pub, seq=seq, qos=p.qos, dup=p.dup, app=app, node=conn.node,
                             pid=p.packet_id,
                             intact=p.payload == payload_for(pub, seq), t=self.c.now())
        if app:
            self.receipts.received(p.topic, p.payload, p.qos, p.retain, props, dup=p.dup)
            self.last_delivery = self.c.loop.time()
            self.got.add((pub, seq))
        if p.qos == 1:
            conn.send(Puback(p.packet_id))  # type: ignore[arg-type]
        elif p.qos == 2:
            self.awaiting_rel[p.packet_id] = (pub, seq)  # type: ignore[index]
            conn.send(Pubrec(p.packet_id))  # type: ignore[arg-type]

    async def _async_receive(self, conn: Conn) -> bool:
        """Receive until churn time (traffic phase) or until quiet after the publishers finished."""
        c = self.c
        churn_at = c.loop.time() + c.rng.uniform(*c.spec.churn_s)
        last_ping = c.loop.time()
        while c.loop.time() < c.deadline:
            now = c.loop.time()
            if now < c.traffic_end and now >= churn_at:
                if c.rng.random() < 0.5:
                    conn.disconnect()
                else:
                    conn.abort()
                raise Gone("churn")
            if self.drained():
                conn.disconnect()
                return True
            if now - conn.last_rx > SILENCE_LIMIT:
                raise Gone("broker silent")
            if now - last_ping > PING_EVERY:
                conn.send(Pingreq())
                last_ping = now
            try:
                packet = await conn.async_recv(0.25)
            except Gone:
                if conn.closed:
                    raise
                continue
            if isinstance(packet, Publish):
                self._on_publish(conn, packet)
            elif isinstance(packet, Pubrel):
                known = self.awaiting_rel.pop(packet.packet_id, None)
                self.c.history.write("rel", c=self.id, pid=packet.packet_id, known=known is not None, t=c.now())
                conn.send(Pubcomp(packet.packet_id))
        return False


async def async_main(spec: Spec) -> dict[str, Any]:
    """Run every client; returns counts for the DONE line."""
    c = Clients(spec)
    subs = [Subscriber(c, f"sub{i}", spec.subscriber_qos[i % len(spec.subscriber_qos)])
            for i in range(spec.subscribers)]
    sub_tasks = [asyncio.create_task(s.async_run()) for s in subs]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(s.subscribed.wait() for s in subs)), 30)
    # traffic starts now: re-anchor the phases so every publisher gets its full traffic time
    c.traffic_end = c.loop.time() + spec.traffic_s
    c.deadline = c.traffic_end + spec.drain_s
    print("READY", flush=True)
    pubs = [Publisher(c, f"pub{i}", 1) for i in range(spec.qos1_publishers)]
    pubs += [Publisher(c, f"pub{i + spec.qos1_publishers}", 2) for i in range(spec.qos2_publishers)]
    pub_tasks = [asyncio.create_task(p.async_run()) for p in pubs]
    await asyncio.gather(*pub_tasks)
    c.publishers_done.set()
    for s in subs:
        s.last_delivery = max(s.last_delivery, c.loop.time())
    await asyncio.gather(*sub_tasks)
    c.history.close()
    for logger in c.loggers:
        logger.close()
    return {"sent": sum(p.sent for p in pubs), "unacked": sum(len(p.inflight) for p in pubs),
            "records": c.history.count, **c.stats, "wall_s": round(c.now(), 1)}


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m tests.chaos.workload SPEC.json`."""
    args = sys.argv[1:] if argv is None else argv
    spec = Spec.load(Path(args[0]))
    t0 = time.monotonic()
    result = asyncio.run(async_main(spec))
    result["process_s"] = round(time.monotonic() - t0, 1)
    print("DONE " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
