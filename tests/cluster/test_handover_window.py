"""Messages for a session whose claim names this node before its hand-over has arrived (chaos seed 30318, a lost
QoS2 message): node1 let sub1 go to node2 (its takeover question had crossed a dying link) and wrote node2's claim;
the hand-over was lost with that link, while node0 relayed the claim to node2 at once. Until node1 resent the
hand-over, node2 routed pub2's message #139 for sub1 nowhere: the claim said "here", but there was no session here
yet (PUBREC and PUBCOMP went out; sub1 never got #139). A forward for sub1 arriving meanwhile was dropped likewise.
Chaos seed 30649 lost 6 messages in the same window (the old owner's forwards resent ahead of its hand-over); a
CONNECT, a forward from the old owner with no hand-over and a restart in the window must not lose anything either.

Real node (broker + SQLite + ClusterWiring) and bare ClusterService peers, on loopback.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import FRESH, MIGRATED, SessionClaim, encode_claim, encode_handover
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.wire import Forward, SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import Peer, link, relay_claim, start_node, stop_node, until, wiring_of

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
        await until(lambda: (old_owner.ack_replicas(), old_owner.svc.senders["n2"].in_transit == 0)[1],
                    "n2's ack of m3 (s started at n2, replicated to n1)")
        wiring.route_remote(_message("m4", 4), [])
        assert [f.message.msg_id for f in back] == ["m2"]
    finally:
        await old_owner.svc.async_stop()
        await stop_node(n2)


async def test_what_the_old_owner_forwarded_after_its_lost_hand_over_reaches_the_session(tmp_path: Path) -> None:
    """Chaos seed 30649 (6 acknowledged messages lost): node1, just back from an isolation, asked node2 for sub2;
    node2 let sub2 go (0 queued) and wrote node1's claim, which node0 relayed to node1, while the hand-over died
    with the node1-node2 link. node2 then forwarded pub0#40-42 / pub3#37-39 for sub2 to node1 (acknowledged when
    the dead link dropped). When the link returned, node2 resent those forwards ahead of its hand-over: node1 (the
    claim said "here", no session yet) routed them nowhere, then adopted the empty hand-over. Here na (old owner)
    hands s to nb with m1 while they are not linked, the relay nc gives nb the claim, na forwards m2 for s; at
    link-up s at nb must hold m1 then m2."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    nb = await start_node(tmp_path / "nb", "nb", ("na", "nc"))
    relay = Peer("nc")
    relay.svc.spaces["sessions"] = ReplicatedSpace("sessions", "nc")
    wa, wb = wiring_of(na), wiring_of(nb)

    try:
        await relay.svc.async_start()
        await link(wa.svc, relay.svc)
        await link(wb.svc, relay.svc)
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        adopt_session(na.broker, record, [Delivery(1, _message("m1", 1), 1, False)], [])
        wa.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        await relay_claim(relay, wa, wb, "s", "na")

        wa._on_session_message("nb", SessionTakeover(7, "s", "nb", False))  # nb's question; the answer is lost
        assert "s" not in na.broker.sessions and wa.claims["s"].owner == "nb"
        await relay_claim(relay, wa, wb, "s", "nb")  # nb's claim reaches nb through nc, ahead of the hand-over
        assert "s" not in nb.broker.sessions
        wa.route_remote(_message("m2", 2), [])  # published on na: buffered for s's new owner

        await link(wa.svc, wb.svc)
        await until(lambda: "s" in nb.broker.sessions, "the hand-over adopted at nb")
        await until(lambda: len(nb.broker.sessions["s"].queue) >= 2, "m2 in s at nb")
        assert [d.message.msg_id for d in nb.broker.sessions["s"].queue] == ["m1", "m2"]
    finally:
        await relay.svc.async_stop()
        await stop_node(na)
        await stop_node(nb)


