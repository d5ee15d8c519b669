"""Routing of one application message to every matching session: aggregation, no-local, shared groups, retained."""

from __future__ import annotations

from collections.abc import Callable

from appliance.protocol.topics import topic_matches

from .metrics import Metrics
from .model import Delivery, Message, SubscriptionOptions
from .ports import EventSink, Store
from .session import Session
from .settings import BrokerSettings
from .topictree import TopicTree, split_shared

# Shared groups of other nodes that match a topic: (group, filter, {client id: its node is reachable}).
RemoteShared = list[tuple[str, str, dict[str, bool]]] | tuple[()]


class Router:
    """Owns the subscription tree and the retained set; delivers messages into sessions."""

    def __init__(
        self,
        settings: BrokerSettings,
        sessions: dict[str, Session],
        store: Store,
        events: EventSink | None,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.tree = TopicTree()
        self.retained: dict[str, Message] = {}
        self._share_cursor: dict[tuple[str, str], int] = {}

    # -- retained ------------------------------------------------------------------------------------------------
    def retain(self, message: Message) -> bool:
        """Store or clear (empty payload [MQTT-3.3.1-10]) the retained message of a topic; True if persisted."""
        if message.payload:
            self.retained[message.topic] = message
            self.store.save_retained(message)
        elif self.retained.pop(message.topic, None) is not None:
            self.store.delete_retained(message.topic)
        else:
            return False
        return True

    def retained_for(self, topic_filter: str) -> list[Message]:
        """Retained messages whose topic matches a filter, oldest first; expired ones are purged."""
        now = self.clock()
        found = []
        for topic, message in list(self.retained.items()):
            if message.expiry_at is not None and message.expiry_at <= now:
                del self.retained[topic]  # [MQTT-3.3.2-5]
                self.store.delete_retained(topic)
                continue
            if topic_matches(topic_filter, topic):
                found.append(message)
        found.sort(key=lambda m: m.created)
        return found

    # -- publish fan-out -----------------------------------------------------------------------------------------
    def route(self, message: Message, remote_shared: RemoteShared = ()) -> tuple[int, bool, list[str]]:
        """Deliver to every matching session; returns (sessions reached here, whether anything was persisted, the
        members of other nodes that shared groups chose: the cluster forwards to those)."""
        match = self.tree.match(message.topic)
        subscribers = match.subscribers
        if not match.shared and not remote_shared:
            if not subscribers:
                return 0, False, []
            if len(subscribers) == 1:  # one matching subscription: nothing to aggregate
                client_id, topic_filter, options = subscribers[0]
                session = self.sessions.get(client_id)
                if session is None or (options.no_local and client_id == message.publisher):  # [MQTT-3.8.3-3]
                    return 0, False, []
                sub_ids = [options.subscription_id] if options.subscription_id else []
                retain = message.retain and options.retain_as_published  # [MQTT-3.3.1-12,13]
                return 1, self.deliver(session, message, min(message.qos, options.qos), retain, sub_ids,
                                       topic_filter), []
        targets: dict[str, tuple[int, bool, list[int], str]] = {}
        publisher = message.publisher
        for client_id, topic_filter, options in match.subscribers:
            if options.no_local and client_id == publisher:  # [MQTT-3.8.3-3]
                continue
            self._aggregate(targets, client_id, topic_filter, options, message)
        chosen_remote: list[str] = []
        remote_groups = {(g, f): members for g, f, members in remote_shared} if remote_shared else {}
        for group, topic_filter, members in match.shared:
            remote = remote_groups.pop((group, topic_filter), None) if remote_groups else None
            chosen = self._pick_member(group, topic_filter, members, remote)
            if chosen in members:
                self._aggregate(targets, chosen, f"$share/{group}/{topic_filter}", members[chosen], message)
            elif chosen is not None:
                chosen_remote.append(chosen)
        for (group, topic_filter), remote in remote_groups.items():  # groups with no member on this node
            chosen = self._pick_member(group, topic_filter, {}, remote)
            if chosen is not None:
                chosen_remote.append(chosen)
        persisted = False
        reached = 0
        for client_id, (qos, retain, sub_ids, topic_filter) in targets.items():
            session = self.sessions.get(client_id)
            if session is None:
                continue
            reached += 1
            if self.deliver(session, message, qos, retain, sub_ids, topic_filter):
                persisted = True
        return reached, persisted, chosen_remote

    @staticmethod
    def _aggregate(
        targets: dict[str, tuple[int, bool, list[int], str]],
        client_id: str,
        topic_filter: str,
        options: SubscriptionOptions,
        message: Message,
    ) -> None:
        # One copy per session: highest granted QoS and every subscription identifier [MQTT-3.3.4-3..5].
        qos = min(message.qos, options.qos)
        retain = message.retain and options.retain_as_published  # [MQTT-3.3.1-12,13]
        sub_ids = [options.subscription_id] if options.subscription_id else []
        previous = targets.get(client_id)
        if previous is not None:
            qos = max(qos, previous[0])
            retain = retain or previous[1]
            sub_ids = previous[2] + sub_ids
            topic_filter = previous[3]
        targets[client_id] = (qos, retain, sub_ids, topic_filter)

    def _pick_member(
        self,
        group: str,
        topic_filter: str,
        members: dict[str, SubscriptionOptions],
        remote: dict[str, bool] | None = None,
    ) -> str | None:
        """Round-robin over the group's online members, here and on reachable nodes; with none online, a persistent
        member here queues it, else a member on an unreachable node (its forward waits in the in-transit buffer)
        [MQTT-4.8.2]."""
        remote = remote or {}
        names = sorted(members.keys() | remote.keys())
        if not names:
            return None
        key = (group, topic_filter)
        start = self._share_cursor.get(key, 0)
        fallback = None
        for i in range(len(names)):
            name = names[(start + i) % len(names)]
            session = self.sessions.get(name) if name in members else None
            if session is not None:
                online, persistent = session.online, session.persistent
            elif name in members:
                continue
            else:
                online, persistent = remote[name], False
            if online:
                self._share_cursor[key] = (start + i + 1) % len(names)
                return name
            if fallback is None and persistent:
                fallback = name
        if fallback is None and remote:
            fallback = min(remote)
        return fallback

    def deliver(
        self, session: Session, message: Message, qos: int, retain: bool, sub_ids: list[int], topic_filter: str
    ) -> bool:
        """Hand one message to one session; returns True when it was written to the store."""
        events = self.events
        if events is not None:
            events.record_routed(message.msg_id, session.client_id, topic_filter, qos)
        if qos == 0:
            link = session.link
            if link is not None:
                if link.publish(message, 0, retain, None, False, sub_ids):
                    self.metrics.messages_out[0] += 1
                    if events is not None:
                        events.record_delivered(message.msg_id, session.client_id, 0, False, 1)
                else:
                    self.metrics.drop("packet_too_large")
                return False
            if not self.settings.queue_qos0_offline or not session.persistent:
                self.metrics.drop("qos0_offline")
                if events is not None:
                    events.emit("dropped", message=message, subscriber=session.client_id, reason="qos0_offline")
                return False
        if session.queued_count() >= self.settings.max_queued_messages:
            policy = self.settings.queue_full_policy
            if policy == "drop-oldest" and session.queue:
                dropped = session.drop_oldest()
                self.metrics.drop("queue_full_oldest")
                if events is not None and dropped is not None:
                    events.emit("dropped", message=dropped.message, subscriber=session.client_id, reason="queue_full")
            else:
                self.metrics.drop("queue_full")
                if events is not None:
                    events.emit("dropped", message=message, subscriber=session.client_id, reason="queue_full")
                return False
        delivery = Delivery(session.next_seq(), message, qos, retain, sub_ids)
        online = session.online
        session.enqueue(delivery)
        if events is not None and not online:
            events.emit("queued_offline", message=message, subscriber=session.client_id, qos=qos)
        return session.store is not None

    def queue_full_for(self, message: Message) -> bool:
        """True when the refuse policy applies and some matching session's queue is full."""
        if self.settings.queue_full_policy != "refuse":
            return False
        limit = self.settings.max_queued_messages
        match = self.tree.match(message.topic)
        for client_id, _filter, _options in match.subscribers:
            session = self.sessions.get(client_id)
            if session is not None and session.queued_count() >= limit:
                return True
        return False

    # -- subscriptions -------------------------------------------------------------------------------------------
    def subscribe(self, session: Session, topic_filter: str, options: SubscriptionOptions) -> bool:
        """Add or replace a subscription; returns True when it is new (for Retain Handling 1)."""
        session.record.subscriptions[topic_filter] = options
        if session.store is not None:
            self.store.save_subscription(session.client_id, topic_filter, options)
        return self.tree.add(session.client_id, topic_filter, options)

    def unsubscribe(self, session: Session, topic_filter: str) -> bool:
        """Remove a subscription; True when it existed."""
        existed = session.record.subscriptions.pop(topic_filter, None) is not None
        if session.store is not None and existed:
            self.store.delete_subscription(session.client_id, topic_filter)
        self.tree.remove(session.client_id, topic_filter)
        return existed

    def send_retained(self, session: Session, topic_filter: str, options: SubscriptionOptions, is_new: bool) -> bool:
        """Retained messages on subscribe per Retain Handling [MQTT-3.3.1-9, 3.8.4-4]; True if any was persisted."""
        group, inner = split_shared(topic_filter)
        if group is not None or options.retain_handling == 2 or (options.retain_handling == 1 and not is_new):
            return False
        persisted = False
        sub_ids = [options.subscription_id] if options.subscription_id else []
        for message in self.retained_for(inner):
            qos = min(message.qos, options.qos)
            if self.deliver(session, message, qos, True, sub_ids, topic_filter):
                persisted = True
        return persisted
