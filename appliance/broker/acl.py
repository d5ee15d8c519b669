"""ACL rules: per user / per client / pattern (%u, %c) topic permissions for read (subscribe) and write (publish)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from appliance.protocol.topics import is_valid_topic_filter

READ, WRITE = 1, 2
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": 0}
_PLACEHOLDER = re.compile("%[uc]")


class AclSyntaxError(ValueError):
    """An ACL file line that cannot be parsed; the message names the line number."""


@dataclass(slots=True)
class _Rule:
    access: int
    pattern: str  # a topic filter, possibly with %u / %c placeholders


@dataclass(slots=True)
class Acl:
    """Parsed ACL. With no rules at all every action is allowed (ACL off)."""

    everyone: list[_Rule] = field(default_factory=list)  # rules before any section, and `pattern` rules
    users: dict[str, list[_Rule]] = field(default_factory=dict)
    clients: dict[str, list[_Rule]] = field(default_factory=dict)
    enabled: bool = False

    @classmethod
    def parse(cls, text: str) -> Acl:
        """Parse `user NAME` / `client ID` sections of `topic ACCESS FILTER` lines and global `pattern` lines."""
        acl = cls(enabled=True)
        section: list[_Rule] = acl.everyone
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            words = line.split(None, 2)
            keyword = words[0]
            if keyword in ("user", "client"):
                if len(words) < 2:
                    raise AclSyntaxError(f"line {number}: expected '{keyword} NAME'")
                name = line.split(None, 1)[1]
                target = acl.users if keyword == "user" else acl.clients
                section = target.setdefault(name, [])
            elif keyword in ("topic", "pattern"):
                if len(words) == 2 and words[1] not in _ACCESS:
                    access, pattern = "readwrite", words[1]
                elif len(words) == 3 and words[1] in _ACCESS:
                    access, pattern = words[1], words[2]
                else:
                    raise AclSyntaxError(f"line {number}: expected '{keyword} [read|write|readwrite|deny] FILTER'")
                if not is_valid_topic_filter(pattern) or pattern.startswith("$share/"):
                    raise AclSyntaxError(f"line {number}: {pattern!r} is not a valid topic filter [MQTT-4.7.1]")
                rule = _Rule(_ACCESS[access], pattern)
                (acl.everyone if keyword == "pattern" else section).append(rule)
            else:
                raise AclSyntaxError(f"line {number}: unknown keyword {keyword!r}")
        return acl

    def _rules(self, username: str | None, client_id: str) -> list[_Rule]:
        rules = list(self.everyone)
        if username is not None:
            rules += self.users.get(username, [])
        rules += self.clients.get(client_id, [])
        return rules

    def allowed(self, access: int, username: str | None, client_id: str, topic: str) -> bool:
        """May this client publish to / subscribe to `topic` (a filter for READ)? A matching deny rule wins."""
        if not self.enabled:
            return True
        granted = False
        for rule in self._rules(username, client_id):
            pattern = rule.pattern
            if "%" in pattern:
                if ("%u" in pattern and username is None) or any(c in (username or "") + client_id for c in "+#/"):
                    continue  # never let an identity widen a pattern
                pattern = _substitute(pattern, username or "", client_id)
            if rule.access == 0:
                if overlaps(pattern, topic):  # a filter touching a denied topic would receive it: refuse it all
                    return False
                continue
            if rule.access & access and covers(pattern, topic):
                granted = True
        return granted


def _substitute(pattern: str, username: str, client_id: str) -> str:
    """Replace %u and %c in one pass, so an id that itself contains %u or %c is never expanded again."""
    return _PLACEHOLDER.sub(lambda m: username if m.group() == "%u" else client_id, pattern)


def overlaps(first: str, second: str) -> bool:
    """True when some topic name is matched by both filters [MQTT-4.7]."""
    a_levels, b_levels = first.split("/"), second.split("/")
    for i in range(max(len(a_levels), len(b_levels))):
        a = a_levels[i] if i < len(a_levels) else None
        b = b_levels[i] if i < len(b_levels) else None
        if a == "#" or b == "#":
            other = b if a == "#" else a
            return not (i == 0 and other is not None and other.startswith("$"))  # [MQTT-4.7.2-1]
        if a is None or b is None:
            return False
        if a == "+" or b == "+":
            if i == 0 and (a.startswith("$") or b.startswith("$")):
                return False
            continue
        if a != b:
            return False
    return True


def covers(pattern: str, topic_filter: str) -> bool:
    """True when every topic matched by `topic_filter` is also matched by `pattern` (a filter)."""
    p_levels = pattern.split("/")
    f_levels = topic_filter.split("/")
    for i, p in enumerate(p_levels):
        if p == "#":
            return not (i == 0 and f_levels[0].startswith("$"))  # [MQTT-4.7.2-1]
        if i >= len(f_levels):
            return False
        f = f_levels[i]
        if p == "+":
            if f == "#" or (i == 0 and f.startswith("$")):
                return False
            continue
        if p != f:
            return False
    return len(p_levels) == len(f_levels)
