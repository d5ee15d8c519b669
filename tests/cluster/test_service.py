"""ClusterService on loopback (static seeds, no mDNS): replication, anti-entropy after a restart, acked forwarding."""

from __future__ import annotations

import asyncio
import time

import pytest

from appliance.broker.model import Message
from appliance.cluster import dvv
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.service import ClusterCallbacks, ClusterConfig, ClusterService, render_status
from appliance.cluster.wire import Forward

WAIT = 15.0


class Node:
    """A ClusterService plus what a broker would persist: clocks, durable queue, in-transit buffer."""

    def __init__(self, node_id: str, spaces=None, committed_upto: int = 0, commit: bool = True) -> None:
        self.node_id = node_id
        self.replicated: list[tuple[str, str, dvv.DVVSet | None]] = []
        self.durable: list[str] = []  # msg ids enqueued durably from forwards
        self.committed_upto = committed_upto
        self.released: list[int] = []
        self.members: list[tuple[str, bool]] = []
        self.commit = commit
        cfg = ClusterConfig(node_id=node_id, cluster="lab", secret=b"k", host="127.0.0.1", port=0, mdns=False,
                            heartbeat_interval=0.1, failure_timeout=0.6, anti_entropy_interval=0.5, gc_interval=0.5)
        cb = ClusterCallbacks(on_replicated=lambda s, k, c: self.replicated.append((s, k, c)),
                              on_forward=self._forward, on_forward_released=self._released,
                              on_member=lambda p, up: self.members.append((p, up)))
        restored = {"a": committed_upto} if committed_upto else None
        self.svc = ClusterService(cfg, cb, spaces=spaces, committed_upto=restored)

    def _forward(self, peer: str, fwd: Forward) -> None:
        if not self.commit:
            return  # "crashes" before its durable enqueue completes
        self.durable.append(fwd.message.msg_id)
        self.committed_upto = fwd.seq
        self.svc.forward_committed(peer, fwd.seq)

    def _released(self, peer: str, fwds: list[Forward]) -> None:
        self.released += [f.seq for f in fwds]

    def clocks(self, space: str = "subs") -> dict[str, dvv.DVVSet]:
        return self.svc.spaces[space].clocks()


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def connect(*nodes: Node) -> None:
    for n in nodes:
        await n.svc.async_start()
    for n in nodes:
        for m in nodes:
            if m is not n:
                n.svc.async_add_seed("127.0.0.1", m.svc.port)
    for n in nodes:
        await until(lambda n=n: len(n.svc.links.up_peers()) == len(nodes) - 1, f"{n.node_id} linked to all")


def msg(i: int) -> Message:
    return Message(f"m{i}", "t", b"x", 1, False, "p", 0.0)


async def test_writes_replicate_and_a_restarted_node_converges_by_anti_entropy() -> None:
    a, b, c = Node("a"), Node("b"), Node("c")
    await connect(a, b, c)
    try:
        a.svc.put("subs", "client-1", b"opts-1")
        await until(lambda: b.clocks() == c.clocks() == a.clocks(), "live replication")
        assert dvv.resolve(b.clocks()["client-1"]) == b"opts-1"
        assert ("subs", "client-1", a.clocks()["client-1"]) in b.replicated

        # b goes away; while it is gone, a and c write, and b (offline) has a write of its own.
        b_spaces = b.svc.spaces
        await b.svc.async_stop()
        await until(lambda: "b" not in a.svc.links.up_peers(), "b seen down")
        a.svc.put("subs", "client-2", b"from-a")
        c.svc.delete("subs", "client-1")
        b_spaces["subs"].put("client-2", b"from-b")  # concurrent with a's write
        await until(lambda: a.clocks() == c.clocks(), "a and c converge")
        assert [r["state"] for r in a.svc.status()] == ["self", "unreachable", "running"]

        b2 = Node("b", spaces=b_spaces)
        await b2.svc.async_start()
        b2.svc.async_add_seed("127.0.0.1", a.svc.port)
        b2.svc.async_add_seed("127.0.0.1", c.svc.port)
        try:
            await until(lambda: a.clocks() == b2.clocks() == c.clocks(), "all three converge after the restart")
            final = a.clocks()
            assert sorted(dvv.values(final["client-2"])) == [b"from-a", b"from-b"]  # concurrent: both kept
            assert dvv.is_deleted(final["client-1"])
            # GC: every member has seen the delete -> the tombstone goes everywhere
            await until(lambda: all("client-1" not in n.clocks() for n in (a, b2, c)), "tombstone collected")
            assert ("subs", "client-1", None) in a.replicated
        finally:
            await b2.svc.async_stop()
    finally:
        await a.svc.async_stop()
        await c.svc.async_stop()


