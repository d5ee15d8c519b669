"""Server side of one MQTT connection as a transition table (h11 style): receive_data -> packets, send -> bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import Enum

from .codec import encode, encode_publish, encode_publish_properties
from .decoder import REASON_CODES, Decoder
from .errors import MQTTError, PacketTooLarge, ProtocolError, UnsupportedProtocolVersion
from .packets import (
    MQTT_5,
    PACKET_TYPES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
)
from .reason_codes import V311_CONNACK, ReasonCode


class State(Enum):
    """Where the connection stands."""

    AWAIT_CONNECT = "await_connect"  # nothing received yet
    AWAIT_CONNACK = "await_connack"  # CONNECT received, CONNACK not yet sent
    CONNECTED = "connected"  # successful CONNACK sent
    CLOSED = "closed"  # DISCONNECT or failed CONNACK sent / received, or a protocol error


# Enum members as module constants for the hot paths: State.X is a class attribute lookup costing ~0.2-0.5 us in
# Python 3.11, a global ~0.02 us.
_CLOSED, _CONNECTED, _AWAIT_CONNECT = State.CLOSED, State.CONNECTED, State.AWAIT_CONNECT

IN, OUT = "in", "out"  # received from the client / sent by the server
_P = PacketType
_CLIENT_SENDS = (_P.PUBLISH, _P.PUBACK, _P.PUBREC, _P.PUBREL, _P.PUBCOMP, _P.SUBSCRIBE, _P.UNSUBSCRIBE, _P.PINGREQ)
_SERVER_SENDS = (_P.PUBLISH, _P.PUBACK, _P.PUBREC, _P.PUBREL, _P.PUBCOMP, _P.SUBACK, _P.UNSUBACK, _P.PINGRESP)

# (state, direction, packet type) -> next state. Anything missing is a protocol error.
TRANSITIONS: dict[tuple[State, str, PacketType], State] = {
    (State.AWAIT_CONNECT, IN, _P.CONNECT): State.AWAIT_CONNACK,  # CONNECT first [MQTT-3.1.0-1]
    (State.AWAIT_CONNACK, IN, _P.AUTH): State.AWAIT_CONNACK,  # enhanced authentication [MQTT-4.12]
    (State.AWAIT_CONNACK, IN, _P.DISCONNECT): State.CLOSED,
    (State.AWAIT_CONNACK, OUT, _P.AUTH): State.AWAIT_CONNACK,
    (State.AWAIT_CONNACK, OUT, _P.CONNACK): State.CONNECTED,  # a failure code goes to CLOSED instead [MQTT-3.2.2-7]
    (State.CONNECTED, IN, _P.AUTH): State.CONNECTED,  # re-authentication [MQTT-4.12.1]
    (State.CONNECTED, IN, _P.DISCONNECT): State.CLOSED,
    (State.CONNECTED, OUT, _P.AUTH): State.CONNECTED,
    (State.CONNECTED, OUT, _P.DISCONNECT): State.CLOSED,
    **{(State.CONNECTED, IN, t): State.CONNECTED for t in _CLIENT_SENDS},
    # A client may pipeline packets behind CONNECT without waiting for CONNACK (MQTT 3.1.4, non-normative);
    # the broker handles them only after a successful CONNACK [MQTT-3.1.4-5]. Not with enhanced auth [MQTT-3.1.2-30].
    **{(State.AWAIT_CONNACK, IN, t): State.AWAIT_CONNACK for t in _CLIENT_SENDS},
    **{(State.CONNECTED, OUT, t): State.CONNECTED for t in _SERVER_SENDS},
}

_RELEASES_INBOUND = (Puback, Pubcomp)  # sending these ends an inbound QoS 1 / QoS 2 flow [MQTT-4.9]
_ACK_TYPES = frozenset({Puback, Pubrec, Pubrel, Pubcomp})  # allowed both ways once CONNECTED, no checks needed
_ACK_FIRST_BYTE = {Puback: b"\x40\x02", Pubrec: b"\x50\x02", Pubrel: b"\x62\x02", Pubcomp: b"\x70\x02"}


class Connection:
    """Server-side protocol state of one client connection; no I/O, no clock (pass `now` in)."""

    def __init__(self, max_packet_size: int | None = None, receive_maximum: int = 65_535,
                 topic_alias_maximum: int = 0) -> None:
        self.state = State.AWAIT_CONNECT
        self.max_packet_size = max_packet_size  # what we accept (announced in CONNACK)
        self.receive_maximum = receive_maximum  # inbound QoS>0 PUBLISHes we accept unacknowledged
        self.topic_alias_maximum = topic_alias_maximum  # inbound aliases we accept
        self.decoder = Decoder(max_packet_size)
        self.connect: Connect | None = None
        self.keepalive = 0  # negotiated seconds: CONNECT's, or the CONNACK's Server Keep Alive [MQTT-3.2.2-21]
        self.last_received: float | None = None
        self.client_receive_maximum = 65_535  # outbound QoS>0 window the broker must honour [MQTT-3.3.4-7]
        self.client_maximum_packet_size: int | None = None  # [MQTT-3.1.2-24]
        self.client_topic_alias_maximum = 0
        self.inbound_inflight: set[int] = set()  # packet ids of unacknowledged inbound QoS>0 PUBLISHes
        self._inbound_aliases: dict[int, str] = {}
        self._outbound_aliases: dict[str, int] = {}
        self.error: MQTTError | None = None  # the first protocol error received, if any
        self._maximum_qos = 2  # as announced in our CONNACK [MQTT-3.2.2-11]
        self._retain_available = True  # as announced in our CONNACK [MQTT-3.2.2-14]

    @property
    def protocol_version(self) -> int | None:
        """4 (3.1.1) or 5 once CONNECT's protocol level has been read; None before."""
        return self.decoder.protocol_version

    @property
    def closed(self) -> bool:
        """True once nothing more may be sent or received."""
        return self.state is _CLOSED

    def _transition(self, direction: str, ptype: PacketType) -> State:
        try:
            return TRANSITIONS[(self.state, direction, ptype)]
        except KeyError:
            pass
        who = "client" if direction == IN else "server"
        if ptype == _P.CONNECT and direction == IN:
            raise ProtocolError("a second CONNECT is a protocol error [MQTT-3.1.0-2]")
        if self.state is State.AWAIT_CONNECT:
            raise ProtocolError(f"{ptype.name} before CONNECT [MQTT-3.1.0-1]")
        raise ProtocolError(f"{who} may not send {ptype.name} in state {self.state.value}")

    # ---- inbound -------------------------------------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float | None = None) -> list[Packet]:
        """Decode and check client bytes; returns the packets in order, topic aliases resolved.

        Packets a client pipelines behind CONNECT are returned too: act on them only after a successful CONNACK
        [MQTT-3.1.4-5]. On MQTTError the whole call's packets are void: answer with error_disconnect(err) and close.
        """
        if self.error is not None:
            raise self.error
        if self.state is _CLOSED:
            if data:
                raise ProtocolError("data received after the connection closed [MQTT-3.14.4-1]")
            return []
        try:
            if self.state is _AWAIT_CONNECT and data and data[0] != 0x10 and not self.decoder.buffered:
                raise ProtocolError(f"first byte 0x{data[0]:02x} is not CONNECT [MQTT-3.1.0-1]")
            packets = self.decoder.feed(data)
            for packet in packets:
                cls = type(packet)
                if self.state is _CONNECTED and (cls is Publish or cls in _ACK_TYPES):
                    if cls is Publish and (packet.qos or self.decoder.protocol_version == MQTT_5):  # type: ignore[union-attr]
                        self._receive_publish(packet)  # type: ignore[arg-type]
                else:
                    self._receive(packet)
        except MQTTError as err:
            self.error = err  # the stream is unusable now; answer with error_disconnect(err) and close
            raise
        if packets and now is not None:
            self.last_received = now
        return packets

    def _receive(self, packet: Packet) -> None:
        ptype = PACKET_TYPES[type(packet)]
        next_state = self._transition(IN, ptype)
        if isinstance(packet, Connect):
            self._receive_connect(packet)
        elif self.connect is not None and self.connect.properties.authentication_method is not None \
                and self.state is State.AWAIT_CONNACK and ptype not in (_P.AUTH, _P.DISCONNECT):
            raise ProtocolError(f"{ptype.name} before CONNACK during enhanced authentication [MQTT-3.1.2-30]")
        elif isinstance(packet, Publish):
            self._receive_publish(packet)
        elif isinstance(packet, Auth):
            if self.connect is None or self.connect.properties.authentication_method is None:
                raise ProtocolError("AUTH without an Authentication Method in CONNECT [MQTT-4.12.0-6]")
        elif isinstance(packet, Disconnect):
            self._receive_disconnect(packet)
        self.state = next_state

    def _receive_connect(self, packet: Connect) -> None:
        self.connect = packet
        self.keepalive = packet.keepalive
        props = packet.properties
        if packet.protocol_version == MQTT_5:
            if props.authentication_data is not None and props.authentication_method is None:
                raise ProtocolError("Authentication Data without Authentication Method [MQTT-3.1.2.11.10]")
            if props.receive_maximum is not None:
                self.client_receive_maximum = props.receive_maximum
            self.client_maximum_packet_size = props.maximum_packet_size
            self.client_topic_alias_maximum = props.topic_alias_maximum or 0
        elif not packet.client_id and not packet.clean_start:
            raise MQTTError("empty client id requires clean session [MQTT-3.1.3-8]",
                            ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)

    def _receive_publish(self, packet: Publish) -> None:
        if self.decoder.protocol_version == MQTT_5:
            props = packet.properties
            alias = props.topic_alias
            if alias is not None:
                if alias == 0 or alias > self.topic_alias_maximum:
                    raise ProtocolError(f"topic alias {alias} outside 1..{self.topic_alias_maximum} [MQTT-3.3.2-9]",
                                        ReasonCode.TOPIC_ALIAS_INVALID)
                if packet.topic:
                    self._inbound_aliases[alias] = packet.topic
                else:
                    topic = self._inbound_aliases.get(alias)
                    if topic is None:
                        raise ProtocolError(f"unknown topic alias {alias} with an empty topic [MQTT-3.3.4]")
                    packet.topic = topic
                props.topic_alias = None  # the broker always sees the real topic
            if props.subscription_identifiers:
                raise ProtocolError("a client PUBLISH must not carry a Subscription Identifier [MQTT-3.3.4-6]")
            if packet.qos > self._maximum_qos:
                raise MQTTError(f"QoS {packet.qos} above the Maximum QoS {self._maximum_qos} [MQTT-3.2.2-11]",
                                ReasonCode.QOS_NOT_SUPPORTED)
            if packet.retain and not self._retain_available:
                raise MQTTError("RETAIN set though Retain Available is 0 [MQTT-3.2.2-14]",
                                ReasonCode.RETAIN_NOT_SUPPORTED)
        if packet.qos:
            inflight = self.inbound_inflight
            packet_id = packet.packet_id
            if packet_id not in inflight:
                if len(inflight) >= self.receive_maximum and self.decoder.protocol_version == MQTT_5:
                    raise ProtocolError(f"more than {self.receive_maximum} unacknowledged QoS>0 PUBLISHes "
                                        "[MQTT-3.3.4-9]", ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
                inflight.add(packet_id)  # type: ignore[arg-type]

    def _receive_disconnect(self, packet: Disconnect) -> None:
        requested = packet.properties.session_expiry_interval
        if requested and self.connect is not None and not self.connect.properties.session_expiry_interval:
            raise ProtocolError("DISCONNECT sets a Session Expiry Interval after CONNECT had 0 [MQTT-3.14.2-2]")

    # ---- outbound ------------------------------------------------------------------------------------------------

    def send(self, packet: Packet) -> bytes:
        """Encode a server packet after checking it is allowed now.

        Returns b"" when there is nothing to write: a PUBLISH larger than the client's Maximum Packet Size (drop it
        and treat it as delivered [MQTT-3.1.2-24, MQTT-3.1.2-25]), a DISCONNECT to a 3.1.1 client (just close), or
        any packet once the connection is closed (check `closed` to tell this apart). Out-of-order sends raise.
        """
        if self.state is _CLOSED:
            return b""  # the connection is gone: nothing more goes out [MQTT-3.14.4-1]
        cls = type(packet)
        if cls in _ACK_FIRST_BYTE and self.state is _CONNECTED:  # hot path: a plain acknowledgement
            ack: Puback = packet  # type: ignore[assignment]
            pid = ack.packet_id
            props = ack.properties
            if (0 < pid <= 0xFFFF and props.reason_string is None and not props.user_properties
                    and (not ack.reason_code or self.decoder.protocol_version != MQTT_5)):
                if cls is not Pubrel and (cls is not Pubrec or ack.reason_code >= 0x80):
                    self.inbound_inflight.discard(pid)  # the inbound flow ends [MQTT-4.9]
                return _ACK_FIRST_BYTE[cls] + pid.to_bytes(2, "big")
        if isinstance(packet, Publish):
            props = packet.properties
            return self.send_publish(packet.topic, packet.payload, packet.qos, packet.retain, packet.dup,
                                     packet.packet_id, encode_publish_properties(props), props.subscription_identifiers)
        ptype = PACKET_TYPES[type(packet)]
        next_state = self._transition(OUT, ptype)
        version = self.decoder.protocol_version or 4
        if isinstance(packet, Connack):
            packet, next_state = self._prepare_connack(packet, version)
        elif isinstance(packet, Disconnect) and version != MQTT_5:
            self.state = State.CLOSED  # 3.1.1 has no server DISCONNECT: close the network connection
            return b""
        elif isinstance(packet, Auth) and (self.connect is None or not self.connect.properties.authentication_method):
            raise ProtocolError("AUTH to a client that did not ask for enhanced authentication [MQTT-4.12.0-6]")
        elif isinstance(packet, _RELEASES_INBOUND) or (isinstance(packet, Pubrec) and packet.reason_code >= 0x80):
            self.inbound_inflight.discard(packet.packet_id)
        if (self.connect is not None and self.connect.properties.request_problem_information == 0
                and ptype not in (_P.CONNACK, _P.DISCONNECT)):
            packet = _without_diagnostics(packet)  # [MQTT-3.1.2-29]
        data = encode(packet, version)
        limit = self.client_maximum_packet_size
        if limit is not None and len(data) > limit:
            data = self._shrink(packet, version, limit)
        self.state = next_state
        return data

    def _shrink(self, packet: Packet, version: int, limit: int) -> bytes:
        """Drop Reason String and User Properties to fit the client's limit [MQTT-3.1.2-25 and per-packet rules]."""
        data = encode(_without_diagnostics(packet), version)
        if len(data) <= limit:
            return data
        raise PacketTooLarge(f"{type(packet).__name__} does not fit the client's Maximum Packet Size {limit}")

    def _prepare_connack(self, packet: Connack, version: int) -> tuple[Connack, State]:
        if packet.reason_code >= 0x80:
            return replace(packet, session_present=False), State.CLOSED  # [MQTT-3.2.2-6], then close [MQTT-3.2.2-7]
        if version != MQTT_5:
            return packet, State.CONNECTED
        props = packet.properties
        fill: dict[str, int | None] = {}
        if props.receive_maximum is None and self.receive_maximum != 65_535:
            fill["receive_maximum"] = self.receive_maximum
        if props.topic_alias_maximum is None and self.topic_alias_maximum:
            fill["topic_alias_maximum"] = self.topic_alias_maximum
        if props.maximum_packet_size is None and self.max_packet_size is not None:
            fill["maximum_packet_size"] = self.max_packet_size
        if props.receive_maximum is not None:
            self.receive_maximum = props.receive_maximum
        if props.topic_alias_maximum is not None:
            self.topic_alias_maximum = props.topic_alias_maximum
        if props.maximum_packet_size is not None:
            self.max_packet_size = self.decoder.max_packet_size = props.maximum_packet_size
        if props.server_keep_alive is not None:
            self.keepalive = props.server_keep_alive  # the client must use the server's value [MQTT-3.2.2-21]
        if props.maximum_qos is not None:
            self._maximum_qos = props.maximum_qos
        if props.retain_available == 0:
            self._retain_available = False
        if props.response_information is not None and self.connect is not None \
                and self.connect.properties.request_response_information != 1:
            fill["response_information"] = None  # only sent when asked for [MQTT-3.1.2-28]
        if fill:
            packet = replace(packet, properties=replace(props, **fill))  # type: ignore[arg-type]
        return packet, State.CONNECTED

    def send_publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, dup: bool = False,
                     packet_id: int | None = None, properties: bytes = b"",
                     subscription_ids: Sequence[int] = ()) -> bytes:
        """Fast path for an outbound PUBLISH; `properties` from encode_publish_properties, cached per message.

        Assigns outbound topic aliases when the client allows them. Returns b"" if the packet exceeds the
        client's Maximum Packet Size: drop it and treat it as delivered [MQTT-3.1.2-24, MQTT-3.1.2-25]; also b""
        once the connection is closed (then `closed` is True and the message stays queued for the session).
        """
        if self.state is not _CONNECTED:
            if self.state is _CLOSED:
                return b""
            self._transition(OUT, _P.PUBLISH)
        version = self.decoder.protocol_version or 4
        alias = None
        wire_topic = topic
        if self.client_topic_alias_maximum:
            alias = self._outbound_aliases.get(topic)
            if alias is not None:
                wire_topic = ""
            elif len(self._outbound_aliases) < self.client_topic_alias_maximum:
                alias = len(self._outbound_aliases) + 1
                self._outbound_aliases[topic] = alias  # first use carries topic and alias [MQTT-3.3.2.3.4]
        data = encode_publish(wire_topic, payload, qos, retain, dup, packet_id, version,
                              properties if version == MQTT_5 else b"", subscription_ids, alias)
        limit = self.client_maximum_packet_size
        if limit is not None and len(data) > limit:
            if alias is not None and wire_topic:
                del self._outbound_aliases[topic]  # the client never saw this alias
            return b""
        return data

    # ---- time and errors -----------------------------------------------------------------------------------------

    def keepalive_deadline(self, now: float) -> float | None:
        """When the connection must be closed if no further packet arrives: 1.5 x keepalive [MQTT-3.1.2-22]."""
        if not self.keepalive:
            return None
        base = self.last_received if self.last_received is not None else now
        return base + 1.5 * self.keepalive

    def error_disconnect(self, err: MQTTError) -> bytes | None:
        """The bytes to send before closing after `err` (CONNACK or v5 DISCONNECT), or None to just close."""
        state, self.state = self.state, State.CLOSED
        version = self.decoder.protocol_version
        code = int(err.reason_code) if err.reason_code >= 0x80 else int(ReasonCode.UNSPECIFIED_ERROR)
        if state is State.CLOSED:
            return None
        if state is not State.CONNECTED:  # no DISCONNECT before CONNACK [MQTT-3.14.0-1]: answer with CONNACK
            if isinstance(err, UnsupportedProtocolVersion) and version is None:
                return b"\x20\x02\x00\x01"  # 3.1.1 "unacceptable protocol level" [MQTT-3.1.2-2]
            if version == MQTT_5:
                if code not in REASON_CODES[_P.CONNACK]:
                    code = ReasonCode.UNSPECIFIED_ERROR
                return encode(Connack(False, code), MQTT_5)
            if version is not None and code in V311_CONNACK:
                return encode(Connack(False, code), version)
            return None
        if version == MQTT_5:
            return encode(Disconnect(code), MQTT_5)  # [MQTT-4.13.1-1]
        return None




def _without_diagnostics(packet: Packet) -> Packet:
    """A copy of `packet` without Reason String and User Properties (the caller's object is left alone)."""
    props = getattr(packet, "properties", None)
    if not isinstance(props, Properties) or (props.reason_string is None and not props.user_properties):
        return packet
    return replace(packet, properties=replace(props, reason_string=None, user_properties=[]))  # type: ignore[arg-type]
