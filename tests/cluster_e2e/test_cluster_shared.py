"""Shared subscriptions across real nodes: each message reaches one member of the group, wherever it is connected."""

from __future__ import annotations

import pytest

from tests.harness.netns import wait_until

from .nodes import WAIT, Cluster, lines

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_a_group_with_members_on_two_nodes_gets_each_message_once_from_a_third(netns_lab) -> None:
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    members = {
        "sh-a": cluster.spawn_sub(0, "$share/workers/jobs/#", "sh-a", extra=("-V", "mqttv5")),
        "sh-b": cluster.spawn_sub(1, "$share/workers/jobs/#", "sh-b", extra=("-V", "mqttv5")),
    }
    lonely = cluster.spawn_sub(0, "$share/solo/alone/#", "solo-a", extra=("-V", "mqttv5"))
    for cid, node in (("sh-a", "na"), ("sh-b", "nb"), ("solo-a", "na")):
        wait_until(lambda cid=cid, node=node: cluster.owner(2, cid) == node, WAIT, f"{cid} known on C")
    jobs = [f"job-{n:03d}" for n in range(40)]
    cluster.pub(2, "jobs/x", jobs, qos=1, client_id="pub-jobs")
    solo = [f"solo-{n}" for n in range(10)]
    cluster.pub(1, "alone/y", solo, qos=1, client_id="pub-solo")

    def got() -> dict[str, list[str]]:
        return {cid: lines(proc) for cid, proc in members.items()}

    wait_until(lambda: sum(map(len, got().values())) >= len(jobs) and len(lines(lonely)) >= len(solo), WAIT,
               "every job delivered")
    received = got()
    everything = received["sh-a"] + received["sh-b"]
    assert sorted(everything) == jobs  # each message once, to one member of the group
    assert received["sh-a"] and received["sh-b"]  # both nodes' members share the load
    for payloads in received.values():
        assert payloads == sorted(payloads)  # per-member order follows the publisher's order
    assert lines(lonely) == solo  # a group whose only member is on another node than the publisher still gets it
    assert cluster.crashes() == []
