"""Acknowledged forwarding streams: exactly-once-in-order across link drops and restarts; the PUBACK gate."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.broker.model import Message
from appliance.cluster import wire
from appliance.cluster.forwarding import AckGate, ForwardReceiver, ForwardSender, ReplicaReceiver, ReplicaSender


def msg(i: int) -> Message:
    return Message(f"m{i}", "t", str(i).encode(), 1, False, "pub", 0.0)


def test_in_order_delivery_and_cumulative_release() -> None:
    s, r = ForwardSender("b"), ForwardReceiver("a")
    acked: list[tuple[int, int]] = []
    fwds = [s.submit(msg(i), on_acked=lambda seq, st: acked.append((seq, st))) for i in range(5)]
    assert [f.seq for f in fwds] == [1, 2, 3, 4, 5]
    assert all(r.accept(f) for f in fwds)
    assert r.committed(2) is None  # 1 not committed yet: no ack for 2
    ack = r.committed(1)
    assert ack == wire.ForwardAck(2)
    released = s.on_ack(ack)
    assert [f.seq for f in released] == [1, 2] and acked == [(1, 0), (2, 0)]
    assert s.in_transit == 3 and [f.seq for f in s.resend()] == [3, 4, 5]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.lists(st.integers(0, 40), max_size=6), st.randoms(use_true_random=False))
def test_link_drops_and_receiver_crashes_never_lose_or_duplicate(n: int, cuts: list[int], rnd: random.Random) -> None:
    """Random link cuts (in-flight frames lost) and receiver restarts from its durable state: each message
    is durably enqueued exactly once, in order, and the sender's buffer drains."""
    sender = ForwardSender("b")
    durable: list[str] = []  # receiver's durable queue (what survives its crash)
    committed_upto = 0
    receiver = ForwardReceiver("a", committed_upto=committed_upto)
    pending_commit: list[tuple[int, str]] = []  # accepted, durable enqueue still running
    wire_to_b = [sender.submit(msg(i)) for i in range(n)]
    cuts = sorted(set(cuts))

    def commit_some(p: float, ack_ok: bool) -> None:
        nonlocal committed_upto
        while pending_commit and rnd.random() < p:
            seq, mid = pending_commit.pop(0)
            durable.append(mid)
            committed_upto = seq
            ack = receiver.committed(seq)
            if ack is not None and ack_ok:
                sender.on_ack(ack)

    for _ in range(60):
        if not sender.in_transit:
            break
        cut_at = cuts.pop(0) if cuts else None
        quiet = cut_at is None and not cuts
        for k, fwd in enumerate(wire_to_b):
            if cut_at is not None and k >= cut_at:
                break  # the link died: the rest of the frames are lost
            if receiver.accept(fwd):
                pending_commit.append((fwd.seq, fwd.message.msg_id))
            else:
                dup = receiver.duplicate_ack()
                if dup is not None:
                    sender.on_ack(dup)
            commit_some(0.6, ack_ok=cut_at is None or rnd.random() < 0.8)
        if not quiet and rnd.random() < 0.3:  # receiver crash: commits in flight are lost, durable state survives
            pending_commit.clear()
            receiver = ForwardReceiver("a", committed_upto=committed_upto)
        else:
            # commits carry on across the link loss; only some finish before the sender reconnects and resends
            commit_some(1.0 if quiet else 0.5, ack_ok=quiet)
        wire_to_b = sender.resend()  # reconnect: resend everything unacknowledged
    assert sender.in_transit == 0
    assert durable == [f"m{i}" for i in range(n)]


def test_sender_restart_resumes_sequence_from_durable_buffer() -> None:
    s = ForwardSender("b")
    kept = [s.submit(msg(i)) for i in range(3)]
    s.on_ack(wire.ForwardAck(1))
    restarted = ForwardSender("b", next_seq=4, in_transit=kept[1:])
    assert [f.seq for f in restarted.resend()] == [2, 3]
    assert restarted.submit(msg(9)).seq == 4


def test_retarget_moves_messages_out_of_the_stream() -> None:
    s = ForwardSender("b")
    def waiter(seq: int, status: int) -> None:
        raise AssertionError("a retargeted message is not acked on this stream")

    f1 = s.submit(msg(1), ("c1",), on_acked=waiter)
    s.submit(msg(2))
    [(fwd, waiters)] = s.retarget([f1.seq])
    assert fwd == f1 and waiters == [waiter]
    assert [f.seq for f in s.resend()] == [2]
    s.on_ack(wire.ForwardAck(2))  # the retargeted message's waiter is not called by this stream any more


def test_narrow_keeps_a_forward_in_place_for_the_clients_that_did_not_move() -> None:
    """Chaos finding: a forward naming two clients of one node was retargeted whole when one of them moved, so the
    other client's copy took a detour and arrived after newer messages."""
    s = ForwardSender("b")
    acked: list[int] = []
    f1 = s.submit(msg(1), ("stays", "moves"), on_acked=lambda seq, _st: acked.append(seq))
    f2 = s.submit(msg(2), ("stays",))
    narrowed = s.narrow(f1.seq, "moves")
    assert narrowed == wire.Forward(f1.seq, msg(1), ("stays",))
    assert s.resend() == [narrowed, f2]  # same place in the stream, the moved client no longer named
    s.on_ack(wire.ForwardAck(f1.seq))
    assert acked == [f1.seq]  # its publisher's ack still waits for this stream
    assert s.narrow(f1.seq, "stays") is None  # released: nothing left to narrow


def test_ack_gate_waits_for_local_commit_and_every_target() -> None:
    results: list[bool] = []
    gate = AckGate(["b", "c"], results.append)
    gate.peer_acked("b")
    gate.local_committed()
    assert results == []
    gate.peer_acked("c")
    assert results == [True]
    gate.peer_acked("c")
    assert results == [True]  # fires once


def test_ack_gate_netsplit_policy() -> None:
    accepted: list[bool] = []
    g1 = AckGate(["b"], accepted.append)
    g1.local_committed()
    g1.peer_unreachable("b", accept=True)
    assert accepted == [True]
    refused: list[bool] = []
    g2 = AckGate(["b", "c"], refused.append)
    g2.peer_unreachable("b", accept=False)
    assert refused == [False]
    local_only: list[bool] = []
    AckGate([], local_only.append, local=False)
    assert local_only == [True]


def test_replica_stream_reports_refusals_per_operation() -> None:
    s, r = ReplicaSender("b"), ReplicaReceiver("a")
    results: list[tuple[int, int]] = []
    ops = [s.submit("c1", 1, bytes([i]), on_acked=lambda seq, st: results.append((seq, st))) for i in range(4)]
    assert all(r.accept(op) for op in ops)
    assert r.committed(2, 0x97) == []  # 1 still pending: nothing due yet
    acks = r.committed(1)
    assert acks == [wire.ReplAck(2, 0x97)]
    for ack in acks:
        s.on_ack(ack)
    assert results == [(1, 0), (2, 0x97)]
    assert r.committed(4) == []
    acks = r.committed(3, 0x80)
    assert acks == [wire.ReplAck(3, 0x80), wire.ReplAck(4, 0)]
    for ack in acks:
        s.on_ack(ack)
    assert results[2:] == [(3, 0x80), (4, 0)]
    assert s.in_transit == 0
    assert not r.accept(ops[0]) and r.duplicate_ack() == wire.ReplAck(4)
    assert r.committed(4) == []  # committing twice is harmless