async def test_a_forward_from_an_old_owner_without_hand_over_starts_the_session_here(tmp_path: Path) -> None:
    """n2 awaits n1's hand-over of s, but n1 forwards m3 for s first: n1 has no hand-over for n2 (it would have come
    first on that link; a restart loses it, its forwards are durable). The acknowledged m3 must not be routed
    nowhere: s starts here from its claim, with m3 (before the fix it was dropped, a warning in the log). If n1's
    hand-over turns up after all, what it holds joins s (late, not lost)."""
    n2 = await start_node(tmp_path / "n2", "n2", ("n0", "n1"))
    old_owner = Peer("n1")
    old_owner.svc.cb.on_forward = lambda p, fwd: old_owner.svc.forward_committed(p, fwd.seq)
    wiring = wiring_of(n2)
    try:
        await old_owner.svc.async_start()
        await link(wiring.svc, old_owner.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 1000.0, FRESH, True, dict(SUBS))))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n2", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n1": 2})))
        assert wiring.claims["s"].owner == "n2" and "s" not in n2.broker.sessions
        old_owner.svc.forward("n2", _message("m3", 3), ("s",))
        await until(lambda: "s" in n2.broker.sessions, "s started at n2")
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m3"]
        assert n2.broker.sessions["s"].record.subscriptions == SUBS
        await until(lambda: [d.message.msg_id for d in n2.store.load().queues.get("s", [])] == ["m3"],
                    "s with m3 on n2's disk")

        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        state = encode_handover(2000.0, record, [Delivery(1, _message("m1", 1), 1, False)], [], ["m1"])
        old_owner.svc.send("n2", SessionState(0, "s", True, FROM_OWNER + state))
        await until(lambda: len(n2.broker.sessions["s"].queue) >= 2, "m1 merged into s")
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m3", "m1"]
    finally:
        await old_owner.svc.async_stop()
        await stop_node(n2)


async def test_a_connect_while_the_hand_over_is_awaited_takes_it_in_when_it_arrives(tmp_path: Path) -> None:
    """The client of s connects to n2 while n2 awaits n1's hand-over of s (n1 unreachable): it gets a session here
    with m2, published on n2 meanwhile (routed to n1, not left waiting for n1's return), and the hand-over (m1),
    resent when n1 returns, joins it (late, not lost). Before the fix the hand-over was taken for one already
    adopted (the claim names n2, a session is here) and its queue was dropped."""
    n2 = await start_node(tmp_path / "n2", "n2", ("n0", "n1"))
    old_owner, relay = Peer("n1"), Peer("n0")
    wiring = wiring_of(n2)
    try:
        await relay.svc.async_start()
        await link(wiring.svc, relay.svc)  # n2 reaches half of the members: it serves its persistent sessions
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 1000.0, FRESH, True, dict(SUBS))))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n2", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n1": 2})))
        assert wiring.claims["s"].owner == "n2" and "s" not in n2.broker.sessions
        wiring.route_remote(_message("m2", 2), [])  # published on n2 meanwhile: buffered for n1 (awaited)
        fetch = wiring.prepare_connect("s", False)
        if fetch is not None:
            assert await fetch == ReasonCode.SUCCESS
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        if "s" not in n2.broker.sessions:  # the broker's CONNECT: a new session
            adopt_session(n2.broker, record, [], [])
        wiring.session_changed(record, connected=True)
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m2"]  # not left to n1's return
        assert wiring.svc.senders["n1"].in_transit == 0

        await old_owner.svc.async_start()
        await link(wiring.svc, old_owner.svc)
        m0 = Message("m0", "t/x", b"x", 2, False, "pub", 1000.0)  # QoS2, PUBREC'd by the client: it has it
        queue = [Delivery(1, m0, 2, False, packet_id=7, state=DeliveryState.RELEASED),
                 Delivery(2, _message("m1", 1), 1, False)]
        state = encode_handover(2000.0, record, queue, [], ["m0", "m1"])
        old_owner.svc.send("n2", SessionState(0, "s", True, FROM_OWNER + state))  # resent at link-up
        await until(lambda: len(n2.broker.sessions["s"].queue) >= 2, "m1 in s")
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m2", "m1"]  # not m0: a QoS2 duplicate
    finally:
        await relay.svc.async_stop()
        await old_owner.svc.async_stop()
        await stop_node(n2)


