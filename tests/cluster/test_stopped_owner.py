"""An owner stopped (SIGSTOP) past failure_timeout does not answer, once continued, the takeover question its asker
sent on the link it dropped meanwhile (chaos seeds 30657 and 30675).

The real node runs on its own thread's event loop, so that loop can be stopped while the asker's runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import FRESH, SessionClaim, encode_claim
from appliance.cluster.service import ClusterCallbacks, ClusterConfig, ClusterService
from appliance.cluster.wire import ClusterMessage, SessionState, SessionTakeover
from appliance.server.node import Node
from tests.cluster.wired_node import WAIT, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}
TIMEOUT = 1.0  # failure_timeout of both nodes
T = TypeVar("T")


class LoopThread:
    """An event loop on its own thread; `stop_for` blocks it like SIGSTOP."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stopped = threading.Event()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the thread's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def stop_for(self, seconds: float) -> None:
        """Nothing runs on the loop for `seconds` (nothing read, sent or timed)."""
        def block() -> None:
            self.stopped.set()
            time.sleep(seconds)
            self.stopped.clear()
        self.loop.call_soon_threadsafe(block)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


async def _owner(data_dir: Path) -> Node:
    """na owning s with 3 queued messages."""
    na = await start_node(data_dir, "na", ("nb", "nc"), failure_timeout=TIMEOUT)
    deliveries = [Delivery(i, Message(f"m{i}", "t/x", b"x", 1, False, "pub", 1000.0 + i), 1, False)
                  for i in range(1, 4)]
    adopt_session(na.broker, SessionRecord("s", 5, 3600, subscriptions=dict(SUBS)), deliveries, [])
    wiring_of(na).svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
    return na


async def test_a_stopped_owner_does_not_hand_over_to_an_asker_that_gave_up(tmp_path: Path) -> None:
    """na owns s and is stopped 2.5 x failure_timeout. nb asks it for s, then drops the silent link (it fails the
    question and refuses its client, which resumes s on a third node). na, continued, must not let s go to nb: its
    claim for nb, newer than the third node's resume, closed the resumed session (30657: merged behind newer
    messages; 30675: the stale state delivered a completed QoS2 message again). Before the fix na read the question
    from the dead link, released s and resent the hand-over to nb when the link returned."""
    owner_loop = LoopThread()
    na = owner_loop.run(_owner(tmp_path / "na"))
    got: list[ClusterMessage] = []
    cfg = ClusterConfig(node_id="nb", cluster="appliance", secret=b"k", host="127.0.0.1", port=0, mdns=False,
                        heartbeat_interval=0.2, failure_timeout=TIMEOUT, anti_entropy_interval=30.0)
    nb = ClusterService(cfg, ClusterCallbacks(on_session_message=lambda _p, m: got.append(m)))
    wiring = wiring_of(na)
    try:
        await nb.async_start()
        nb.async_add_seed("127.0.0.1", wiring.svc.port)
        await until(lambda: nb.links.is_up("na") and wiring.svc.links.is_up("nb"), "na-nb link")
        owner_loop.stop_for(2.5 * TIMEOUT)
        await until(owner_loop.stopped.is_set, "na stopped")
        assert nb.send("na", SessionTakeover(7, "s", "nb", False))
        await until(lambda: not nb.links.is_up("na"), "nb dropping the silent link")
        await until(lambda: not owner_loop.stopped.is_set(), "na continued")
        await until(lambda: nb.links.is_up("na"), "a new na-nb link")
        nb.send("na", SessionTakeover(8, "nobody", "nb", False))  # answered after anything resent at link-up
        await until(lambda: any(isinstance(m, SessionState) and m.request_id == 8 for m in got), "the probe's answer")
        assert [m for m in got if isinstance(m, SessionState) and m.client_id == "s"] == []
        assert "s" in na.broker.sessions and wiring.claims["s"].owner == "na"
    finally:
        await nb.async_stop()
        owner_loop.run(stop_node(na))
        owner_loop.close()
