"""The queue checker on hand-made histories with known answers."""

from __future__ import annotations

from typing import Any

from tests.chaos.checker import check, late_deliveries
from tests.chaos.history import Event


class H:
    """Builds a history the way the clients write it."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, e: str, **f: Any) -> H:
        self.events.append({"e": e, **f})
        return self

    def sub(self, c: str, qos: int = 2) -> H:
        self.add("conn", c=c, node=0, sp=False)
        return self.add("sub", c=c, qos=qos)

    def send(self, pub: str, seq: int, qos: int = 1, acked: bool = True, rc: int = 0) -> H:
        self.add("send", c=pub, seq=seq, qos=qos, node=0, dup=False)
        if acked:
            self.add("ack", c=pub, seq=seq, qos=qos, rc=rc, stage="puback" if qos == 1 else "pubrec")
        return self

    def recv(self, sub: str, pub: str, seq: int, qos: int = 1, dup: bool = False, app: bool = True,
             intact: bool = True) -> H:
        return self.add("recv", c=sub, pub=pub, seq=seq, qos=qos, dup=dup, app=app, node=0, pid=seq, intact=intact)


def test_seed_sequence_a_d_e_b_c_is_two_reordered() -> None:
    h = H().sub("s")
    for seq in range(1, 6):
        h.send("p", seq)
    for seq in (1, 4, 5, 2, 3):  # A D E B C
        h.recv("s", "p", seq)
    r = check(h.events)
    assert r.counts["reordered"] == 2
    assert r.counts["ok"] == 5 and r.counts["lost"] == 0
    assert not r.valid
    assert late_deliveries([1, 4, 5, 2, 3]) == [2, 3]


def test_in_order_with_redelivery_is_ok_and_only_counts_qos1_duplicate() -> None:
    h = H().sub("s", qos=1)
    for seq in (1, 2, 3):
        h.send("p", seq, qos=2)
    # 1 2 then a reconnect redelivers 2 (DUP) before 3: dedupe keeps the order intact; QoS is min(2, 1) = 1
    for seq, dup in ((1, False), (2, False), (2, True), (3, False)):
        h.recv("s", "p", seq, dup=dup)
    r = check(h.events)
    assert r.counts["reordered"] == 0
    assert r.counts["dup_qos1"] == 1 and r.counts["dup_qos2"] == 0
    assert r.counts["ok"] == 2
    assert r.valid


def test_qos2_duplicate_is_an_error_but_a_qos2_retransmission_is_not() -> None:
    h = H().sub("s", qos=2)
    h.send("p", 1, qos=2).send("p", 2, qos=2)
    h.recv("s", "p", 1, qos=2).recv("s", "p", 1, qos=2, dup=True, app=False)  # retransmit before PUBREL
    h.recv("s", "p", 2, qos=2).recv("s", "p", 2, qos=2, dup=True)  # delivered to the application twice
    r = check(h.events)
    assert r.counts["dup_qos2"] == 1 and r.counts["ok"] == 1
    assert not r.valid


def test_lost_counts_only_acknowledged_messages_per_subscriber() -> None:
    h = H().sub("s1").sub("s2")
    h.send("p", 1).send("p", 2).send("p", 3, acked=False).send("p", 4, acked=False)
    h.recv("s1", "p", 1).recv("s1", "p", 2).recv("s2", "p", 1)  # s2 misses 2
    h.recv("s1", "p", 4)  # delivered though never acked: recovered
    r = check(h.events)
    assert r.counts["lost"] == 1 and "p#2" in r.examples["lost"][0] and "s2" in r.examples["lost"][0]
    assert r.counts["acked"] == 2 and r.counts["pairs"] == 4 and r.counts["ok"] == 3
    assert r.counts["recovered"] == 1 and r.counts["unacked"] == 1


def test_unexpected_never_sent_corrupt_or_refused() -> None:
    h = H().sub("s")
    h.send("p", 1).send("p", 2, rc=0x97)  # 2 refused (quota exceeded)
    h.recv("s", "p", 1).recv("s", "ghost", 7).recv("s", "p", 2).recv("s", "p", 1, intact=False)
    r = check(h.events)
    assert r.counts["unexpected"] == 3
    assert r.counts["refused"] == 1 and r.counts["acked"] == 1 and r.counts["ok"] == 1


def test_reordering_is_per_publisher_stream() -> None:
    h = H().sub("s")
    for seq in (1, 2):
        h.send("a", seq).send("b", seq)
    # interleaving publishers is fine; within each publisher the order holds
    h.recv("s", "b", 1).recv("s", "a", 1).recv("s", "a", 2).recv("s", "b", 2)
    assert check(h.events).counts["reordered"] == 0


def test_session_loss_is_reported() -> None:
    h = H().sub("s").add("conn", c="s", node=0, sp=True).add("conn", c="s", node=1, sp=False)
    assert check(h.events).counts["session_lost"] == 1


def test_pubcomp_error_after_pubrec_keeps_the_message_acknowledged() -> None:
    h = H().sub("s")
    h.send("p", 1, qos=2).add("ack", c="p", seq=1, qos=2, rc=0x92, stage="pubcomp")  # session lost after PUBREC
    r = check(h.events)
    assert r.counts["acked"] == 1 and r.counts["refused"] == 0 and r.counts["lost"] == 1
