"""Hypothesis strategies for valid MQTT 3.1.1 / 5.0 packets, written from the spec tables (not from the codec)."""

from __future__ import annotations

from hypothesis import strategies as st

from appliance.protocol.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)

# UTF-8 strings the spec allows: no U+0000, no surrogates [MQTT-1.5.4-1,2]. Include U+FEFF [MQTT-1.5.4-3].
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
binary = st.binary(max_size=16)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
flag = st.integers(0, 1)
packet_id = st.integers(1, 0xFFFF)
level = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/+#"), min_size=1, max_size=5)
topic_name = st.lists(level, min_size=1, max_size=4).map("/".join)
topic_filter = st.lists(level | st.just("+"), min_size=1, max_size=4).map("/".join) | topic_name.map(lambda t: t + "/#")

# Spec table 2-4, transcribed: property -> value strategy, and which packet each may appear in.
VALUE = {
    "payload_format_indicator": flag, "message_expiry_interval": u32, "content_type": text,
    "response_topic": topic_name,
    "correlation_data": binary, "session_expiry_interval": u32, "assigned_client_identifier": text,
    "server_keep_alive": u16, "authentication_method": text, "authentication_data": binary,
    "request_problem_information": flag, "will_delay_interval": u32, "request_response_information": flag,
    "response_information": text, "server_reference": text, "reason_string": text,
    "receive_maximum": st.integers(1, 0xFFFF), "topic_alias_maximum": u16, "topic_alias": st.integers(1, 0xFFFF),
    "maximum_qos": flag, "retain_available": flag, "maximum_packet_size": st.integers(1, 0xFFFF_FFFF),
    "wildcard_subscription_available": flag, "subscription_identifier_available": flag,
    "shared_subscription_available": flag,
}
_MESSAGE = ["payload_format_indicator", "message_expiry_interval", "content_type", "response_topic", "correlation_data"]
ALLOWED = {
    "CONNECT": ["session_expiry_interval", "authentication_method", "authentication_data",
                "request_problem_information", "request_response_information", "receive_maximum",
                "topic_alias_maximum", "maximum_packet_size"],
    "CONNACK": ["session_expiry_interval", "assigned_client_identifier", "server_keep_alive", "authentication_method",
                "authentication_data", "response_information", "server_reference", "reason_string",
                "receive_maximum", "topic_alias_maximum", "maximum_qos", "retain_available", "maximum_packet_size",
                "wildcard_subscription_available", "subscription_identifier_available",
                "shared_subscription_available"],
    "PUBLISH": [*_MESSAGE, "topic_alias"],
    "WILL": [*_MESSAGE, "will_delay_interval"],
    "ACK": ["reason_string"],
    "SUBSCRIBE": [],
    "SUBACK": ["reason_string"],
    "UNSUBSCRIBE": [],
    "UNSUBACK": ["reason_string"],
    "DISCONNECT": ["session_expiry_interval", "server_reference", "reason_string"],
    "AUTH": ["authentication_method", "authentication_data", "reason_string"],
}
user_properties = st.lists(st.tuples(text, text), max_size=3)


def properties(kind: str) -> st.SearchStrategy[Properties]:
    """Properties holding only what packet `kind` may carry: a few of them, drawn sparsely to keep generation cheap."""
    allowed = ALLOWED[kind]

    @st.composite
    def build(draw: st.DrawFn) -> Properties:
        names = draw(st.lists(st.sampled_from(allowed), unique=True, max_size=4)) if allowed else []
        fields = {name: draw(VALUE[name]) for name in names}
        fields["user_properties"] = draw(user_properties)
        if kind in ("PUBLISH", "SUBSCRIBE"):
            most = 3 if kind == "PUBLISH" else 1  # repeatable only in PUBLISH [MQTT-3.8.2.1.2]
            fields["subscription_identifiers"] = draw(st.lists(st.integers(1, 268_435_455), max_size=most))
        return Properties(**fields)

    return build()


NO_PROPS = st.just(None).map(lambda _: Properties())

# Reason codes each v5 packet may carry (spec 3.x reason code tables).
CONNACK_CODES = [0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97, 0x99,
                 0x9A, 0x9B, 0x9C, 0x9D, 0x9F]
PUBACK_CODES = [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99]
PUBREL_CODES = [0x00, 0x92]
SUBACK_CODES = [0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2]
UNSUBACK_CODES = [0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91]
DISCONNECT_CODES = [0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95,
                    0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2]
AUTH_CODES = [0x00, 0x18, 0x19]
# The v5 codes that survive a 3.1.1 CONNACK unchanged (return codes 0..5) [MQTT-3.2.2.3].
V311_CONNACK_CODES = [0x00, 0x84, 0x85, 0x88, 0x86, 0x87]


def _props(v5: bool, kind: str) -> st.SearchStrategy[Properties]:
    return properties(kind) if v5 else NO_PROPS


