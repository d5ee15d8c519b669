"""Messages for a session whose claim names this node before its hand-over has arrived (chaos seed 30318, a lost
QoS2 message): node1 let sub1 go to node2 (its takeover question had crossed a dying link) and wrote node2's claim;
the hand-over was lost with that link, while node0 relayed the claim to node2 at once. Until node1 resent the
hand-over, node2 routed pub2's message #139 for sub1 nowhere: the claim said "here", but there was no session here
yet (PUBREC and PUBCOMP went out; sub1 never got #139). A forward for sub1 arriving meanwhile was dropped likewise.

Real node (broker + SQLite + ClusterWiring) and bare ClusterService peers, on loopback.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import FRESH, MIGRATED, SessionClaim, encode_claim, encode_handover
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.wire import Forward, SessionState
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}
FROM_OWNER = bytes([1])


def _message(msg_id: str, n: int) -> Message:
    return Message(msg_id, "t/x", b"x", 1, False, "pub", 1000.0 + n)


async def test_messages_for_a_session_whose_hand_over_is_in_flight_join_it_when_it_arrives(tmp_path: Path) -> None:
    """n1 owned s and handed it to n2 (the hand-over lost with their link); n0 relays n2's claim to n2 first. Then
    m2 is published on n2 and n0 forwards m3 for s to n2: both must reach s once n1's resent hand-over (m1) arrives,
    after m1, in order. Before the fix n2 routed m2 nowhere and dropped m3 (the claim said "here", no session yet)."""
    n2 = await start_node(tmp_path / "n2", "n2", ("n0", "n1"))
    relay, old_owner = Peer("n0"), Peer("n1")
    at_old_owner: list[str] = []
    # n1 does not commit what n2 forwards (a real n1 would pass it back on after its hand-over): it stays buffered
    old_owner.svc.cb.on_forward = lambda _p, fwd: at_old_owner.append(fwd.message.msg_id)
    relay.svc.spaces["sessions"] = ReplicatedSpace("sessions", "n0")
    wiring = wiring_of(n2)
    try:
        await relay.svc.async_start()
        await link(wiring.svc, relay.svc)
        relay.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 1000.0, FRESH, True, dict(SUBS))))
        await until(lambda: "s" in wiring.claims, "n1's claim of s at n2")
        handed = SessionClaim("n2", 2000.0, MIGRATED, True, dict(SUBS), {"n1": 2})  # written by n1, relayed by n0
        relay.svc.put("sessions", "s", encode_claim(handed))
        await until(lambda: wiring.claims["s"].owner == "n2", "n2's claim of s at n2 (relayed by n0)")
        assert "s" not in n2.broker.sessions  # the hand-over has not arrived

        wiring.route_remote(_message("m2", 2), [])  # published on n2 meanwhile
        fwd = relay.svc.forward("n2", _message("m3", 3), ("s",))  # n0's forward, retargeted to s's new owner
        await until(lambda: relay.svc.senders["n2"].in_transit == 0, "n2's ack of m3")
        assert fwd.seq

        await old_owner.svc.async_start()
        await link(wiring.svc, old_owner.svc)
        record = SessionRecord("s", 2, 3600, subscriptions=dict(SUBS))
        state = encode_handover(2000.0, record, [Delivery(1, _message("m1", 1), 1, False)], [], ["m1"])
        old_owner.svc.send("n2", SessionState(0, "s", True, FROM_OWNER + state))  # resent at link-up
        await until(lambda: "s" in n2.broker.sessions, "the hand-over adopted at n2")
        await until(lambda: len(n2.broker.sessions["s"].queue) >= 3, "m2 and m3 in s")
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m1", "m2", "m3"]
        await until(lambda: [d.message.msg_id for d in n2.store.load().queues.get("s", [])] == ["m1", "m2", "m3"],
                    "s with m1 m2 m3 on n2's disk")
        wiring.route_remote(_message("m4", 4), [])  # s is here now: nothing more goes to n1
        assert "m4" not in at_old_owner and wiring.svc.senders["n1"].in_transit == 0
    finally:
        await relay.svc.async_stop()
        await old_owner.svc.async_stop()
        await stop_node(n2)


async def test_a_forward_from_the_awaited_old_owner_is_not_sent_back_to_it(tmp_path: Path) -> None:
    """n2 awaits n1's hand-over of s, but n1 forwards a message for s: its hand-over would have come first on that
    link, so n1 has none left for n2 (it lost it). n2 must not send the message back to n1 (n1 would pass it on to
    s's owner, n2, again: a loop), and no longer routes s's messages to n1."""
    n2 = await start_node(tmp_path / "n2", "n2", ("n0", "n1"))
    old_owner = Peer("n1")
    back: list[Forward] = []

    def at_old_owner(peer: str, fwd: Forward) -> None:
        back.append(fwd)
        old_owner.svc.forward_committed(peer, fwd.seq)

    old_owner.svc.cb.on_forward = at_old_owner
    wiring = wiring_of(n2)
    try:
        await old_owner.svc.async_start()
        await link(wiring.svc, old_owner.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 1000.0, FRESH, True, dict(SUBS))))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n2", 2000.0, MIGRATED, True, dict(SUBS))))
        assert wiring.claims["s"].owner == "n2" and "s" not in n2.broker.sessions
        wiring.route_remote(_message("m2", 2), [])  # awaiting n1's hand-over: via n1
        await until(lambda: len(back) == 1, "m2 at n1")
        old_owner.svc.forward("n2", _message("m3", 3), ("s",))
        await until(lambda: old_owner.svc.senders["n2"].in_transit == 0, "n2's ack of m3")
        wiring.route_remote(_message("m4", 4), [])
        assert [f.message.msg_id for f in back] == ["m2"]
    finally:
        await old_owner.svc.async_stop()
        await stop_node(n2)
