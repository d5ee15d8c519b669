"""In-process Broker over a real SqliteStore: what a node recovers with Broker.restore(store.load()) after it died."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from appliance.broker.broker import Broker
from appliance.broker.model import DeliveryState, Message, SubscriptionOptions
from appliance.broker.session import Session
from appliance.broker.settings import BrokerSettings
from appliance.protocol.packets import (
    MQTT_5,
    Connack,
    Connect,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from appliance.protocol.reason_codes import ReasonCode
from appliance.store import SqliteStore


class RecordingLink:
    """The broker's ClientLink port as an in-memory connection that records what the broker sends."""

    def __init__(self, protocol_version: int = MQTT_5) -> None:
        self.protocol_version = protocol_version
        self.sent: list[Packet] = []
        self.closed_with: int | None = None
        self.closed = False

    def send(self, packet: Packet) -> None:
        """Record a packet."""
        self.sent.append(packet)

    def publish(self, message: Message, qos: int, retain: bool, packet_id: int | None, dup: bool,
                subscription_ids: list[int]) -> bool:
        """Record a PUBLISH as the client would decode it."""
        self.sent.append(Publish(message.topic, message.payload, qos, retain, dup, packet_id))
        return True

    def close(self, reason_code: int | None = None) -> None:
        """Record the close."""
        self.closed, self.closed_with = True, reason_code

    def take(self) -> list[Packet]:
        """Everything sent since the last take()."""
        out, self.sent = self.sent, []
        return out


class Node:
    """One broker life on a store file: start, connect clients, settle commits, die."""

    def __init__(self, path: Path, clock: Callable[[], float]) -> None:
        self.store = SqliteStore(path)
        self.store.open()
        snapshot = self.store.load()
        self.store.start(asyncio.get_running_loop())
        self.broker = Broker(BrokerSettings(node_id="unit"), self.store, clock=clock)
        self.broker.restore(snapshot)

    async def settle(self) -> None:
        """Wait until everything queued so far is committed and its callbacks (CONNACK, PUBACK...) have run."""
        done = asyncio.get_running_loop().create_future()
        self.store.after_commit(done.set_result, None)
        await asyncio.wait_for(done, 30)

    async def connect(self, client_id: str, clean: bool = True, expiry: int = 3600, receive_maximum: int | None = None,
                      will: Will | None = None) -> tuple[Session, RecordingLink]:
        """CONNECT a v5 client and return its session and link once CONNACK went out."""
        link = RecordingLink()
        props = Properties(session_expiry_interval=expiry, receive_maximum=receive_maximum)
        session = self.broker.connect(link, Connect(client_id, MQTT_5, clean, 60, will=will, properties=props),
                                      ReasonCode.SUCCESS)
        assert session is not None
        await self.settle()
        assert isinstance(link.sent[0], Connack), link.sent
        return session, link

    async def die(self) -> None:
        """Stop as a crash would leave the disk: no shutdown of the broker, only what was committed."""
        await self.settle()
        await self.store.async_close()


@pytest.fixture
async def clock() -> AsyncIterator[list[float]]:
    """A wall clock the test moves by hand: clock[0] is now."""
    yield [1_800_000_000.0]


def payloads(packets: list[Packet]) -> list[bytes]:
    """Payloads of the PUBLISH packets among `packets`."""
    return [p.payload for p in packets if isinstance(p, Publish)]


