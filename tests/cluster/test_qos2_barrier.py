"""A QoS2 message leaves for its subscribers' nodes only once a live replica of its publisher holds its packet id,
also when the publisher's replica is cut off right at the PUBLISH (the asymmetric-partition QoS2 duplicate of the
pending-messages limits): the barrier's failure_timeout expiry fired before the replica's link was declared down
(chaos 30507's logs: "QoS2 packet id of pub3 not acknowledged by ['node0'] within failure_timeout: forwards
released" 22 ms before "peer node0 down", its last bytes having arrived just after the PUBLISH), so the forwards went
out while no reachable replica had the id; killed then, the publisher resumed from a copy without it and its DUP
resend was routed as new. An unacknowledged replica that has gone silent is now waited for until its link is
declared down, when the session is re-replicated (a snapshot with the id) and the forwards wait for that.

Real node (broker + SQLite + ClusterWiring), bare ClusterService peers and a TCP forwarder on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.link import LinkState
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import (
    MIGRATED,
    OP_QOS2_ADD,
    OP_SNAPSHOT,
    SessionClaim,
    decode_snapshot,
    encode_claim,
)
from appliance.cluster.wire import Forward, Replicate
from tests.cluster.wired_node import Peer, link, publish_qos2_on, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=2)}


class Cut:
    """A TCP forwarder between a dialling peer and a node whose two directions can be silenced separately."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.to_target = self.to_dialler = True  # bytes pass
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, to_target: bool) -> None:
        with contextlib.suppress(OSError):
            while data := await r.read(65536):
                if self.to_target if to_target else self.to_dialler:
                    w.write(data)
        w.close()

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        for coro in (self._pipe(r, uw, True), self._pipe(ur, w, False)):
            task = asyncio.get_running_loop().create_task(coro)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _acking(peer: Peer) -> None:
    while True:
        peer.ack_replicas()
        await asyncio.sleep(0.02)


def _holds_pid(ops: list[tuple[str, Replicate]], cid: str, pid: int) -> bool:
    return any(r.client_id == cid and r.op == OP_SNAPSHOT and pid in decode_snapshot(r.data)[3] for _p, r in ops)


async def test_a_qos2_forward_waits_for_a_live_replica_when_the_publishers_replica_goes_silent(tmp_path: Path) -> None:
    """na owns pub (replica n0, dialled through a forwarder) and routes pub's QoS2 m1 to s on nt. Right at the
    PUBLISH the forwarder stops passing na -> n0 (the packet id never reaches n0); n0's bytes still reach na for
    0.3 s, then nothing. m1 must reach nt only after nc, pub's next replica, holds packet id 1."""
    na = await start_node(tmp_path / "na", "na", ("n0", "nc", "nt"), failure_timeout=1.0)
    wiring = wiring_of(na)
    pub = next(c for c in (f"p{n}" for n in range(200))
               if rendezvous(c, ["n0", "nc", "nt"], 1) == ["n0"] and rendezvous(c, ["nc", "nt"], 1) == ["nc"])
    n0, nc, nt = Peer("n0"), Peer("nc"), Peer("nt")
    seen_at_m1: list[bool] = []

    def on_forward(peer: str, fwd: Forward) -> None:
        seen_at_m1.append(_holds_pid(nc.replicated, pub, 1))
        nt.svc.forward_committed(peer, fwd.seq)

    nt.svc.cb.on_forward = on_forward
    cut: Cut | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        for svc in (wiring.svc, n0.svc, nc.svc, nt.svc):  # the forwarder changes the TCP endpoints, as NAT would
            svc.links.bind_channel = False
        for peer in (n0, nc, nt):
            await peer.svc.async_start()
        cut = Cut(wiring.svc.port)
        n0.svc.async_add_seed("127.0.0.1", await cut.start())
        await until(lambda: wiring.svc.links.is_up("n0") and n0.svc.links.is_up("na"), "na-n0 link (forwarded)")
        for peer in (nc, nt):
            await link(wiring.svc, peer.svc)
        tasks += [asyncio.get_running_loop().create_task(_acking(p)) for p in (n0, nc)]
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nt", 1000.0, MIGRATED, True, dict(SUBS))))
        wiring.svc.put("sessions", pub, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, {})))
        adopt_session(na.broker, SessionRecord(pub, 1, 3600), [], [])
        await until(lambda: wiring.assigned.get(pub) == ["n0"] and any(r.client_id == pub for _p, r in n0.replicated),
                    "pub's snapshot at n0")
        await asyncio.sleep(0.1)

        cut.to_dialler = False  # na -> n0 silenced: m1's packet id never reaches n0
        na.broker.sessions[pub].incoming_qos2[1] = None  # what the broker does for a QoS2 PUBLISH
        m1 = Message("m1", "t/x", b"x", 2, False, pub, 1000.0)
        wiring.store.save_incoming_qos2(pub, 1, None)
        wiring.qos2_received(m1)
        wiring.route_remote(m1, [])
        await asyncio.sleep(0.3)  # n0's heartbeats still arrive
        cut.to_target = False
        await until(lambda: seen_at_m1, "m1 at nt")
        assert seen_at_m1 == [True], "m1 reached nt before any live replica of pub held its packet id"
    finally:
        for task in tasks:
            task.cancel()
        for peer in (n0, nc, nt):
            await peer.svc.async_stop()
        if cut is not None:
            await cut.stop()
        await stop_node(na)


