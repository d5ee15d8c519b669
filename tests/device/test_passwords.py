"""The shared scrypt password hash and password-file format."""

from __future__ import annotations

import hashlib

import pytest

from appliance.broker.passwords import (
    PasswordFormatError,
    format_password_file,
    hash_password,
    parse_hash,
    parse_password_file,
    verify_password,
)

FAST = {"n": 2**10, "r": 8, "p": 1}  # cheap parameters keep the suite quick; defaults are exercised once below


def test_round_trip_and_wrong_password() -> None:
    encoded = hash_password("s3cret-ü", **FAST)
    assert verify_password("s3cret-ü", encoded)
    assert not verify_password("s3cret-u", encoded)
    assert not verify_password("", encoded)


def test_default_parameters_and_layout() -> None:
    encoded = hash_password("pw")
    scheme, n, r, p, _salt, _digest = encoded.split("$")
    assert (scheme, n, r, p) == ("scrypt", str(2**14), "8", "1")
    assert verify_password("pw", encoded)


def test_matches_independent_scrypt_computation() -> None:
    salt = bytes(range(16))
    encoded = hash_password("hello", salt=salt, **FAST)
    n, r, p, got_salt, digest = parse_hash(encoded)
    assert (n, r, p, got_salt) == (2**10, 8, 1, salt)
    assert digest == hashlib.scrypt(b"hello", salt=salt, n=2**10, r=8, p=1, dklen=32)


def test_salts_differ() -> None:
    assert hash_password("same", **FAST) != hash_password("same", **FAST)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "bcrypt$1$2$3$AAAAAAAAAAA=$AAAA",
        "scrypt$1000$8$1$AAAAAAAAAAAAAAAAAAAAAA==$" + "A" * 44,  # N not a power of two
        "scrypt$1073741824$8$1$AAAAAAAAAAAAAAAAAAAAAA==$" + "A" * 44,  # N too large (memory bomb)
        "scrypt$1024$8$1$not*base64$" + "A" * 44,
        "scrypt$1024$x$1$AAAAAAAAAAAAAAAAAAAAAA==$" + "A" * 44,
        "scrypt$1024$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAA",  # digest too short
    ],
)
def test_malformed_hashes_are_rejected(bad: str) -> None:
    with pytest.raises(PasswordFormatError):
        verify_password("x", bad)


def test_password_file_round_trip() -> None:
    entries = {"bob": hash_password("b", **FAST), "alice": hash_password("a", **FAST)}
    text = format_password_file(entries)
    assert text.splitlines()[0].startswith("alice:scrypt$")
    parsed = parse_password_file("# comment\n\n" + text)
    assert parsed == entries
    assert verify_password("a", parsed["alice"]) and not verify_password("a", parsed["bob"])


def test_password_file_errors_name_the_line() -> None:
    good = hash_password("a", **FAST)
    with pytest.raises(PasswordFormatError, match="line 3"):
        parse_password_file(f"alice:{good}\n# c\nbob\n")
    with pytest.raises(PasswordFormatError, match=r"line 2.*duplicate"):
        parse_password_file(f"alice:{good}\nalice:{good}\n")
    with pytest.raises(PasswordFormatError, match="line 1"):
        parse_password_file(f"al ice:{good}\n")