async def test_a_connect_while_the_hand_over_is_awaited_asks_the_reachable_old_owner_for_it(tmp_path: Path) -> None:
    """The client of s connects to n2 while n2 awaits n1's hand-over of s and n1 is reachable: n2 asks n1 again,
    n1 answers with the hand-over it made, and the client resumes s with m1 (not a fresh session)."""
    n2 = await start_node(tmp_path / "n2", "n2", ("n0", "n1"))
    old_owner = Peer("n1")
    wiring = wiring_of(n2)
    record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
    state = encode_handover(2000.0, record, [Delivery(1, _message("m1", 1), 1, False)], [], ["m1"])

    def answer(peer: str, msg: object) -> None:
        if isinstance(msg, SessionTakeover):
            old_owner.svc.send(peer, SessionState(msg.request_id, msg.client_id, True, FROM_OWNER + state))

    old_owner.svc.cb.on_session_message = answer
    try:
        await old_owner.svc.async_start()
        await link(wiring.svc, old_owner.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 1000.0, FRESH, True, dict(SUBS))))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n2", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n1": 2})))
        assert "s" not in n2.broker.sessions
        fetch = wiring.prepare_connect("s", False)
        assert fetch is not None and await fetch == ReasonCode.SUCCESS
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m1"]
        assert "s" not in wiring._stand_ins
    finally:
        await old_owner.svc.async_stop()
        await stop_node(n2)


async def test_a_forward_for_a_claim_here_without_session_or_awaited_hand_over_is_not_lost(tmp_path: Path) -> None:
    """n2 restarted between learning its claim of s and the hand-over (it no longer knows whose hand-over it
    awaits): a forward for s starts s here with it, and the hand-over, when it comes, joins s. A message for a
    non-persistent session in that state is counted as dropped (metric and delivery-log reason)."""
    n2 = await start_node(tmp_path / "n2", "n2", ("n0", "n1"))
    third, old_owner = Peer("n0"), Peer("n1")
    third.svc.cb.on_replicate = lambda p, rep: third.svc.replicate_committed(p, rep.seq)
    wiring = wiring_of(n2)
    try:
        await third.svc.async_start()
        await old_owner.svc.async_start()
        await link(wiring.svc, third.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n2", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n1": 2})))
        wiring.svc.put("sessions", "c", encode_claim(SessionClaim("n2", 2000.0, FRESH, False, dict(SUBS))))
        assert "s" not in n2.broker.sessions and "s" not in wiring._awaiting
        third.svc.forward("n2", _message("m3", 3), ("s", "c"))
        await until(lambda: third.svc.senders["n2"].in_transit == 0, "n2's ack of m3")
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m3"]
        assert "c" not in n2.broker.sessions and n2.broker.metrics.drops["cluster_no_session"] == 1

        await link(wiring.svc, old_owner.svc)
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        state = encode_handover(2000.0, record, [Delivery(1, _message("m1", 1), 1, False)], [], ["m1"])
        old_owner.svc.send("n2", SessionState(0, "s", True, FROM_OWNER + state))
        await until(lambda: len(n2.broker.sessions["s"].queue) >= 2, "m1 merged into s")
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m3", "m1"]
    finally:
        await third.svc.async_stop()
        await old_owner.svc.async_stop()
        await stop_node(n2)


async def test_a_node_restarted_while_awaiting_a_hand_over_serves_the_session_and_merges_it(tmp_path: Path) -> None:
    """n2 learnt its claim of s, then restarted before n1's hand-over came: it no longer knows whose hand-over it
    awaits. s starts at n2 at once (a local publish for it must not be routed nowhere), and the hand-over (m1),
    resent when n1 links up, joins it."""
    n2 = await start_node(tmp_path / "n2", "n2", ("n0", "n1"))
    old_owner = Peer("n1")
    try:
        wiring = wiring_of(n2)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 1000.0, FRESH, True, dict(SUBS))))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n2", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n1": 2})))
        assert "s" not in n2.broker.sessions
        await stop_node(n2)
        n2 = await start_node(tmp_path / "n2", "n2", ("n0", "n1"))
        wiring = wiring_of(n2)
        assert wiring.claims["s"].owner == "n2" and "s" in n2.broker.sessions
        n2.broker.router.route(_message("m2", 2))  # published on n2
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m2"]

        await old_owner.svc.async_start()
        await link(wiring.svc, old_owner.svc)
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        state = encode_handover(2000.0, record, [Delivery(1, _message("m1", 1), 1, False)], [], ["m1"])
        old_owner.svc.send("n2", SessionState(0, "s", True, FROM_OWNER + state))
        await until(lambda: len(n2.broker.sessions["s"].queue) >= 2, "m1 merged into s")
        assert [d.message.msg_id for d in n2.broker.sessions["s"].queue] == ["m2", "m1"]
    finally:
        await old_owner.svc.async_stop()
        await stop_node(n2)
