"""Binary encodings of broker records for replication and migration: sessions, deliveries, subscriptions, retained.

Used as the `data` of SessionState / Replicate messages and as the values of the replicated DVV spaces:
- "subs" space: key = client id, value = encode_subscriptions(filter -> options);
- "retained" space: key = topic, value = encode_retained(message); `retained_order` is the resolve() order key
  (the later `created` wins among concurrent siblings, then the bytes).
"""

from __future__ import annotations

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.protocol.errors import MQTTError
from appliance.protocol.packets import Will
from appliance.protocol.primitives import Reader
from appliance.protocol.properties import WILL, decode_properties, encode_properties

from .errors import WireError
from .wire import _F64, _Reader, _Writer, decode_message, encode_message

_FORMAT = 1


def _opt_f64(w: _Writer, x: float | None) -> None:
    """Write an optional double (flag byte then value)."""
    if x is None:
        w.uint(0)
    else:
        w.uint(1)
        w.f64(x)


def _get_opt_f64(r: _Reader) -> float | None:
    """Read an optional double."""
    return r.f64() if r.uint() else None


def _opt_str(w: _Writer, s: str | None) -> None:
    """Write an optional string."""
    if s is None:
        w.uint(0)
    else:
        w.uint(1)
        w.text(s)


def _get_opt_str(r: _Reader) -> str | None:
    """Read an optional string."""
    return r.text() if r.uint() else None


def _check_format(r: _Reader, what: str) -> None:
    """Read and check the leading format byte."""
    if r.uint() != _FORMAT:
        raise WireError(f"unknown {what} encoding")


def _done(r: _Reader, what: str) -> None:
    """Refuse trailing bytes."""
    if r.pos != len(r.buf):
        raise WireError(f"trailing bytes after {what}")


def _put_options(w: _Writer, o: SubscriptionOptions) -> None:
    """Write one subscription's options."""
    flags = o.qos | (4 if o.no_local else 0) | (8 if o.retain_as_published else 0) | (o.retain_handling << 4)
    w.uint(flags)
    w.uint(0 if o.subscription_id is None else o.subscription_id)


def _get_options(r: _Reader) -> SubscriptionOptions:
    """Read one subscription's options."""
    flags, sub_id = r.uint(), r.uint()
    if flags & 3 == 3 or flags >> 4 > 2 or flags & ~0x3F:
        raise WireError(f"bad subscription option flags 0x{flags:02x}")
    return SubscriptionOptions(flags & 3, bool(flags & 4), bool(flags & 8), flags >> 4, sub_id or None)


def encode_subscriptions(subs: dict[str, SubscriptionOptions]) -> bytes:
    """A client's subscriptions, sorted by filter (equal maps give equal bytes)."""
    w = _Writer()
    w.uint(_FORMAT)
    w.uint(len(subs))
    for topic_filter in sorted(subs):
        w.text(topic_filter)
        _put_options(w, subs[topic_filter])
    return bytes(w.out)


def decode_subscriptions(data: bytes) -> dict[str, SubscriptionOptions]:
    """Inverse of encode_subscriptions."""
    r = _Reader(data)
    _check_format(r, "subscriptions")
    subs = {r.text(): _get_options(r) for _ in range(r.uint())}
    _done(r, "subscriptions")
    return subs


def encode_retained(message: Message) -> bytes:
    """A retained message, prefixed with its creation time so that byte order follows time."""
    w = _Writer()
    w.f64(max(0.0, message.created))
    encode_message(w, message)
    return bytes(w.out)


def decode_retained(data: bytes) -> Message:
    """Inverse of encode_retained."""
    r = _Reader(data)
    r.f64()
    msg = decode_message(r)
    _done(r, "retained message")
    return msg


def retained_order(value: bytes) -> bytes:
    """resolve() order key for the retained space: the big-endian creation time (non-negative doubles sort as bytes)."""
    return value[: _F64.size]