async def test_restore_recovers_queues_inflight_qos2_retained_and_subscriptions(tmp_path: Path, clock) -> None:
    db = tmp_path / "broker.db"
    one = Node(db, lambda: clock[0])
    b = one.broker
    watch, watch_link = await one.connect("watch")
    b.handle(watch, watch_link, Subscribe(1, [SubscriptionRequest("in/#", 1)]))
    await one.settle()
    b.connection_lost(watch, watch_link)  # offline, persistent

    sub, sub_link = await one.connect("sub", receive_maximum=2)
    b.handle(sub, sub_link, Subscribe(2, [SubscriptionRequest("q/+", 1), SubscriptionRequest("x/#", 2)]))
    await one.settle()
    assert isinstance(sub_link.take()[-1], Suback)
    pub, pub_link = await one.connect("pub", expiry=0)  # not persistent: nothing of it survives
    b.handle(pub, pub_link, Publish("keep/r", b"retained", 1, True, packet_id=1))
    b.handle(pub, pub_link, Publish("x/two", b"exactly-once", 2, packet_id=2))
    for n in range(4):
        b.handle(pub, pub_link, Publish("q/a", f"q{n}".encode(), 1, packet_id=10 + n))
    await one.settle()
    first = sub_link.take()
    # the window (Receive Maximum 2) is full; the QoS2 PUBLISH left only after its packet id was committed
    assert sorted(payloads(first)) == [b"exactly-once", b"q0"]
    sent = {p.qos: p.packet_id for p in first if isinstance(p, Publish)}
    qos2_pid, qos1_pid = sent[2], sent[1]
    b.handle(sub, sub_link, Pubrec(qos2_pid))  # QoS2 outbound now awaits PUBCOMP
    b.handle(sub, sub_link, Publish("in/q2", b"held", 2, packet_id=7))  # QoS2 inbound: PUBREL never comes
    await one.settle()
    assert sub_link.take() == [Pubrel(qos2_pid), Pubrec(7)]
    assert [a.packet_id for a in pub_link.take() if isinstance(a, Puback | Pubrec)] == [1, 2, 10, 11, 12, 13]
    await one.die()  # "sub" was connected when the node died

    clock[0] += 10
    two = Node(db, lambda: clock[0])
    b2 = two.broker
    assert set(b2.sessions) == {"watch", "sub"}
    restored = b2.sessions["sub"]
    assert restored.record.subscriptions == {"q/+": SubscriptionOptions(1), "x/#": SubscriptionOptions(2)}
    assert [(c, f) for c, f, _ in b2.router.tree.match("q/zz").subscribers] == [("sub", "q/+")]
    assert {pid: (d.state, d.message.payload) for pid, d in restored.inflight.items()} == {
        qos2_pid: (DeliveryState.RELEASED, b"exactly-once"), qos1_pid: (DeliveryState.SENT, b"q0")}
    assert [d.message.payload for d in restored.queue] == [b"q1", b"q2", b"q3"]
    assert restored.incoming_qos2 == {7: None}
    assert b2.router.retained["keep/r"].payload == b"retained"
    assert restored.record.disconnected_at == clock[0]  # it was connected when the node died
    assert [d.message.payload for d in b2.sessions["watch"].queue] == [b"held"]

    sub2, link2 = await two.connect("sub", clean=False, receive_maximum=2)
    got = link2.take()
    assert got[0] == Connack(True, ReasonCode.SUCCESS, got[0].properties)  # [MQTT-3.2.2-2]
    assert got[1:] == [Pubrel(qos2_pid), Publish("q/a", b"q0", 1, False, True, qos1_pid)]  # [MQTT-4.4.0-1]
    b2.handle(sub2, link2, Publish("in/q2", b"held", 2, dup=True, packet_id=7))  # the resend is not routed again
    b2.handle(sub2, link2, Pubrel(7))
    await two.settle()
    assert link2.take() == [Pubrec(7), Pubcomp(7)]  # not PACKET_IDENTIFIER_NOT_FOUND: the QoS2 state survived
    assert [d.message.payload for d in b2.sessions["watch"].queue] == [b"held"]  # exactly once [MQTT-4.3.3]
    b2.handle(sub2, link2, Pubcomp(qos2_pid))
    b2.handle(sub2, link2, Puback(qos1_pid))
    received: list[bytes] = []
    for _ in range(5):
        for packet in link2.take():
            if isinstance(packet, Publish):
                received.append(packet.payload)
                b2.handle(sub2, link2, Puback(packet.packet_id))  # type: ignore[arg-type]
    assert received == [b"q1", b"q2", b"q3"]
    assert sub2.queued_count() == 0
    await two.die()

    three = Node(db, lambda: clock[0])  # the acknowledgements were durable too
    assert three.broker.sessions["sub"].queued_count() == 0
    assert three.broker.sessions["sub"].incoming_qos2 == {}
    await three.die()


async def test_will_of_a_session_connected_when_the_node_died_is_scheduled_at_restore(tmp_path: Path, clock) -> None:
    # "watcher" sorts after "now" and "later" on purpose: the will must reach subscribers restored after the dead client
    db = tmp_path / "broker.db"
    one = Node(db, lambda: clock[0])
    b = one.broker
    watcher, watcher_link = await one.connect("watcher")
    b.handle(watcher, watcher_link, Subscribe(1, [SubscriptionRequest("wills/#", 1)]))
    await one.settle()
    b.connection_lost(watcher, watcher_link)
    await one.connect("now", will=Will("wills/now", b"gone-now", 1))
    await one.connect("later", will=Will("wills/later", b"gone-later", 1, properties=Properties(will_delay_interval=5)))
    await one.die()

    clock[0] += 100
    two = Node(db, lambda: clock[0])
    queue = two.broker.sessions["watcher"].queue
    assert [d.message.payload for d in queue] == [b"gone-now"]  # no will delay: published at restore
    two.broker.tick()
    assert [d.message.payload for d in queue] == [b"gone-now"]  # will delay of 5 s counts from the restore
    clock[0] += 6
    two.broker.tick()
    assert [d.message.payload for d in queue] == [b"gone-now", b"gone-later"]  # [MQTT-3.1.3-9]
    assert all(d.message.topic.startswith("wills/") and d.qos == 1 for d in queue)
    await two.die()

    three = Node(db, lambda: clock[0])  # the published wills are queued on disk, and never published again
    three.broker.tick()
    clock[0] += 60
    three.broker.tick()
    assert [d.message.payload for d in three.broker.sessions["watcher"].queue] == [b"gone-now", b"gone-later"]
    await three.die()


async def test_will_delay_pending_at_a_second_death_survives_it(tmp_path: Path, clock) -> None:
    db = tmp_path / "broker.db"
    one = Node(db, lambda: clock[0])
    b = one.broker
    watcher, watcher_link = await one.connect("watcher")
    b.handle(watcher, watcher_link, Subscribe(1, [SubscriptionRequest("wills/#", 1)]))
    await one.settle()
    b.connection_lost(watcher, watcher_link)
    await one.connect("slow", will=Will("wills/slow", b"gone-slow", 1, properties=Properties(will_delay_interval=30)))
    await one.die()
    two = Node(db, lambda: clock[0])  # schedules the will for restore time + 30 s, then dies before it is due
    assert two.broker.sessions["watcher"].queued_count() == 0
    await two.die()
    clock[0] += 31
    three = Node(db, lambda: clock[0])
    three.broker.tick()
    assert [d.message.payload for d in three.broker.sessions["watcher"].queue] == [b"gone-slow"]
    await three.die()
