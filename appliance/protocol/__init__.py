"""Sans-I/O MQTT 3.1.1 / 5.0 protocol layer: packets, codec, topics and the per-connection state machine.

Public API (all importable from `appliance.protocol`):
- packets: Connect, Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, SubscriptionRequest, Suback,
  Unsubscribe, Unsuback, Pingreq, Pingresp, Disconnect, Auth, Will, Properties, Packet, PacketType, MQTT_311, MQTT_5
- errors: MQTTError (root, `.reason_code`), MalformedPacket, ProtocolError, PacketTooLarge, UnsupportedProtocolVersion
- ReasonCode, v311_connack_code, v311_suback_code
- codec: encode(packet, version) -> bytes; encode_publish(topic, payload, qos, retain, dup, packet_id, version,
  properties, subscription_ids, topic_alias) -> bytes; encode_publish_properties(Properties) -> bytes (cache it
  per message and pass it as `properties`)
- Decoder(max_packet_size=None, protocol_version=None).feed(data) -> list[Packet]; .protocol_version, .buffered
- topics: validate_topic_name, validate_topic_filter (-> SharedFilter | None), is_valid_topic_name,
  is_valid_topic_filter, parse_shared, SharedFilter(group, topic_filter), topic_matches(filter, topic)
- connection: Connection(max_packet_size=None, receive_maximum=65535, topic_alias_maximum=0) with
  receive_data(data, now=None) -> list[Packet], send(packet) -> bytes, send_publish(topic, payload, qos, retain, dup,
  packet_id, properties, subscription_ids) -> bytes (b"" = nothing to write: too large for the client, so drop it
  and treat it as delivered, or `closed`), keepalive_deadline(now) -> float | None, error_disconnect(err) ->
  bytes | None, state (State), closed, error, protocol_version, connect, keepalive, client_receive_maximum,
  client_maximum_packet_size, client_topic_alias_maximum, inbound_inflight
"""

from .codec import encode, encode_publish, encode_publish_properties
from .connection import Connection, State
from .decoder import Decoder
from .errors import MalformedPacket, MQTTError, PacketTooLarge, ProtocolError, UnsupportedProtocolVersion
from .packets import (
    MQTT_5,
    MQTT_311,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
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
from .reason_codes import ReasonCode, v311_connack_code, v311_suback_code
from .topics import (
    SharedFilter,
    is_valid_topic_filter,
    is_valid_topic_name,
    parse_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

__all__ = [
    "MQTT_5",
    "MQTT_311",
    "Auth",
    "Connack",
    "Connect",
    "Connection",
    "Decoder",
    "Disconnect",
    "MQTTError",
    "MalformedPacket",
    "Packet",
    "PacketTooLarge",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "Properties",
    "ProtocolError",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "ReasonCode",
    "SharedFilter",
    "State",
    "Suback",
    "Subscribe",
    "SubscriptionRequest",
    "Unsuback",
    "Unsubscribe",
    "UnsupportedProtocolVersion",
    "Will",
    "encode",
    "encode_publish",
    "encode_publish_properties",
    "is_valid_topic_filter",
    "is_valid_topic_name",
    "parse_shared",
    "topic_matches",
    "v311_connack_code",
    "v311_suback_code",
    "validate_topic_filter",
    "validate_topic_name",
]
