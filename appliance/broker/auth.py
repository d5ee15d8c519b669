"""Client authentication: anonymous policy and the salted-scrypt password file."""

from __future__ import annotations

import hashlib

from appliance.protocol.reason_codes import ReasonCode

from .passwords import parse_password_file, verify_password


class Authenticator:
    """Decides CONNECT credentials; verification is CPU-heavy (scrypt), so callers run `check` off the event loop."""

    def __init__(self, allow_anonymous: bool, password_file_text: str | None = None) -> None:
        self.allow_anonymous = allow_anonymous
        self.has_password_file = password_file_text is not None
        self.passwords = parse_password_file(password_file_text) if password_file_text is not None else {}
        self._verified: set[tuple[str, bytes]] = set()  # (user, sha256(password)) already proven this run

    def needs_slow_check(self, username: str | None, password: bytes | None, cert_identity: str | None) -> bool:
        """True when `check` would run scrypt (so the caller should run it in an executor)."""
        if cert_identity is not None or username is None or not self.has_password_file or password is None:
            return False
        if username not in self.passwords:
            return False
        return (username, hashlib.sha256(password).digest()) not in self._verified

    def check(self, username: str | None, password: bytes | None, cert_identity: str | None = None) -> ReasonCode:
        """Return SUCCESS, BAD_USER_NAME_OR_PASSWORD or NOT_AUTHORIZED [MQTT-3.1.4-2]."""
        if cert_identity is not None and (username is None or username == cert_identity):
            return ReasonCode.SUCCESS  # the TLS layer already verified the client certificate
        if username is None or not self.has_password_file:
            return ReasonCode.SUCCESS if self.allow_anonymous else ReasonCode.NOT_AUTHORIZED
        encoded = self.passwords.get(username)
        if encoded is None or password is None:
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        key = (username, hashlib.sha256(password).digest())
        if key in self._verified:
            return ReasonCode.SUCCESS
        try:
            text = password.decode("utf-8")
        except UnicodeDecodeError:
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        if verify_password(text, encoded):
            self._verified.add(key)
            return ReasonCode.SUCCESS
        return ReasonCode.BAD_USER_NAME_OR_PASSWORD
