"""kill -9 of a publisher's node (issue 4, the two residual chaos classes): a QoS2 message committed there arrives
once whether or not its packet id reached the publisher session's replica; messages acknowledged there while their
target node was unreachable arrive before the publisher's newer ones, once."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest

from appliance.cluster.membership import rendezvous
from tests.harness.netns import wait_until

from .nodes import WAIT, Cluster

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def client_replicated_on(replica: str, owner: str, others: list[str], prefix: str) -> str:
    """A client id whose session, owned by `owner`, is replicated to `replica` (rendezvous over the others)."""
    for n in range(1000):
        cid = f"{prefix}{n}"
        if rendezvous(cid, [o for o in others if o != owner], 1) == [replica]:
            return cid
    raise AssertionError("no such client id")


def run(cluster: Cluster, i: int, module: str, *args: str) -> list[dict[str, Any]]:
    """Run a tests.cluster_e2e client module against node i (from its namespace); its JSON events."""
    out = cluster.lab.exec(i, sys.executable, "-m", f"tests.cluster_e2e.{module}", cluster.lab.ip(i), *args,
                           check=False, timeout=90)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def payloads(events: list[dict[str, Any]]) -> list[str]:
    return [e["payload"] for e in events if "payload" in e]


def drained(cluster: Cluster, i: int) -> bool:
    """Node i's in-transit buffers are empty (sent and acknowledged, or dropped as redundant)."""
    members = cluster.status(i).get("members", [])
    return bool(members) and all(m["in_transit"] == 0 for m in members)


def test_qos2_message_committed_before_its_packet_id_reached_the_replica_arrives_once(netns_lab) -> None:
    """A holds the publisher's session (replica B) and C the subscriber's. With A-B cut, a QoS2 PUBLISH is committed
    on A (forward to C durable) but its packet id cannot reach B; A is SIGKILLed before it notices B is gone. The
    publisher resumes on B, whose copy lacks the id, and its DUP resend is routed as new. Before: A's forward left at
    once (or when A restarted) and the subscriber got the message twice. Now nothing the message caused leaves A
    before the publisher's replica holds its packet id, and the restarted A drops it (the session moved)."""
    cluster = Cluster(netns_lab(3), 3, heartbeat_interval=0.5, failure_timeout=6.0)  # A is killed before it times
    cluster.start()  # out its link to B
    cluster.wait_formed()
    names = [cluster.name(i) for i in range(3)]
    pub = client_replicated_on("nb", "na", names, "pq")
    assert run(cluster, 2, "step_client", "sq", "q2/#", "--count", "0")[1] == {"suback": [2]}
    wait_until(lambda: cluster.owner(0, "sq") == "nc", WAIT, "subscription known on A")
    first = run(cluster, 0, "pub_client", pub, "q2/x", "1:p0")
    assert {"ack": "pubcomp", "pid": 1, "rc": 0} in first
    go = cluster.lab.workdir / "publish-p1"
    publisher = cluster.lab.spawn(0, [sys.executable, "-m", "tests.cluster_e2e.pub_client", cluster.lab.ip(0), pub,
                                      "q2/x", "2:p1", "--no-wait", "--after", str(go)], name="pq-")
    wait_until(lambda: '"connack": 0' in publisher.output(), WAIT, "publisher connected to A")
    cluster.lab.partition(0, 1)
    go.touch()  # p1 is committed on A, unacknowledged: its packet id cannot reach B
    wait_until(lambda: '"sent"' in publisher.output(), WAIT, "p1 sent")
    time.sleep(0.5)  # A's fsync is done; its link to B has not timed out
    cluster.kill(0)
    wait_until(lambda: cluster.running_peers(1) == {"nc"}, WAIT, "B sees A down")
    resent = run(cluster, 1, "pub_client", pub, "q2/x", "2:p1", "--dup")  # the publisher's resend, on B
    assert resent[0] == {"connack": 0, "present": True}
    assert {"ack": "pubcomp", "pid": 2, "rc": 0} in resent
    cluster.lab.heal_all()
    cluster.start(0)
    cluster.wait_formed()
    wait_until(lambda: drained(cluster, 0), WAIT, "A's durable forwards sent or dropped")
    assert {"ack": "pubcomp", "pid": 3, "rc": 0} in run(cluster, 1, "pub_client", pub, "q2/x", "3:end")
    got = payloads(run(cluster, 2, "step_client", "sq", "q2/#", "--quiet", "3"))
    assert got == ["p0", "p1", "end"]  # p1 exactly once
    assert cluster.crashes() == []


