"""The single exception root of the protocol layer; every error carries the reason code to send."""

from __future__ import annotations

from .reason_codes import ReasonCode


class MQTTError(Exception):
    """A protocol violation or refusal; `reason_code` is what the peer is told (DISCONNECT/CONNACK)."""

    reason_code: ReasonCode = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str, reason_code: ReasonCode | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code


class MalformedPacket(MQTTError):
    """Bytes that cannot be parsed as the packet they claim to be [MQTT-1.5, 2.1]."""

    reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolError(MQTTError):
    """A well-formed packet that breaks the protocol's rules (order, duplicates, forbidden values)."""

    reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(MQTTError):
    """A packet exceeding the negotiated Maximum Packet Size [MQTT-3.2.2-15]."""

    reason_code = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(MQTTError):
    """A CONNECT naming a protocol level other than 4 (3.1.1) or 5 [MQTT-3.1.2-2]."""

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
