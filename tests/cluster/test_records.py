"""Record encodings for migration and replication: round trips, determinism, ordering key, bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.cluster import dvv, records
from appliance.cluster.errors import WireError
from appliance.protocol.packets import Properties, Will

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
options = st.builds(SubscriptionOptions, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2),
                    st.one_of(st.none(), st.integers(1, 268_435_455)))
messages = st.builds(
    Message, texts, texts, st.binary(max_size=16), st.integers(0, 2), st.booleans(), texts,
    st.floats(0, 2e9, allow_nan=False), st.one_of(st.none(), st.floats(0, 2e9, allow_nan=False)),
    st.builds(Properties, content_type=st.one_of(st.none(), texts),
              user_properties=st.lists(st.tuples(texts, texts), max_size=2)),
)
deliveries = st.builds(Delivery, st.integers(1, 2**40), messages, st.integers(0, 2), st.booleans(),
                       st.lists(st.integers(1, 1000), max_size=2), st.one_of(st.none(), st.integers(1, 65535)),
                       st.sampled_from(list(DeliveryState)), st.integers(0, 5))
wills = st.one_of(st.none(), st.builds(Will, texts, st.binary(max_size=8), st.integers(0, 2), st.booleans(),
                                       st.builds(Properties, will_delay_interval=st.one_of(st.none(),
                                                                                           st.integers(0, 99)))))
sessions = st.builds(SessionRecord, texts, st.sampled_from([4, 5]), st.integers(0, 0xFFFFFFFF),
                     st.one_of(st.none(), st.floats(0, 2e9, allow_nan=False)), wills,
                     st.one_of(st.none(), st.floats(0, 2e9, allow_nan=False)), st.one_of(st.none(), texts),
                     st.integers(1, 2**40), st.dictionaries(texts, options, max_size=3))


@settings(max_examples=150, deadline=None)
@given(sessions, st.lists(deliveries, max_size=4))
def test_session_round_trips(record: SessionRecord, queue: list[Delivery]) -> None:
    assert records.decode_session(records.encode_session(record, queue)) == (record, queue)


@settings(max_examples=150, deadline=None)
@given(deliveries)
def test_delivery_round_trips(d: Delivery) -> None:
    assert records.decode_delivery(records.encode_delivery(d)) == d


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(texts, options, max_size=4))
def test_subscriptions_round_trip_and_are_deterministic(subs: dict) -> None:
    data = records.encode_subscriptions(subs)
    assert records.decode_subscriptions(data) == subs
    assert records.encode_subscriptions(dict(reversed(list(subs.items())))) == data


def test_retained_resolution_prefers_the_later_message() -> None:
    old = Message("m1", "t", b"zzz-old", 0, True, "p", 1000.0)
    new = Message("m2", "t", b"aaa-new", 0, True, "p", 2000.5)
    a = dvv.update(dvv.EMPTY, {}, records.encode_retained(old), "n1")
    b = dvv.update(dvv.EMPTY, {}, records.encode_retained(new), "n2")
    winner = dvv.resolve(dvv.sync(a, b), order_key=records.retained_order)
    assert winner is not None and records.decode_retained(winner) == new


@pytest.mark.parametrize("data", [b"", b"\x02", b"\x01\x01", records.encode_subscriptions({}) + b"x"])
def test_bad_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(WireError):
        records.decode_subscriptions(data)
    with pytest.raises(WireError):
        records.decode_session(data)
