"""A broker node's lifecycle: open the store, recover, listen, run timers, shut down gracefully."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import time
from typing import Any

from appliance import __version__
from appliance.broker.acl import Acl, AclSyntaxError
from appliance.broker.auth import Authenticator
from appliance.broker.broker import Broker
from appliance.broker.passwords import PasswordFormatError
from appliance.broker.ports import EventSink
from appliance.deliverylog.sink import DeliveryLog
from appliance.deliverylog.writer import DeliveryLogError
from appliance.protocol.reason_codes import ReasonCode
from appliance.store import SqliteStore, StoreError

from .client import ClientProtocol
from .cluster_wiring import ClusterWiring
from .config import Config, ConfigError
from .flow import FlowControl
from .listeners import async_start_listeners
from .metrics_http import async_start_metrics
from .sys_topics import publish_sys
from .systemd import Notifier

# Cyclic GC thresholds once running. Each message allocates several tracked objects that live until its PUBACK;
# the default first threshold (700) collected every ~100 messages and cost ~2 us of CPU per QoS1 message (10 %),
# walking in-flight objects that refcounting frees anyway. Cycles are rare here; this keeps them bounded.
GC_THRESHOLDS = (50_000, 20, 100)

log = logging.getLogger("appliance.node")

EXIT_OK, EXIT_CONFIG, EXIT_STORE, EXIT_LISTEN = 0, 2, 3, 4


class NodeError(Exception):
    """A start-up failure with the exit code the CLI returns."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _read_text(path: str, key: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from None


