"""Jepsen queue-checker categories over the clients' own records, per (acknowledged message, subscriber).

ok          acknowledged and delivered exactly once to a subscriber that should get it
lost        acknowledged to the publisher (PUBACK / PUBREC with a success code) but never delivered to a persistent
            subscriber that was subscribed before it was sent
duplicated  delivered more than once; allowed at QoS1 (counted as dup_qos1), an error at QoS2 (dup_qos2); the QoS is
            the effective one, min(publish QoS, granted subscription QoS)
reordered   per (publisher, subscriber) stream, taking only each message's first delivery (redeliveries deduped),
            a delivery that arrived after one with a later sequence number: A D E B C has 2 (B and C)
unexpected  delivered but never sent (unknown publisher / sequence, a payload that does not match, or a message the
            broker refused with an error code)
Informational, not errors: recovered (delivered though the publisher never saw the ack), unacked (sent, never
acknowledged, never delivered: indeterminate), refused (the broker answered with an error reason code).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from .history import Event

COUNTS = ("acked", "pairs", "ok", "lost", "dup_qos1", "dup_qos2", "reordered", "unexpected", "recovered", "unacked",
          "refused", "sent", "deliveries", "session_lost")
ERRORS = ("lost", "dup_qos2", "reordered", "unexpected")
EXAMPLES = 5


@dataclass
class Result:
    """Counts per category and a few examples of every error."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    keys: dict[str, set[tuple[str, int, str]]] = field(default_factory=lambda: defaultdict(set))  # (pub, seq, sub)

    @property
    def valid(self) -> bool:
        """No lost, QoS2-duplicated, reordered or unexpected message."""
        return all(self.counts[k] == 0 for k in ERRORS)

    def note(self, category: str, example: str, n: int = 1) -> None:
        """Count `n` in a category and keep the example if there are few yet."""
        self.counts[category] += n
        if category in ERRORS and len(self.examples[category]) < EXAMPLES:
            self.examples[category].append(example)

    def line(self) -> str:
        """The counts as `key=value` pairs, in a fixed order."""
        return " ".join(f"{k}={self.counts[k]}" for k in COUNTS)


def late_deliveries(seqs: Iterable[int]) -> list[int]:
    """Sequence numbers that arrived after a greater one (first deliveries of one stream, in arrival order)."""
    late: list[int] = []
    highest: int | None = None
    for s in seqs:
        if highest is not None and s < highest:
            late.append(s)
        else:
            highest = s
    return late


def check(events: Iterable[Event]) -> Result:
    """Classify every acknowledged message for every subscriber from the publishers' and subscribers' records."""
    r = Result()
    sent: dict[tuple[str, int], int] = {}  # (publisher, seq) -> publish QoS
    acked: set[tuple[str, int]] = set()
    refused: set[tuple[str, int]] = set()
    granted: dict[str, int] = {}
    seen_conn: set[str] = set()
    counts: Counter[tuple[str, str, int]] = Counter()  # (subscriber, publisher, seq) -> app deliveries
    first_order: dict[tuple[str, str], list[int]] = defaultdict(list)  # (subscriber, publisher) -> first deliveries
    for ev in events:
        kind = ev["e"]
        if kind == "send":
            sent.setdefault((ev["c"], ev["seq"]), ev["qos"])
        elif kind == "ack":
            key = (ev["c"], ev["seq"])
            if ev["stage"] == "pubcomp":  # the message was owned by the broker since its PUBREC: nothing to learn
                continue
            if ev["rc"] >= 0x80:
                refused.add(key)
            else:
                acked.add(key)
        elif kind == "conn":
            if ev["c"] in seen_conn and not ev["sp"]:
                r.note("session_lost", f"{ev['c']} reconnected to node {ev['node']} without its session")
            seen_conn.add(ev["c"])
        elif kind == "sub":
            granted[ev["c"]] = ev["qos"]
        elif kind == "recv" and ev["app"]:
            r.counts["deliveries"] += 1
            key = (ev["pub"], ev["seq"])
            if key not in sent or not ev["intact"] or key in refused:
                why = "never sent" if key not in sent else ("payload mismatch" if not ev["intact"] else "refused")
                r.note("unexpected", f"{ev['c']} got {ev['pub']}#{ev['seq']} ({why})")
                continue
            n = counts[(ev["c"], *key)]
            counts[(ev["c"], *key)] = n + 1
            if n == 0:
                first_order[(ev["c"], ev["pub"])].append(ev["seq"])
    r.counts["sent"] = len(sent)
    r.counts["acked"] = len(acked)
    r.counts["refused"] = len(refused)
    delivered_any = {(p, s) for (_, p, s) in counts}
    for key, qos in sent.items():
        if key not in acked:
            r.keys["not_acked"].update((*key, sub) for sub in granted)
            if key in delivered_any:
                r.counts["recovered"] += 1
            elif key not in refused:
                r.counts["unacked"] += 1
            continue
        for sub, sub_qos in granted.items():
            r.counts["pairs"] += 1
            n = counts.get((sub, *key), 0)
            if n == 0:
                r.note("lost", f"{key[0]}#{key[1]} (QoS{qos}) never reached {sub}")
                r.keys["lost"].add((*key, sub))
            elif n > 1:
                effective = min(qos, sub_qos)
                r.note(f"dup_qos{max(effective, 1)}", f"{key[0]}#{key[1]} reached {sub} {n} times (QoS{effective})")
                r.keys["duplicated"].add((*key, sub))
            else:
                r.counts["ok"] += 1
                r.keys["ok"].add((*key, sub))
    for (sub, pub), seqs in sorted(first_order.items()):
        late = late_deliveries(seqs)
        r.keys["reordered"].update((pub, seq, sub) for seq in late)
        if late:
            r.note("reordered", f"{pub}->{sub}: late {late[:10]}", len(late))
    return r
