"""Salted scrypt password hashes and the MQTT password file, shared by provisioning and broker auth (stdlib only)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

# Line format of the password file, one user per line (blank lines and '#' comments ignored):
#   username:scrypt$N$r$p$salt_b64$hash_b64
# N, r, p are decimal; salt and hash are standard base64 with padding.
SCHEME = "scrypt"
DEFAULT_N = 2**14  # 16 MiB of memory per check (128 * N * r): affordable on a 1 GB Pi, costly for a GPU farm
DEFAULT_R = 8
DEFAULT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
MAX_N = 2**20  # refuse parameters that would let a hostile file exhaust memory or CPU
MAX_R = 32
MAX_P = 16


class PasswordFormatError(ValueError):
    """A password hash or password-file line that does not follow the format; `line` is 1-based or None."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


def hash_password(password: str, *, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P,
                  salt: bytes | None = None) -> str:
    """Return `scrypt$N$r$p$salt$hash` for `password` with a fresh random salt unless one is given."""
    _check_params(n, r, p)
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = _scrypt(password, salt, n, r, p, HASH_BYTES)
    return "$".join((SCHEME, str(n), str(r), str(p), _b64(salt), _b64(digest)))


def verify_password(password: str, encoded: str) -> bool:
    """True when `password` matches the encoded hash; raises PasswordFormatError if `encoded` is malformed."""
    n, r, p, salt, expected = parse_hash(encoded)
    actual = _scrypt(password, salt, n, r, p, len(expected))
    return hmac.compare_digest(actual, expected)


def parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    """Split an encoded hash into (N, r, p, salt, digest), validating every field."""
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        raise PasswordFormatError("expected scrypt$N$r$p$salt$hash")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        raise PasswordFormatError("N, r and p must be decimal integers") from None
    _check_params(n, r, p)
    salt, digest = _unb64(parts[4], "salt"), _unb64(parts[5], "hash")
    if len(salt) < 8:
        raise PasswordFormatError("salt shorter than 8 bytes")
    if not 16 <= len(digest) <= 64:
        raise PasswordFormatError("hash must be 16..64 bytes")
    return n, r, p, salt, digest


def format_password_file(entries: dict[str, str]) -> str:
    """Render username -> encoded hash as password-file text, one `user:hash` line each, sorted by user."""
    lines = []
    for user in sorted(entries):
        check_username(user)
        parse_hash(entries[user])
        lines.append(f"{user}:{entries[user]}\n")
    return "".join(lines)


def parse_password_file(text: str) -> dict[str, str]:
    """Parse password-file text into username -> encoded hash; errors name the 1-based line."""
    users: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, encoded = line.partition(":")
        if not sep:
            raise PasswordFormatError("expected username:hash", number)
        try:
            check_username(user)
            parse_hash(encoded)
        except PasswordFormatError as exc:
            raise PasswordFormatError(str(exc), number) from None
        if user in users:
            raise PasswordFormatError(f"duplicate user {user!r}", number)
        users[user] = encoded
    return users


def check_username(user: str) -> None:
    """Raise PasswordFormatError unless `user` is a non-empty name without ':', whitespace or control characters."""
    if not user:
        raise PasswordFormatError("empty username")
    if len(user.encode()) > 65535:  # an MQTT UTF-8 string [MQTT-1.5.4]
        raise PasswordFormatError("username longer than 65535 bytes")
    if any(c == ":" or c.isspace() or ord(c) < 32 or ord(c) == 127 for c in user):
        raise PasswordFormatError(f"username {user!r} contains ':', whitespace or a control character")


def _check_params(n: int, r: int, p: int) -> None:
    if n < 2 or n > MAX_N or n & (n - 1):
        raise PasswordFormatError(f"scrypt N must be a power of two in 2..{MAX_N}")
    if not 1 <= r <= MAX_R or not 1 <= p <= MAX_P:
        raise PasswordFormatError(f"scrypt r must be 1..{MAX_R} and p 1..{MAX_P}")


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    maxmem = 128 * n * r * (p + 2) + 1024 * 1024
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=length)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise PasswordFormatError(f"{what} is not valid base64") from None