def connect(version: int) -> st.SearchStrategy[Connect]:
    v5 = version == 5
    will = st.none() | st.builds(Will, topic_name, binary, st.integers(0, 2), st.booleans(), _props(v5, "WILL"))

    @st.composite
    def build(draw: st.DrawFn) -> Connect:
        username = draw(st.none() | text)
        # 3.1.1 forbids a password without a user name [MQTT-3.1.2-22]
        password = draw(st.none() | binary) if (v5 or username is not None) else None
        return Connect(draw(text), version, draw(st.booleans()), draw(u16), username, password, draw(will),
                       draw(_props(v5, "CONNECT")))

    return build()


def connack(version: int) -> st.SearchStrategy[Connack]:
    codes = CONNACK_CODES if version == 5 else V311_CONNACK_CODES
    return st.builds(Connack, st.booleans(), st.sampled_from(codes), _props(version == 5, "CONNACK"))


def publish(version: int) -> st.SearchStrategy[Publish]:
    v5 = version == 5

    @st.composite
    def build(draw: st.DrawFn) -> Publish:
        qos = draw(st.integers(0, 2))
        props = draw(_props(v5, "PUBLISH"))
        # v5: an empty topic is allowed when a topic alias stands in for it [MQTT-3.3.2-1]
        topic = draw(topic_name | st.just("")) if props.topic_alias is not None else draw(topic_name)
        dup = draw(st.booleans()) if qos else False  # DUP is 0 for QoS 0 [MQTT-3.3.1-2]
        pid = draw(packet_id) if qos else None
        return Publish(topic, draw(st.binary(max_size=64)), qos, draw(st.booleans()), dup, pid, props)

    return build()


def ack(cls: type, version: int) -> st.SearchStrategy:
    if version != 5:
        return st.builds(cls, packet_id)
    codes = PUBREL_CODES if cls in (Pubrel, Pubcomp) else PUBACK_CODES
    return st.builds(cls, packet_id, st.sampled_from(codes), properties("ACK"))


def subscribe(version: int) -> st.SearchStrategy[Subscribe]:
    if version == 5:
        sub = st.builds(SubscriptionRequest, topic_filter, st.integers(0, 2), st.booleans(), st.booleans(),
                        st.integers(0, 2))
        shared = st.builds(SubscriptionRequest, topic_filter.map(lambda f: "$share/g/" + f), st.integers(0, 2),
                           st.just(False), st.booleans(), st.integers(0, 2))  # No Local forbidden [MQTT-3.8.3-4]
        sub = sub | shared
    else:
        sub = st.builds(SubscriptionRequest, topic_filter, st.integers(0, 2))
    return st.builds(Subscribe, packet_id, st.lists(sub, min_size=1, max_size=4), _props(version == 5, "SUBSCRIBE"))


def suback(version: int) -> st.SearchStrategy[Suback]:
    codes = SUBACK_CODES if version == 5 else [0x00, 0x01, 0x02, 0x80]
    return st.builds(Suback, packet_id, st.lists(st.sampled_from(codes), min_size=1, max_size=4),
                     _props(version == 5, "SUBACK"))


def unsubscribe(version: int) -> st.SearchStrategy[Unsubscribe]:
    return st.builds(Unsubscribe, packet_id, st.lists(topic_filter, min_size=1, max_size=4),
                     _props(version == 5, "UNSUBSCRIBE"))


def unsuback(version: int) -> st.SearchStrategy[Unsuback]:
    if version != 5:
        return st.builds(Unsuback, packet_id)
    return st.builds(Unsuback, packet_id, st.lists(st.sampled_from(UNSUBACK_CODES), min_size=1, max_size=4),
                     properties("UNSUBACK"))


def disconnect(version: int) -> st.SearchStrategy[Disconnect]:
    if version != 5:
        return st.just(None).map(lambda _: Disconnect())
    return st.builds(Disconnect, st.sampled_from(DISCONNECT_CODES), properties("DISCONNECT"))


def auth() -> st.SearchStrategy[Auth]:
    return st.builds(Auth, st.sampled_from(AUTH_CODES), properties("AUTH"))


def packets(version: int) -> dict[str, st.SearchStrategy]:
    """Every packet type valid in `version`, by name."""
    out: dict[str, st.SearchStrategy] = {
        "CONNECT": connect(version),
        "CONNACK": connack(version),
        "PUBLISH": publish(version),
        "PUBACK": ack(Puback, version),
        "PUBREC": ack(Pubrec, version),
        "PUBREL": ack(Pubrel, version),
        "PUBCOMP": ack(Pubcomp, version),
        "SUBSCRIBE": subscribe(version),
        "SUBACK": suback(version),
        "UNSUBSCRIBE": unsubscribe(version),
        "UNSUBACK": unsuback(version),
        "PINGREQ": st.just(None).map(lambda _: Pingreq()),
        "PINGRESP": st.just(None).map(lambda _: Pingresp()),
        "DISCONNECT": disconnect(version),
    }
    if version == 5:
        out["AUTH"] = auth()
    return out


def any_packet(version: int) -> st.SearchStrategy:
    """Any valid packet of `version`."""
    return st.one_of(list(packets(version).values()))
