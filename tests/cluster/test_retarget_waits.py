"""A forward retargeted to a subscriber's new node is still waited for by what waited for it on the old node: the
publisher's PUBREC and the release of its pending QoS2 entry (registered by `_qos2_settle` when it was routed).
Before, retargeting settled the old forward's waits at the local commit: the pending entry left the publisher's
replicas and the PUBREC went out before the new node had the message (a publisher node dying then left the message
only in its durable buffer, which it drops on restart once a session resumed from its copy took its pending
messages over).

Real node (broker + SQLite + ClusterWiring) and bare ClusterService peers on loopback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import MIGRATED, OP_ENQUEUE_MANY, OP_STRANDED_DEL, SessionClaim, encode_claim
from appliance.cluster.wire import Forward
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=2)}


class HeldTarget(Peer):
    """A peer that acknowledges forwards only when told to."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id)
        self.forwards: list[tuple[str, Forward]] = []

    def _forward(self, peer: str, fwd: Forward) -> None:
        self.received.append(fwd.message.msg_id)
        self.forwards.append((peer, fwd))

    def ack_forwards(self) -> None:
        """Commit every forward received so far."""
        for peer, fwd in self.forwards:
            self.svc.forward_committed(peer, fwd.seq)


async def _acking(peer: Peer) -> None:
    while True:
        peer.ack_replicas()
        await asyncio.sleep(0.02)


async def test_a_retargeted_qos2_forward_is_waited_for_on_its_new_node(tmp_path: Path) -> None:
    """na routes pub's QoS2 message m1 to s on nb (pending on pub's replica nr until nb acks). s moves to nc before nb
    acked: the forward follows it. m1's PUBREC and its pending entry's release wait for nc's ack."""
    node = await start_node(tmp_path / "na", "na", ("nb", "nc", "nr"))
    wiring = wiring_of(node)
    pub = next(c for c in (f"p{n}" for n in range(100)) if rendezvous(c, ["nb", "nc", "nr"], 1) == ["nr"])
    nb, nc, nr = HeldTarget("nb"), HeldTarget("nc"), Peer("nr")
    task: asyncio.Task[None] | None = None
    try:
        for peer in (nb, nc, nr):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        task = asyncio.get_running_loop().create_task(_acking(nr))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 1000.0, MIGRATED, True, dict(SUBS))))
        wiring.svc.put("sessions", pub, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, {})))
        adopt_session(node.broker, SessionRecord(pub, 1, 3600), [], [])
        await until(lambda: any(r.client_id == pub for _p, r in nr.replicated), "pub's snapshot at nr")

        acked: list[str] = []
        m1 = Message("m1", "t/x", b"x", 2, False, pub, 1000.0)
        wiring.store.save_incoming_qos2(pub, 1, None)  # what the broker does for a QoS2 PUBLISH
        wiring.qos2_received(m1)
        wiring.route_remote(m1, [])
        wiring.store.after_commit(acked.append, "PUBREC m1")
        await until(lambda: "m1" in nb.received, "m1's forward at nb")

        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nc", 2000.0, MIGRATED, True, dict(SUBS))))
        await until(lambda: "m1" in nc.received, "m1's forward retargeted to nc")
        await asyncio.sleep(0.3)
        released = [r for _p, r in nr.replicated if r.client_id == pub and r.op == OP_STRANDED_DEL]
        assert (acked, released) == ([], [])  # nc has not acknowledged m1 yet

        nc.ack_forwards()
        await until(lambda: acked == ["PUBREC m1"], "m1's PUBREC once nc acknowledged it")
        await until(lambda: any(r.client_id == pub and r.op == OP_STRANDED_DEL for _p, r in nr.replicated),
                    "m1's pending entry released at nr")
    finally:
        if task is not None:
            task.cancel()
        for peer in (nb, nc, nr):
            await peer.svc.async_stop()
        await stop_node(node)


async def test_a_forward_retargeted_into_a_session_here_is_waited_for_on_its_replica(tmp_path: Path) -> None:
    """na routes pub's QoS1 message m1 to s on nb; before nb acked it, s comes to na (its claim names na, the session
    is here): the forward is delivered into s here. m1's PUBACK waits until s's replica nr holds the enqueue, not
    only na's disk."""
    node = await start_node(tmp_path / "na", "na", ("nb", "nr"))
    wiring = wiring_of(node)
    s = next(c for c in (f"s{n}" for n in range(100)) if rendezvous(c, ["nb", "nr"], 1) == ["nr"])
    nb, nr = HeldTarget("nb"), Peer("nr")
    try:
        for peer in (nb, nr):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", s, encode_claim(SessionClaim("nb", 1000.0, MIGRATED, True, dict(SUBS))))
        acked: list[str] = []
        wiring.route_remote(Message("m1", "t/x", b"x", 1, False, "pub", 1000.0), [])
        wiring.store.after_commit(acked.append, "PUBACK m1")
        await until(lambda: "m1" in nb.received, "m1's forward at nb")

        adopt_session(node.broker, SessionRecord(s, 5, 3600, subscriptions=dict(SUBS)), [], [])
        wiring.svc.put("sessions", s, encode_claim(SessionClaim("na", 2000.0, MIGRATED, True, dict(SUBS))))
        await until(lambda: [d.message.msg_id for d in node.broker.sessions[s].queue] == ["m1"], "m1 in s here")
        await until(lambda: any(r.client_id == s and r.op == OP_ENQUEUE_MANY for _p, r in nr.replicated),
                    "m1's enqueue at nr")
        await asyncio.sleep(0.3)
        assert acked == []  # nr has not acknowledged the enqueue yet

        nr.ack_replicas()
        await until(lambda: acked == ["PUBACK m1"], "m1's PUBACK once nr holds it")
    finally:
        for peer in (nb, nr):
            await peer.svc.async_stop()
        await stop_node(node)