class Node:
    """Owns the event loop's broker, store, listeners and timers for one `appliance run`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.clock = time.time
        self.loop = asyncio.get_running_loop()
        self.connections: set[ClientProtocol] = set()
        self.flow = FlowControl(self.loop, self.connections)  # type: ignore[arg-type]
        self.started = time.monotonic()
        self.exit_code = EXIT_OK
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self.notifier = Notifier.from_env()
        data_dir = config.data_dir
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise NodeError(f"node.data_dir: cannot create {data_dir}: {exc.strerror}", EXIT_CONFIG) from None
        password_file = config.get("auth", "password_file")
        acl_file = config.get("auth", "acl_file")
        try:
            self.authenticator = Authenticator(
                config.get("auth", "allow_anonymous"),
                _read_text(password_file, "auth.password_file") if password_file else None,
            )
            acl = Acl.parse(_read_text(acl_file, "auth.acl_file")) if acl_file else Acl()
        except (PasswordFormatError, AclSyntaxError) as exc:
            raise NodeError(f"{password_file if isinstance(exc, PasswordFormatError) else acl_file}: {exc}",
                            EXIT_CONFIG) from None
        self.delivery_log = self._open_delivery_log()
        events: EventSink | None = self.delivery_log
        self.store = SqliteStore(
            data_dir / "broker.db",
            on_fatal=self._store_failed,
            batch_max=config.get("store", "batch_max"),
            full_integrity_check=config.get("store", "full_integrity_check"),
        )
        self.cluster = self._open_cluster(events)
        broker_store = self.cluster.store if self.cluster is not None else self.store
        self.broker = Broker(config.broker_settings(), broker_store, clock=self.clock, events=events, acl=acl,
                             cluster=self.cluster)
        if self.cluster is not None:
            self.cluster.attach(self.broker)

    def _open_cluster(self, events: EventSink | None) -> ClusterWiring | None:
        """The cluster wiring when [cluster] enabled = true (the secret read from secret_file if given)."""
        section = self.config.values["cluster"]
        if not section["enabled"]:
            return None
        secret = section["secret"]
        if section["secret_file"]:
            secret = _read_text(section["secret_file"], "cluster.secret_file").strip()
            if not secret:
                raise NodeError(f"cluster.secret_file: {section['secret_file']} is empty", EXIT_CONFIG)
        return ClusterWiring(self.config, self.store, events, secret.encode())

    def _open_delivery_log(self) -> DeliveryLog | None:
        """The delivery-log sink when [deliverylog] enabled = true."""
        section = self.config.values["deliverylog"]
        if not section["enabled"]:
            return None
        directory = section["dir"] or str(self.config.data_dir / "deliverylog")
        host = socket.gethostname()
        try:
            return DeliveryLog(
                directory,
                fleet=self.config.get("node", "fleet"),
                device=self.config.get("node", "device") or host,
                node=self.config.node_name,
                firmware=self.config.get("node", "firmware") or f"appliance-{__version__}",
                segment_bytes=section["segment_bytes"],
                segment_age_s=float(section["segment_seconds"]),
                budget_bytes=section["budget_bytes"],
                seq_property=section["seq_property"],
                format=section["format"],
            )
        except (DeliveryLogError, OSError) as exc:
            raise NodeError(f"deliverylog: {exc}", EXIT_CONFIG) from None

    # -- lifecycle -----------------------------------------------------------------------------------------------
    async def async_start(self) -> None:
        """Recover state, then open listeners; READY=1 only once clients can connect."""
        gc.disable()  # recovery allocates every queued message at once: cyclic collections would only slow it
        try:
            try:
                self.store.open()
                snapshot = self.store.load()
            except StoreError as exc:
                raise NodeError(f"store: {exc}", EXIT_STORE) from None
            self.store.start(self.loop)
            self.broker.restore(snapshot)
            if self.cluster is not None:
                try:
                    self.cluster.restore(snapshot)
                except StoreError as exc:
                    raise NodeError(f"store: {exc}", EXIT_STORE) from None
        finally:
            gc.freeze()  # what recovery built lives long: later collections need not walk it (refcounts still free it)
            gc.set_threshold(*GC_THRESHOLDS)
            gc.enable()
        queued = sum(len(q) for q in snapshot.queues.values())
        log.info("recovered %d sessions, %d queued messages, %d retained", len(snapshot.sessions), queued,
                 len(snapshot.retained))
        if self.cluster is not None:
            try:
                await self.cluster.async_start()
            except OSError as exc:
                raise NodeError(f"cluster.bind: {exc.strerror or exc}", EXIT_LISTEN) from None
            await self.cluster.async_settle()
        try:
            self._servers = await async_start_listeners(self.config, self.loop, lambda: ClientProtocol(self))
            metrics_bind = self.config.get("metrics", "http")
            if metrics_bind:
                self._servers.append(await async_start_metrics(self, metrics_bind))
        except OSError as exc:
            raise NodeError(f"listener: {exc.strerror or exc}", EXIT_LISTEN) from None
        self._spawn(self._async_every(1.0, self._tick), "tick")
        sys_interval = self.config.get("metrics", "sys_interval")
        if sys_interval:
            self._spawn(self._async_every(sys_interval, lambda: publish_sys(self)), "sys")
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.stop)
        self.notifier.async_start_watchdog()
        self.notifier.async_start_status(self.status_line)
        if self.delivery_log is not None:
            self.delivery_log.emit("node_start")
        self.notifier.ready(self.status_line())
        log.info("node %s listening: %s", self.config.node_name, ", ".join(self.addresses()))

    def addresses(self) -> list[str]:
        """host:port of every open listener."""
        out = []
        for server in self._servers:
            for sock in getattr(server, "sockets", ()):
                name = sock.getsockname()
                out.append(f"{name[0]}:{name[1]}")
        return out

    def status_line(self) -> str:
        """One line of live figures for systemd's STATUS=."""
        m = self.broker.metrics
        return (f"{self.broker.online} clients, {len(self.broker.sessions)} sessions, "
                f"in {sum(m.messages_in)} out {sum(m.messages_out)} msgs")

    async def async_run_until_stopped(self) -> int:
        """Serve until SIGTERM/SIGINT or a fatal store error; returns the exit code."""
        await self._stop.wait()
        await self.async_shutdown()
        return self.exit_code

    def stop(self) -> None:
        """Request a graceful shutdown."""
        self._stop.set()

    async def async_shutdown(self) -> None:
        """Stop accepting, DISCONNECT 0x8B to v5 clients, commit what is pending, stop the writer."""
        self.notifier.stopping()
        for server in self._servers:
            server.close()
        if self.store.failure is None:
            for conn in list(self.connections):
                conn.pause_reading()  # nothing new is accepted while the last commit completes
            done = self.loop.create_future()
            self.store.after_commit(done.set_result, None)
            await done  # every acknowledgement waiting on a commit has now been queued for its client
            self.broker.shutdown()
        else:
            for conn in list(self.connections):
                conn.close(ReasonCode.SERVER_SHUTTING_DOWN)
        for task in list(self._tasks):
            task.cancel()
        if self.cluster is not None:
            await self.cluster.async_stop()
        if self.store.failure is None:
            await self.store.async_close()
        if self.delivery_log is not None:
            self.delivery_log.emit("node_stop", reason="shutdown" if self.exit_code == EXIT_OK else "failure")
            await self.loop.run_in_executor(None, self.delivery_log.close)
        await self.notifier.async_close()
        log.info("node %s stopped", self.config.node_name)

    def _store_failed(self, exc: StoreError) -> None:
        log.error("store failure, stopping without acknowledging anything further: %s", exc)
        self.exit_code = EXIT_STORE
        for conn in list(self.connections):
            conn.close(ReasonCode.UNSPECIFIED_ERROR)
        self.stop()

    # -- timers --------------------------------------------------------------------------------------------------
    def keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a reference to a task until it ends."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn(self, coro: Any, name: str) -> None:
        task = self.loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _async_every(self, seconds: float, action: Any) -> None:
        while True:
            await asyncio.sleep(seconds)
            action()

    def _tick(self) -> None:
        self.broker.tick()
        self.flow.tick()
        now = self.loop.time()
        for conn in list(self.connections):
            if conn.session is None:
                if now - conn.last_rx > 30:  # no CONNECT within 30 s of opening: close [MQTT-3.1.4-?]
                    conn.close(None)
            elif conn.keepalive and now - conn.last_rx > 1.5 * conn.keepalive:  # [MQTT-3.1.2-22]
                log.info("%s %s: keep alive timeout", conn.peer, conn.session.client_id)
                conn.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
