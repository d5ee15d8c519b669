"""The cluster wiring of one real node (broker + SQLite store + ClusterWiring, no peers reachable): a message that
reaches a session twice is queued once, and the outbound QoS2 flow is part of what the replicas hold."""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import OP_UPDATE, encode_handover
from appliance.cluster.wire import Forward, SessionState
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.config import load
from appliance.server.node import Node


async def _node(tmp_path: Path) -> Node:
    config = load(None, {"node": {"name": "na", "data_dir": str(tmp_path)},
                         "cluster": {"enabled": True, "secret": "k", "mdns": False, "bind": "127.0.0.1:0"}})
    node = Node(config)
    node.store.open()
    snapshot = node.store.load()
    node.store.start(asyncio.get_running_loop())
    node.broker.restore(snapshot)
    assert node.cluster is not None
    node.cluster.restore(snapshot)
    return node


async def _settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0.01)


def _message(n: int, qos: int = 1) -> Message:
    return Message(f"nb-1-{n}", "t/x", f"m{n}".encode(), qos, False, "pub", 1000.0 + n)


async def test_a_message_that_reaches_a_session_twice_is_queued_once(tmp_path: Path) -> None:
    """Chaos finding (QoS1 and QoS2 duplicates without any fault): a forward in flight to a subscriber's old node
    was retargeted to its new node when the subscriber moved, and the old node also passed its copy on; a losing
    owner's hand-over can repeat what the winner already had. The owner now drops a message it already queued."""
    node = await _node(tmp_path)
    wiring, broker = node.cluster, node.broker
    assert wiring is not None
    record = SessionRecord("s", 5, 3600, subscriptions={"t/#": SubscriptionOptions(qos=1)})
    adopt_session(broker, record, [], [])
    session = broker.sessions["s"]
    wiring._on_forward("nb", Forward(1, _message(1), ("s",)))
    wiring._on_forward("nc", Forward(1, _message(1), ("s",)))  # the same message on another node's stream
    wiring._on_forward("nc", Forward(2, _message(2), ("s", "elsewhere")))
    await _settle()
    assert [d.message.msg_id for d in session.queue] == ["nb-1-1", "nb-1-2"]
    delivered = session.queue.popleft()  # the client got it and acknowledged it: gone from the queue
    broker.store.remove_delivery("s", delivered.seq)
    wiring._on_forward("nb", Forward(2, _message(1), ("s",)))  # a late copy of a message already delivered
    await _settle()
    assert [d.message.msg_id for d in session.queue] == ["nb-1-2"]
    assert [d.message.msg_id for d in node.store.load().queues["s"]] == ["nb-1-2"]  # durable state agrees
    node.store.close()


async def test_a_session_taken_over_brings_the_ids_of_messages_it_already_had(tmp_path: Path) -> None:
    """Chaos finding: after a heal a node resent a forward the subscriber's old node had delivered and completed
    (its ack was lost in the split); the subscriber had moved meanwhile, so the forward was retargeted to the new
    owner, which delivered it again. The old owner's hand-over now names what it already queued."""
    node = await _node(tmp_path)
    wiring, broker = node.cluster, node.broker
    assert wiring is not None
    record = SessionRecord("s", 5, 3600, subscriptions={"t/#": SubscriptionOptions(qos=2)})
    state = encode_handover(1000.0, record, [], [], ["nb-1-1"])  # nb-1-1 delivered and completed on the old owner
    wiring._on_session_message("nb", SessionState(7, "s", True, bytes([1]) + state))  # FROM_OWNER, asker gave up
    session = broker.sessions["s"]
    wiring._on_forward("nc", Forward(1, _message(1, qos=2), ("s",)))  # the retargeted copy
    wiring._on_forward("nc", Forward(2, _message(2, qos=2), ("s",)))
    await _settle()
    assert [d.message.msg_id for d in session.queue] == ["nb-1-2"]
    node.store.close()


async def test_a_resent_hand_over_is_adopted_once(tmp_path: Path) -> None:
    """Chaos finding (a session lost): the old owner's SessionState went out on a link that was being replaced, the
    asker gave up and started a fresh session. Now the old owner resends the state on every link-up until the taker
    confirms (SessionDone), and the taker adopts a given hand-over once: a resend must not roll the session back."""
    node = await _node(tmp_path)
    wiring, broker = node.cluster, node.broker
    assert wiring is not None
    record = SessionRecord("s", 5, 3600, subscriptions={"t/#": SubscriptionOptions(qos=1)})
    state = SessionState(7, "s", True, bytes([1]) + encode_handover(1000.0, record, [], [], []))
    wiring._on_session_message("nb", state)
    wiring._on_forward("nc", Forward(1, _message(1), ("s",)))  # queued after the adoption
    wiring._on_session_message("nb", SessionState(0, "s", True, state.data))  # the resend after a link-up
    await _settle()
    assert [d.message.msg_id for d in broker.sessions["s"].queue] == ["nb-1-1"]
    node.store.close()


