"""Shared subscriptions in a cluster: one member per message across every node's members [MQTT-4.8.2]."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from appliance.broker.model import Message, SessionRecord
from appliance.protocol.packets import Puback, Publish, Subscribe, SubscriptionRequest
from tests.unit.broker.test_restore import Node, payloads


class TwoRemoteMembers:
    """The broker's ClusterPort as another node would present it: group `g` on `t` has members r1 (reachable)
    and r2 (node down); records every forward the broker asks for."""

    def __init__(self, members: dict[str, bool]) -> None:
        self.members = members
        self.forwarded: list[tuple[bytes, list[str]]] = []

    def publish_refusal(self, message: Message) -> int | None:
        return None

    def remote_shared(self, topic: str) -> list[tuple[str, str, dict[str, bool]]]:
        return [("g", "t", dict(self.members))] if topic == "t" and self.members else []

    def qos2_received(self, message: Message) -> None:
        pass

    def route_remote(self, message: Message, shared: list[str]) -> int:
        self.forwarded.append((message.payload, list(shared)))
        return len(shared)

    def subscribe_refusal(self) -> int | None:
        return None

    def unsubscribe_refusal(self) -> int | None:
        return None

    def session_changed(self, record: SessionRecord, connected: bool = False) -> None:
        pass

    def session_removed(self, client_id: str) -> None:
        pass


async def _node(tmp_path: Path, members: dict[str, bool]) -> tuple[Node, TwoRemoteMembers]:
    node = Node(tmp_path / "b.db", lambda: 1_800_000_000.0)
    cluster = TwoRemoteMembers(members)
    node.broker.cluster = cluster
    return node, cluster


async def _publish(node: Node, count: int) -> None:
    pub, pub_link = await node.connect("pub", expiry=0)
    for n in range(count):
        node.broker.handle(pub, pub_link, Publish("t", f"m{n}".encode(), 1, packet_id=n + 1))
    await node.settle()
    acks = [p for p in pub_link.take() if isinstance(p, Puback)]
    assert [a.packet_id for a in acks] == list(range(1, count + 1))


async def test_each_message_goes_to_exactly_one_member_here_or_on_a_reachable_node(tmp_path: Path) -> None:
    node, cluster = await _node(tmp_path, {"r1": True, "r2": False})
    local, local_link = await node.connect("a")
    node.broker.handle(local, local_link, Subscribe(1, [SubscriptionRequest("$share/g/t", 1)]))
    await node.settle()
    local_link.take()
    await _publish(node, 8)
    here = payloads(local_link.take())
    remote = {payload: chosen for payload, chosen in cluster.forwarded}
    assert len(remote) == 8  # the broker asked the cluster once per message
    for payload, chosen in remote.items():
        assert len(chosen) + (payload in here) == 1, (payload, chosen, here)  # exactly one member per message
    picks = Counter(c for chosen in remote.values() for c in chosen)
    assert picks == {"r1": 4} and len(here) == 4  # round robin over the online members; r2's node is down
    await node.die()


async def test_group_with_members_only_on_other_nodes_is_still_served(tmp_path: Path) -> None:
    node, cluster = await _node(tmp_path, {"r1": True, "r2": True})
    await _publish(node, 4)
    assert [chosen for _payload, chosen in cluster.forwarded] == [["r1"], ["r2"], ["r1"], ["r2"]]
    await node.die()


async def test_offline_persistent_member_here_beats_a_member_on_a_down_node(tmp_path: Path) -> None:
    node, cluster = await _node(tmp_path, {"r2": False})
    local, local_link = await node.connect("a", clean=False)
    node.broker.handle(local, local_link, Subscribe(1, [SubscriptionRequest("$share/g/t", 1)]))
    await node.settle()
    node.broker.connection_lost(local, local_link)
    await _publish(node, 2)
    assert [chosen for _payload, chosen in cluster.forwarded] == [[], []]
    assert len(node.broker.sessions["a"].queue) == 2  # queued here for the persistent member
    await node.die()


async def test_only_members_on_down_nodes_still_get_it_buffered_for_one_of_them(tmp_path: Path) -> None:
    node, cluster = await _node(tmp_path, {"r2": False, "r3": False})
    await _publish(node, 2)
    assert [chosen for _payload, chosen in cluster.forwarded] == [["r2"], ["r2"]]
    await node.die()