async def test_a_replica_alive_but_slow_to_acknowledge_holds_qos2_forwards_for_failure_timeout_only(
        tmp_path: Path) -> None:
    """pub's replica nb never acknowledges m1's packet id but its link is alive (heartbeats): m1 goes to nt once
    failure_timeout has passed (availability: the replica is slow, not gone)."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nt"), failure_timeout=1.0)
    wiring = wiring_of(na)
    pub = next(c for c in (f"p{n}" for n in range(200)) if rendezvous(c, ["nb", "nt"], 1) == ["nb"])
    nb, nt = Peer("nb"), Peer("nt")
    try:
        for peer in (nb, nt):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nt", 1000.0, MIGRATED, True, dict(SUBS))))
        wiring.svc.put("sessions", pub, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, {})))
        adopt_session(na.broker, SessionRecord(pub, 1, 3600), [], [])
        await until(lambda: any(r.client_id == pub for _p, r in nb.replicated), "pub's snapshot at nb")
        nb.ack_replicas()

        na.broker.sessions[pub].incoming_qos2[1] = None
        m1 = Message("m1", "t/x", b"x", 2, False, pub, 1000.0)
        wiring.store.save_incoming_qos2(pub, 1, None)
        wiring.qos2_received(m1)
        started = asyncio.get_running_loop().time()
        wiring.route_remote(m1, [])
        await until(lambda: "m1" in nt.received, "m1 at nt")
        assert asyncio.get_running_loop().time() - started >= 0.9
        assert wiring.svc.links.is_up("nb")
    finally:
        for peer in (nb, nt):
            await peer.svc.async_stop()
        await stop_node(na)


async def test_a_qos2_forward_stays_held_while_the_silent_replicas_link_is_closing(tmp_path: Path) -> None:
    """na owns pub (replica nb) and routes pub's QoS2 m1 to s on nt; nb never acknowledges m1's packet id. nb's link
    expires: its connection is closed, its socket still closing, the down not reported yet, when the barrier's
    expiry runs (chaos seed 110766's logs: node1, SIGCONTed, its overdue expiry rescheduled every iteration,
    logged "QoS2 packet id of pub3 not acknowledged by ['node0'] ... forwards released" 17 ms before "cluster link
    to node0 down"). m1 must not leave for nt then: once the down is reported, pub is re-replicated on nc (a
    snapshot with the id) and m1 waits for nc's ack. Before: released at once, no replica left holding the id."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc", "nt"), failure_timeout=1.0)
    wiring = wiring_of(na)
    pub = next(c for c in (f"p{n}" for n in range(200))
               if rendezvous(c, ["nb", "nc", "nt"], 1) == ["nb"] and rendezvous(c, ["nc", "nt"], 1) == ["nc"])
    nb, nc, nt = Peer("nb"), Peer("nc"), Peer("nt")
    seen_at_m1: list[bool] = []

    def on_forward(peer: str, fwd: Forward) -> None:
        seen_at_m1.append(_holds_pid(nc.replicated, pub, 1))
        nt.svc.forward_committed(peer, fwd.seq)

    nt.svc.cb.on_forward = on_forward
    task: asyncio.Task[None] | None = None
    try:
        for peer in (nb, nc, nt):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        task = asyncio.get_running_loop().create_task(_acking(nc))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nt", 1000.0, MIGRATED, True, dict(SUBS))))
        wiring.svc.put("sessions", pub, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, {})))
        adopt_session(na.broker, SessionRecord(pub, 1, 3600), [], [])
        await until(lambda: "s" in wiring.claims and any(r.client_id == pub for _p, r in nb.replicated),
                    "s's claim at na, pub's snapshot at nb")
        nb.ack_replicas()

        publish_qos2_on(na, pub, 1, Message("m1", "t/x", b"x", 2, False, pub, 1000.0))
        await until(lambda: any(r.client_id == pub and r.op == OP_QOS2_ADD for _p, r in nb.replicated),
                    "m1's packet id at nb (never acknowledged)")
        connection = wiring.svc.links._peers["nb"].link
        assert connection is not None
        connection.core.state = LinkState.CLOSED  # what the link's end does first, before its socket has closed
        (mark,) = wiring._unconfirmed
        wiring._q2_expire(mark)  # the overdue expiry, in that window
        await nb.svc.async_stop()
        await until(lambda: seen_at_m1, "m1 at nt")
        assert seen_at_m1 == [True], "m1 reached nt while no live replica of pub held its packet id"
    finally:
        if task is not None:
            task.cancel()
        for peer in (nb, nc, nt):
            await peer.svc.async_stop()
        await stop_node(na)