async def test_a_late_hand_over_for_a_session_held_here_is_merged_not_adopted(tmp_path: Path) -> None:
    """Chaos finding (139 lost, a session lost): a frozen owner, continued, answered a takeover request the asker
    had given up on; the asker had meanwhile resumed the session from a replica and queued more for it, and the
    late hand-over replaced that session. Now what the asker lacks of the late queue joins its session."""
    node = await _node(tmp_path)
    wiring, broker = node.cluster, node.broker
    assert wiring is not None
    record = SessionRecord("s", 5, 3600, subscriptions={"t/#": SubscriptionOptions(qos=1)})
    adopt_session(broker, record, [], [])  # resumed here from a replica copy
    wiring._on_forward("nc", Forward(1, _message(1), ("s",)))  # queued since
    late = Delivery(7, _message(2), 1, False)  # on the old owner only
    known = Delivery(6, _message(1), 1, False)  # on the old owner, and already here
    state = encode_handover(2000.0, record, [known, late], [], ["nb-1-0"])
    wiring._on_session_message("nb", SessionState(9, "s", True, bytes([1]) + state))
    await _settle()
    assert [d.message.msg_id for d in broker.sessions["s"].queue] == ["nb-1-1", "nb-1-2"]
    assert not wiring._remember("s", "nb-1-0")  # what the old owner had delivered is known here now
    node.store.close()


async def test_a_minority_side_does_not_serve_its_own_subscribers(tmp_path: Path) -> None:
    """Chaos finding (QoS2 duplicates): an isolated owner kept delivering QoS2 messages to its connected subscriber
    (the replicas could not learn they were sent) while the majority resumed the session from its replica, which
    sent them again. A node that reaches fewer than half of the members refuses its own subscribers' CONNECTs."""
    node = await _node(tmp_path)
    wiring, broker = node.cluster, node.broker
    assert wiring is not None
    record = SessionRecord("s", 5, 3600, subscriptions={"t/#": SubscriptionOptions(qos=2)})
    adopt_session(broker, record, [], [])
    wiring.session_changed(record, connected=True)  # claimed here
    assert wiring.prepare_connect("s", False) is None  # no other member known: a single node serves its sessions
    wiring.svc.membership.known("nb")
    assert wiring.prepare_connect("s", False) is None  # one of two is half: not a minority
    wiring.svc.membership.known("nc")  # three members, both others unreachable: a minority side
    fetch = wiring.prepare_connect("s", False)
    assert fetch is not None and await fetch == ReasonCode.SERVER_UNAVAILABLE
    assert wiring.prepare_connect("s", True) is None  # a clean start forks nothing
    node.store.close()


async def test_qos2_sent_and_released_states_are_replicated_qos1_sent_is_not(tmp_path: Path) -> None:
    """Chaos finding (QoS2 duplicates after failover): the replica did not know which QoS2 PUBLISH had been sent,
    so a resumed session sent it again as a new message. SENT (with its packet id) and RELEASED of a QoS2
    delivery are queue operations for the replicas; a QoS1 SENT is not (resent as new: an allowed duplicate)."""
    node = await _node(tmp_path)
    wiring, broker = node.cluster, node.broker
    assert wiring is not None
    sent: list[tuple[str, int, bool]] = []
    replicate = wiring.store.on_session_op
    assert replicate is not None

    def recording(cid: str, op: int, data: bytes, acked: bool) -> None:
        sent.append((cid, op, acked))
        replicate(cid, op, data, acked)

    wiring.store.on_session_op = recording
    record = SessionRecord("s", 5, 3600, subscriptions={"t/#": SubscriptionOptions(qos=2)})
    session = adopt_session(broker, record, [], [])
    wiring._on_forward("nb", Forward(1, _message(1, qos=1), ("s",)))
    wiring._on_forward("nb", Forward(2, _message(2, qos=2), ("s",)))
    for delivery in session.queue:  # what Session.pump does when the client is online
        delivery.packet_id, delivery.state = delivery.seq + 10, DeliveryState.SENT
        session.inflight[delivery.packet_id] = delivery
    sent.clear()
    q1, q2 = list(session.inflight.values())
    broker.store.update_delivery("s", q1.seq, DeliveryState.SENT, q1.packet_id)
    broker.store.update_delivery("s", q2.seq, DeliveryState.SENT, q2.packet_id)
    broker.store.update_delivery("s", q2.seq, DeliveryState.RELEASED, q2.packet_id)
    assert sent == [("s", OP_UPDATE, True), ("s", OP_UPDATE, True)]  # QoS2 only; the next ack waits for them
    await _settle()
    node.store.close()