def _put_delivery(w: _Writer, d: Delivery) -> None:
    """Write one queued delivery."""
    w.uint(d.seq)
    encode_message(w, d.message)
    w.uint(d.qos | (4 if d.retain else 0))
    w.uint(len(d.subscription_ids))
    for sid in d.subscription_ids:
        w.uint(sid)
    w.uint(0 if d.packet_id is None else d.packet_id)
    w.uint(int(d.state))
    w.uint(d.attempts)


def _get_delivery(r: _Reader) -> Delivery:
    """Read one queued delivery."""
    seq = r.uint()
    message = decode_message(r)
    flags = r.uint()
    sub_ids = [r.uint() for _ in range(r.uint())]
    packet_id = r.uint() or None
    try:
        state = DeliveryState(r.uint())
    except ValueError as exc:
        raise WireError("bad delivery state") from exc
    if flags & 3 == 3 or flags & ~7:
        raise WireError("bad delivery flags")
    return Delivery(seq, message, flags & 3, bool(flags & 4), sub_ids, packet_id, state, r.uint())


def encode_delivery(d: Delivery) -> bytes:
    """One delivery (e.g. the data of a Replicate 'enqueue')."""
    w = _Writer()
    w.uint(_FORMAT)
    _put_delivery(w, d)
    return bytes(w.out)


def decode_delivery(data: bytes) -> Delivery:
    """Inverse of encode_delivery."""
    r = _Reader(data)
    _check_format(r, "delivery")
    d = _get_delivery(r)
    _done(r, "delivery")
    return d


def _put_will(w: _Writer, will: Will | None) -> None:
    """Write an optional will."""
    if will is None:
        w.uint(0)
        return
    w.uint(1 | (will.qos << 1) | (8 if will.retain else 0))
    w.text(will.topic)
    w.raw(will.payload)
    try:
        w.raw(encode_properties(will.properties, WILL))
    except MQTTError as exc:
        raise WireError(f"will properties cannot be encoded: {exc}") from exc


def _get_will(r: _Reader) -> Will | None:
    """Read an optional will."""
    flags = r.uint()
    if not flags & 1:
        return None
    topic, payload, raw = r.text(), r.raw(), r.raw()
    try:
        props = decode_properties(Reader(raw, 0, len(raw)), WILL)
    except MQTTError as exc:
        raise WireError(f"bad will properties: {exc}") from exc
    return Will(topic, payload, (flags >> 1) & 3, bool(flags & 8), props)


def encode_session(record: SessionRecord, queue: list[Delivery] | None = None) -> bytes:
    """A session with its subscriptions and (optionally) its queue, in order: the data of a SessionState."""
    w = _Writer()
    w.uint(_FORMAT)
    w.text(record.client_id)
    w.uint(record.protocol_version)
    w.uint(record.expiry_interval)
    _opt_f64(w, record.disconnected_at)
    _put_will(w, record.will)
    _opt_f64(w, record.will_due_at)
    _opt_str(w, record.username)
    w.uint(record.next_seq)
    w.raw(encode_subscriptions(record.subscriptions))
    queue = queue or []
    w.uint(len(queue))
    for d in queue:
        _put_delivery(w, d)
    return bytes(w.out)


def decode_session(data: bytes) -> tuple[SessionRecord, list[Delivery]]:
    """Inverse of encode_session."""
    r = _Reader(data)
    _check_format(r, "session")
    client_id, version, expiry = r.text(), r.uint(), r.uint()
    disconnected_at = _get_opt_f64(r)
    will = _get_will(r)
    will_due_at = _get_opt_f64(r)
    username = _get_opt_str(r)
    next_seq = r.uint()
    subs = decode_subscriptions(r.raw())
    queue = [_get_delivery(r) for _ in range(r.uint())]
    _done(r, "session")
    record = SessionRecord(client_id, version, expiry, disconnected_at, will, will_due_at, username, next_seq, subs)
    return record, queue
