"""Authenticator: anonymous policy, password-file users, client-certificate identities [MQTT-3.1.4-2]."""

from __future__ import annotations

import pytest

from appliance.broker.auth import Authenticator
from appliance.broker.passwords import PasswordFormatError, hash_password
from appliance.protocol.reason_codes import ReasonCode

OK, BAD, NOT_AUTH = ReasonCode.SUCCESS, ReasonCode.BAD_USER_NAME_OR_PASSWORD, ReasonCode.NOT_AUTHORIZED
FILE = f"# users\nalice:{hash_password('wonderland', n=16)}\nbob:{hash_password('bütter', n=16)}\n"


def test_anonymous_policy_without_a_password_file() -> None:
    assert Authenticator(True).check(None, None) == OK
    assert Authenticator(False).check(None, None) == NOT_AUTH
    assert Authenticator(False).check("anyone", b"x") == NOT_AUTH  # no file: a user name proves nothing


@pytest.mark.parametrize(("user", "password", "expected"), [
    ("alice", b"wonderland", OK),
    ("bob", "bütter".encode(), OK),
    ("alice", b"Wonderland", BAD),
    ("alice", None, BAD),
    ("carol", b"wonderland", BAD),
    ("alice", b"\xff\xfe", BAD),  # not UTF-8: refused, not an exception
])
def test_password_file_users(user: str, password: bytes | None, expected: ReasonCode) -> None:
    auth = Authenticator(False, FILE)
    assert auth.check(user, password) == expected
    assert auth.check(user, password) == expected  # the second answer may come from the cache: the same


def test_slow_check_is_needed_once_per_proven_password() -> None:
    auth = Authenticator(False, FILE)
    assert auth.needs_slow_check("alice", b"wonderland", None)
    assert auth.check("alice", b"wonderland") == OK
    assert not auth.needs_slow_check("alice", b"wonderland", None)
    assert auth.needs_slow_check("alice", b"other", None)  # a different password is checked in full
    assert not auth.needs_slow_check("carol", b"x", None)  # unknown users are refused without scrypt


def test_client_certificate_identity() -> None:
    auth = Authenticator(False, FILE)
    assert auth.check(None, None, cert_identity="device-7") == OK
    assert auth.check("device-7", None, cert_identity="device-7") == OK
    assert auth.check("alice", None, cert_identity="device-7") == BAD  # another user must prove the password
    assert auth.check("alice", b"wonderland", cert_identity="device-7") == OK


def test_anonymous_allowed_alongside_a_password_file() -> None:
    auth = Authenticator(True, FILE)
    assert auth.check(None, None) == OK
    assert auth.check("alice", b"nope") == BAD  # a wrong password is never downgraded to anonymous


def test_malformed_password_file_names_the_line() -> None:
    with pytest.raises(PasswordFormatError, match=r"^line 2: "):
        Authenticator(False, "alice:" + hash_password("x", n=16) + "\nbroken\n")