def test_messages_acked_for_an_unreachable_target_reach_it_before_newer_ones_when_their_node_dies(netns_lab) -> None:
    """A holds the publisher's session (replica B); C, owner of the subscriber's session, is cut from A. A
    acknowledges s1 s2 with C unreachable (durable in-transit buffer), then A is SIGKILLed and the publisher moves
    to B and publishes s3. Before: s1 s2 arrived after s3, once A came back. Now the publisher's replica held them
    too: the session resumed on B passes them on first, and the restarted A drops its own copies."""
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    names = [cluster.name(i) for i in range(3)]
    pub = client_replicated_on("nb", "na", names, "ps")
    assert run(cluster, 2, "step_client", "ss", "st/#", "--qos", "1", "--count", "0")[1] == {"suback": [1]}
    wait_until(lambda: cluster.owner(0, "ss") == "nc", WAIT, "subscription known on A")
    assert {"ack": "puback", "pid": 1, "rc": 0} in run(cluster, 0, "pub_client", pub, "st/x", "1:s0", "--qos", "1")
    cluster.lab.partition(0, 2)
    wait_until(lambda: cluster.running_peers(0) == {"nb"}, WAIT, "A cut from C")
    acked = run(cluster, 0, "pub_client", pub, "st/x", "2:s1", "3:s2", "--qos", "1")
    assert [e["pid"] for e in acked if e.get("ack") == "puback"] == [2, 3]
    cluster.kill(0)
    wait_until(lambda: cluster.running_peers(1) == {"nc"}, WAIT, "B sees A down")
    assert {"ack": "puback", "pid": 4, "rc": 0} in run(cluster, 1, "pub_client", pub, "st/x", "4:s3", "--qos", "1")
    got = payloads(run(cluster, 2, "step_client", "ss", "st/#", "--qos", "1", "--count", "4"))
    assert got == ["s0", "s1", "s2", "s3"]
    cluster.lab.heal_all()
    cluster.start(0)
    cluster.wait_formed()
    wait_until(lambda: drained(cluster, 0), WAIT, "A's durable forwards sent or dropped")
    assert {"ack": "puback", "pid": 5, "rc": 0} in run(cluster, 1, "pub_client", pub, "st/x", "5:end", "--qos", "1")
    assert payloads(run(cluster, 2, "step_client", "ss", "st/#", "--qos", "1", "--quiet", "3")) == ["end"]
    assert cluster.crashes() == []


def test_qos2_message_whose_id_reached_the_replica_is_delivered_by_the_resumed_session(netns_lab) -> None:
    """A holds the publisher's session (replica B), C the subscriber's; A-C cut. A QoS2 PUBLISH is committed on A and
    its packet id reaches B, but the forward to C cannot leave; A is SIGKILLed. The publisher resumes on B, whose
    copy knows the id, so the DUP resend is acknowledged without routing. Before: the message waited on A's disk
    until A came back (lost if it never does). Now the copy holds the message too: B routes it when the session
    resumes, and the restarted A drops its own forward."""
    cluster = Cluster(netns_lab(3), 3, heartbeat_interval=0.5, failure_timeout=6.0)
    cluster.start()
    cluster.wait_formed()
    names = [cluster.name(i) for i in range(3)]
    pub = client_replicated_on("nb", "na", names, "pr")
    assert run(cluster, 2, "step_client", "sr", "q3/#", "--count", "0")[1] == {"suback": [2]}
    wait_until(lambda: cluster.owner(0, "sr") == "nc", WAIT, "subscription known on A")
    assert {"ack": "pubcomp", "pid": 1, "rc": 0} in run(cluster, 0, "pub_client", pub, "q3/x", "1:r0")
    go = cluster.lab.workdir / "publish-r1"
    publisher = cluster.lab.spawn(0, [sys.executable, "-m", "tests.cluster_e2e.pub_client", cluster.lab.ip(0), pub,
                                      "q3/x", "2:r1", "--no-wait", "--after", str(go)], name="pr-")
    wait_until(lambda: '"connack": 0' in publisher.output(), WAIT, "publisher connected to A")
    cluster.lab.partition(0, 2)
    go.touch()
    wait_until(lambda: '"sent"' in publisher.output(), WAIT, "r1 sent")
    time.sleep(0.5)  # A's fsync is done and B acknowledged the id; A has not noticed C is gone
    cluster.kill(0)
    wait_until(lambda: cluster.running_peers(1) == {"nc"}, WAIT, "B sees A down")
    wait_until(lambda: cluster.running_peers(2) == {"nb"}, WAIT, "C sees A down")
    resent = run(cluster, 1, "pub_client", pub, "q3/x", "2:r1", "--dup")
    assert resent[0] == {"connack": 0, "present": True}
    assert {"ack": "pubcomp", "pid": 2, "rc": 0} in resent
    assert payloads(run(cluster, 2, "step_client", "sr", "q3/#", "--count", "2", "--quiet", "5")) == ["r0", "r1"]
    cluster.lab.heal_all()
    cluster.start(0)
    cluster.wait_formed()
    wait_until(lambda: drained(cluster, 0), WAIT, "A's durable forwards sent or dropped")
    assert {"ack": "pubcomp", "pid": 3, "rc": 0} in run(cluster, 1, "pub_client", pub, "q3/x", "3:end")
    assert payloads(run(cluster, 2, "step_client", "sr", "q3/#", "--quiet", "3")) == ["end"]
    assert cluster.crashes() == []