async def test_forwarded_messages_are_acked_after_commit_and_resent_after_a_crash() -> None:
    a, b = Node("a"), Node("b", commit=False)
    await connect(a, b)
    acked: list[int] = []
    try:
        for i in range(3):
            a.svc.forward("b", msg(i), on_acked=lambda seq, st: acked.append(seq))
        await asyncio.sleep(0.3)
        assert acked == [] and a.svc.senders["b"].in_transit == 3  # no ack before the receiver's commit
        await b.svc.async_stop()  # b "crashes" holding uncommitted messages
        a.svc.forward("b", msg(3), on_acked=lambda seq, st: acked.append(seq))  # buffered while b is down
        b2 = Node("b", committed_upto=0)
        await b2.svc.async_start()
        b2.svc.async_add_seed("127.0.0.1", a.svc.port)
        try:
            await until(lambda: acked == [1, 2, 3, 4], "every message acked after the resend")
            assert b2.durable == ["m0", "m1", "m2", "m3"]
            assert a.released == [1, 2, 3, 4] and a.svc.senders["b"].in_transit == 0
            row = next(r for r in a.svc.status() if r["node"] == "b")
            assert row["state"] == "running" and row["in_transit"] == 0
            table = render_status(a.svc.status()).splitlines()
            assert table[0].split() == ["node", "state", "address", "rtt_ms", "last_seen_s", "in_transit", "lag_s"]
            assert table[1].split()[:2] == ["a", "self"] and table[2].split()[:2] == ["b", "running"]
        finally:
            await b2.svc.async_stop()
    finally:
        await a.svc.async_stop()


async def test_a_forward_written_during_the_up_report_follows_the_resend() -> None:
    """What the up callback writes to the peer's stream goes out after the resend of what it has not acknowledged
    (chaos seed 110340: sent first, the peer took its seq for a released gap and dropped the resend)."""
    a, b = Node("a"), Node("b", commit=False)
    await connect(a, b)
    try:
        a.svc.forward("b", msg(0))
        await until(lambda: a.svc.senders["b"].in_transit == 1, "m0 sent")
        await b.svc.async_stop()  # gone before committing m0
        await until(lambda: ("b", False) in a.members, "b down at a")

        def member(peer: str, up: bool) -> None:
            if up:
                a.svc.forward(peer, msg(1))

        a.svc.cb.on_member = member
        b2 = Node("b")
        await b2.svc.async_start()
        b2.svc.async_add_seed("127.0.0.1", a.svc.port)
        try:
            await until(lambda: a.svc.senders["b"].in_transit == 0, "both acknowledged")
            assert b2.durable == ["m0", "m1"]  # before the fix: ["m1"], m0 dropped as a duplicate
        finally:
            await b2.svc.async_stop()
    finally:
        await a.svc.async_stop()


async def test_restored_spaces_keep_their_counter() -> None:
    restored = ReplicatedSpace("subs", "a", counter=41)
    a = Node("a", spaces={"subs": restored})
    assert a.svc.put("subs", "k", b"v").entries[0].counter == 42


async def test_replication_stream_acks_commits_and_refusals() -> None:
    a, b = Node("a"), Node("b")
    got: list[tuple[int, bytes]] = []

    def on_replicate(peer: str, rep) -> None:
        got.append((rep.seq, rep.data))
        b.svc.replicate_committed(peer, rep.seq, 0x97 if rep.data == b"full" else 0)

    b.svc.cb.on_replicate = on_replicate
    released: list[int] = []
    a.svc.cb.on_replicate_released = lambda peer, reps: released.extend(r.seq for r in reps)
    await connect(a, b)
    results: list[tuple[int, int]] = []
    try:
        for data in (b"e1", b"full", b"e3"):
            a.svc.replicate("b", "client-1", 1, data, on_acked=lambda seq, st: results.append((seq, st)))
        await until(lambda: len(results) == 3, "three replication acks")
        assert results == [(1, 0), (2, 0x97), (3, 0)]
        assert got == [(1, b"e1"), (2, b"full"), (3, b"e3")] and released == [1, 2, 3]
    finally:
        await a.svc.async_stop()
        await b.svc.async_stop()
