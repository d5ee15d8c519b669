"""The heal-time hold (chaos 8033): a node that did not object to another node's resuming a session from a replica
keeps its forwards for the session's old owner unsent until the new claim arrives, so a link-up to the old owner
crossing that answer does not hand them to a node that will pass them on only after newer ones.

One real node "na" (broker + SQLite + ClusterWiring) and its peers as real ClusterServices on loopback: the old
owner "nb", and the asker "nc" (where its question and its claim are what na receives from it, it is only named).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from appliance.broker.model import Message, SubscriptionOptions
from appliance.cluster.ownership import FRESH, SessionClaim, encode_claim
from appliance.cluster.wire import Forward, ForwardAck, SessionDone, SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.cluster_wiring import ClusterWiring
from appliance.server.node import Node
from tests.cluster.wired_node import Peer, link, start_node, until, wiring_of


async def _node(tmp_path: Path, failure_timeout: float = 5.0) -> tuple[Node, ClusterWiring]:
    node = await start_node(tmp_path, "na", ("nb", "nc"), failure_timeout)
    wiring = wiring_of(node)
    for cid, topic in (("s", "t/#"), ("u", "v/#")):  # both owned by nb
        claim = SessionClaim("nb", 1000.0, FRESH, True, {topic: SubscriptionOptions(qos=1)}, {}, {})
        wiring.svc.put("sessions", cid, encode_claim(claim))
    return node, wiring


def _message(msg_id: str, topic: str) -> Message:
    return Message(msg_id, topic, b"x", 1, False, "pub", 1000.0)


async def _link(wiring: ClusterWiring, peer: Peer) -> None:
    await peer.svc.async_start()
    await link(wiring.svc, peer.svc)


async def test_forwards_for_a_session_being_resumed_elsewhere_follow_its_new_claim(tmp_path: Path) -> None:
    """nb (the owner) is cut off; m1 for its subscriber s waits here. nc asks for s and we have nothing against its
    resuming it; then nb links up (the link-up crossed our answer). m1 must not go to nb, which would queue it as
    s's owner and pass it on only after learning nc's claim, after newer ones: it follows the claim to nc."""
    node, wiring = await _node(tmp_path)
    owner = Peer("nb")
    try:
        wiring.route_remote(_message("m1", "t/x"), [])  # for s on nb, unreachable: buffered
        wiring._on_session_message("nc", SessionTakeover(7, "s", "nc", False))  # answered "no session here"
        await _link(wiring, owner)
        resumed = SessionClaim("nc", 2000.0, FRESH, True, {"t/#": SubscriptionOptions(qos=1)}, {}, {})
        wiring.svc.put("sessions", "s", encode_claim(resumed))  # nc's claim arrives
        wiring.route_remote(_message("m2", "v/x"), [])  # for u, still on nb: goes out after the release
        await until(lambda: "m2" in owner.received, "m2 at nb")
        assert owner.received == ["m2"]  # m1 never reached the old owner
        assert [f.message.msg_id for f in wiring.svc.senders["nc"].resend()] == ["m1"]  # it follows s to nc
    finally:
        await owner.svc.async_stop()
        await wiring.async_stop()
        node.store.close()


@pytest.mark.parametrize("ending", ["asker refused", "asker silent"])
async def test_the_hold_ends_when_the_asker_gives_up(tmp_path: Path, ending: str) -> None:
    """nc asked for s, then refused its client: it says so with SessionDone for its question (the hold ends at
    once: it would last 3 x 20 s, far beyond the wait here), or says nothing (the hold ends after 3 x 1 s). nb
    still owns s and gets the buffered m1 before anything newer."""
    node, wiring = await _node(tmp_path, failure_timeout=20.0 if ending == "asker refused" else 1.0)
    owner = Peer("nb")
    try:
        wiring.route_remote(_message("m1", "t/x"), [])
        wiring._on_session_message("nc", SessionTakeover(7, "s", "nc", False))
        if ending == "asker refused":
            wiring._on_session_message("nc", SessionDone(7, "s"))
        await _link(wiring, owner)
        wiring.route_remote(_message("m2", "t/x"), [])
        await until(lambda: len(owner.received) == 2, "m1 and m2 at nb")
        assert owner.received == ["m1", "m2"]
    finally:
        await owner.svc.async_stop()
        await wiring.async_stop()
        node.store.close()


async def test_a_resume_refuses_when_the_owner_links_up_while_peers_are_asked(tmp_path: Path) -> None:
    """na is the asker this time: s's owner nb is unreachable, so na asks nc for a copy. nb links up before nc's
    answer arrives: nb may already have queued na's resent forwards for s as its owner, so resuming s here would
    fork it. na refuses the client (it retries, then takes s over from nb) and tells nc it need not hold for it."""
    node, wiring = await _node(tmp_path)
    asker_peer, owner = Peer("nc"), Peer("nb")
    try:
        await _link(wiring, asker_peer)
        fetch = wiring.prepare_connect("s", False)
        assert fetch is not None
        task = asyncio.get_running_loop().create_task(fetch)
        await until(lambda: asker_peer.session_messages, "na's question at nc")
        [question] = asker_peer.session_messages
        assert isinstance(question, SessionTakeover)
        await _link(wiring, owner)  # the owner is back while the question is out
        asker_peer.svc.send("na", SessionState(question.request_id, "s", False, b""))  # "no session here"
        assert await task == ReasonCode.SERVER_UNAVAILABLE
        assert "s" not in node.broker.sessions
        await until(lambda: len(asker_peer.session_messages) == 2, "SessionDone at nc")
        assert asker_peer.session_messages[1] == SessionDone(question.request_id, "s")
    finally:
        await owner.svc.async_stop()
        await asker_peer.svc.async_stop()
        await wiring.async_stop()
        node.store.close()


class FrozenOwner(Peer):
    """An owner that receives forwards but freezes (SIGSTOP) before its commit acknowledges them."""

    def _forward(self, peer: str, fwd: Forward) -> None:
        self.received.append(fwd.message.msg_id)


@pytest.mark.parametrize("asker", ["resumed", "refused"])
async def test_a_forward_the_old_owner_acknowledges_after_our_answer_follows_the_new_claim(tmp_path: Path,
                                                                                           asker: str) -> None:
    """Chaos seed 30624 (pub1#185 reordered for sub2). nb, s's owner, read m1 from us and froze before acking it
    (its replica write was still out); our link to it dropped. nc asked for s and we did not object (hold); nc
    resumed s from a copy without m1. nb, continued, linked up again and acknowledged m1 (its replica's ack came at
    the heal), so m1 left our buffer; m2, newer, was held and followed nc's claim, while m1 reached nc only when nb
    learnt the claim and passed on what nc lacked: after m2. m1 must follow the claim too, ahead of m2 (nc drops a
    second copy from nb by message id). If nc refused its client instead, m1 is nb's: nothing follows a later claim."""
    node, wiring = await _node(tmp_path)
    frozen, owner = FrozenOwner("nb"), Peer("nb")
    try:
        await _link(wiring, frozen)
        wiring.route_remote(_message("m1", "t/x"), [])  # for s on nb: sent, read, never acknowledged there
        await until(lambda: frozen.received == ["m1"], "m1 at nb")
        [m1] = wiring.svc.senders["nb"].resend()
        await frozen.svc.async_stop()  # nb frozen: the link drops
        await until(lambda: not wiring.svc.links.is_up("nb"), "the link to nb down")
        wiring._on_session_message("nc", SessionTakeover(7, "s", "nc", False))  # answered "no session here"
        await _link(wiring, owner)  # nb continued: a new link, our resend held
        owner.svc.send("na", ForwardAck(m1.seq))  # nb's commit of m1 done at last
        await until(lambda: not wiring.svc.senders["nb"].resend(), "nb's ack of m1")
        if asker == "refused":
            wiring._on_session_message("nc", SessionDone(7, "s"))
        wiring.route_remote(_message("m2", "t/x"), [])  # for s, still nb's here: held while nc may resume it
        resumed = SessionClaim("nc", 2000.0, FRESH, True, {"t/#": SubscriptionOptions(qos=1)}, {}, {})
        if asker == "refused":
            await until(lambda: owner.received == ["m2"] and not wiring.svc.senders["nb"].resend(), "nb's ack of m2")
        wiring.svc.put("sessions", "s", encode_claim(resumed))  # nc's claim arrives
        expected = ["m1", "m2"] if asker == "resumed" else []
        to_nc = wiring.svc.senders.get("nc")
        assert [f.message.msg_id for f in (to_nc.resend() if to_nc else [])] == expected
        assert owner.received == ([] if asker == "resumed" else ["m2"])
    finally:
        await owner.svc.async_stop()
        await wiring.async_stop()
        node.store.close()


async def test_forwards_naming_sessions_that_moved_earlier_still_follow_the_last_claim_when_acked_in_the_hold(
        tmp_path: Path) -> None:
    """Chaos seed 60099 (pub3#26-28 reordered for sub1), 1db1643's race in its three-session shape. nb owned q, p
    and s (sub2, sub0, sub1); it read m1-m3 (each naming all three) and was cut off before acking them (its replica
    writes for them never reached its replica). nc resumed q, then p: each claim took its share of m1-m4 to nc and
    narrowed m1-m4 here to the sessions left. nc asked for s (hold); nb linked up and acked m1-m3 at once (its
    replica re-placed on a node it reached). m1-m3, read by nb before our answer, must follow s's claim ahead of the
    held m4 and m5; before 1db1643 nc got only m4, m5, and m1-m3 after them from nb."""
    node, wiring = await _node(tmp_path)
    everyone = {"t/#": SubscriptionOptions(qos=1)}
    for cid in ("q", "p"):
        wiring.svc.put("sessions", cid, encode_claim(SessionClaim("nb", 1000.0, FRESH, True, everyone, {}, {})))
    frozen, owner = FrozenOwner("nb"), Peer("nb")
    try:
        await _link(wiring, frozen)
        for msg_id in ("m1", "m2", "m3"):
            wiring.route_remote(_message(msg_id, "t/x"), [])  # read by nb, never acknowledged on that link
        await until(lambda: frozen.received == ["m1", "m2", "m3"], "m1-m3 at nb")
        await frozen.svc.async_stop()
        await until(lambda: not wiring.svc.links.is_up("nb"), "the link to nb down")
        wiring.route_remote(_message("m4", "t/x"), [])  # buffered for nb's three sessions
        for request, cid in ((7, "q"), (8, "p")):  # nc resumes q, then p: their claims arrive
            wiring._on_session_message("nc", SessionTakeover(request, cid, "nc", False))
            wiring.svc.put("sessions", cid, encode_claim(SessionClaim("nc", 2000.0, FRESH, True, everyone, {}, {})))
        held = wiring.svc.senders["nb"].resend()
        assert [(f.message.msg_id, f.clients) for f in held] == [(m, ("s",)) for m in ("m1", "m2", "m3", "m4")]
        wiring._on_session_message("nc", SessionTakeover(9, "s", "nc", False))  # answered "no session here": hold
        await _link(wiring, owner)  # nb back: a new link, our resend held
        owner.svc.send("na", ForwardAck(held[2].seq))  # nb's cumulative ack of m1-m3
        await until(lambda: len(wiring.svc.senders["nb"].resend()) == 1, "nb's ack of m1-m3")
        wiring.route_remote(_message("m5", "t/x"), [])  # for s, still nb's here: held
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nc", 3000.0, FRESH, True, everyone, {}, {})))
        to_nc = wiring.svc.senders["nc"].resend()
        assert [f.message.msg_id for f in to_nc if "s" in f.clients] == ["m1", "m2", "m3", "m4", "m5"]
        assert owner.received == []
    finally:
        await owner.svc.async_stop()
        await wiring.async_stop()
        node.store.close()
