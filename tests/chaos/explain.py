"""Explain a kept run: `python -m tests.chaos.explain tests/chaos/out/failed-...` prints the checker's verdict and, for
the first few error keys, the timeline of that message (sends, acks, deliveries with packet id and DUP) together with
the subscriber's reconnects and the nemesis log around it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .checker import ERRORS, check
from .history import Event, read_history

SHOW = 3


def timeline(events: list[Event], pub: str, seq: int, sub: str) -> list[str]:
    """Every record about message pub#seq, plus `sub`'s connects between its first and last mention."""
    about = [i for i, e in enumerate(events) if (e.get("c") == pub and e.get("seq") == seq)
             or (e.get("pub") == pub and e.get("seq") == seq)]
    if not about:
        return []
    lo, hi = about[0], max(about[-1], about[0])
    t_lo, t_hi = events[lo]["t"] - 0.5, events[hi]["t"] + 3.0
    lines = []
    for i, e in enumerate(events):
        mine = i in about
        conn = e["e"] == "conn" and e["c"] == sub and t_lo <= e["t"] <= t_hi
        if mine or conn:
            fields = {k: v for k, v in e.items() if k not in ("e", "t", "intact")}
            lines.append(f"  {e['t']:8.3f} {e['e']:5} {fields}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the verdict and timelines of one run directory."""
    args = sys.argv[1:] if argv is None else argv
    run = Path(args[0])
    events = list(read_history(run / "clients" / "history.jsonl"))
    result = check(events)
    print(result.line())
    nemesis = run / "nemesis.json"
    if nemesis.exists():
        print("nemesis (seconds since READY):", json.dumps(json.loads(nemesis.read_text())))
    for category in (*ERRORS, "duplicated"):
        keys = sorted(result.keys.get(category, set()))
        if not keys:
            continue
        print(f"\n{category}: {len(keys)}")
        for pub, seq, sub in keys[:SHOW]:
            print(f" {pub}#{seq} -> {sub}")
            print("\n".join(timeline(events, pub, seq, sub)))
    return 0 if result.valid else 1


if __name__ == "__main__":
    sys.exit(main())
