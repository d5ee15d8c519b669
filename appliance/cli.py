"""The `appliance` command: run a node, manage passwords, inspect the store, upload logs, show defaults."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from appliance.server.config import ConfigError, defaults_toml, load, parse_hostport

log = logging.getLogger("appliance")


def _run(args: argparse.Namespace) -> int:
    from appliance.server.systemd import setup_logging

    setup_logging(args.log_level)
    overrides: dict[str, dict[str, Any]] = {"node": {}, "listener": {}}
    if args.listen:
        parse_hostport(args.listen, "--listen")
        overrides["listener"]["tcp"] = args.listen
    if args.data_dir:
        overrides["node"]["data_dir"] = args.data_dir
    if args.node_name:
        overrides["node"]["name"] = args.node_name
    if args.metrics is not None:
        overrides["metrics"] = {"http": args.metrics}
    config = load(Path(args.config) if args.config else None, overrides)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    return asyncio.run(_async_run(config))


async def _async_run(config: Any) -> int:
    from appliance.server.node import Node, NodeError

    try:
        node = Node(config)
        await node.async_start()
    except NodeError as exc:
        print(f"appliance: {exc}", file=sys.stderr)
        return exc.exit_code
    except ConfigError as exc:
        print(f"appliance: {exc}", file=sys.stderr)
        return 2
    return await node.async_run_until_stopped()


def _passwd(args: argparse.Namespace) -> int:
    from appliance.broker.passwords import (
        PasswordFormatError,
        check_username,
        format_password_file,
        hash_password,
        parse_password_file,
    )

    path = Path(args.file)
    try:
        entries = parse_password_file(path.read_text(encoding="utf-8")) if path.exists() else {}
        if args.delete:
            if entries.pop(args.user, None) is None:
                print(f"appliance passwd: no user {args.user!r} in {path}", file=sys.stderr)
                return 1
        else:
            check_username(args.user)
            if args.password_stdin:
                password = sys.stdin.readline().rstrip("\n")
            else:
                password = getpass.getpass(f"password for {args.user}: ")
                if getpass.getpass("again: ") != password:
                    print("appliance passwd: passwords differ", file=sys.stderr)
                    return 1
            if not password:
                print("appliance passwd: empty password refused", file=sys.stderr)
                return 2
            entries[args.user] = hash_password(password)
    except PasswordFormatError as exc:
        print(f"appliance passwd: {path}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"appliance passwd: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"appliance passwd: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(format_password_file(entries))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        print(f"appliance passwd: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _store(args: argparse.Namespace, rest: list[str]) -> int:
    from appliance.store.inspect import main as inspect_main

    return inspect_main(rest)


def _upload(rest: list[str]) -> int:
    from appliance.deliverylog.upload import main as upload_main

    return upload_main(rest)


def _cluster_show(args: argparse.Namespace) -> int:
    """`appliance cluster show`: the running node's /cluster JSON as a table (or raw with --json)."""
    import json
    import urllib.error
    import urllib.request

    from appliance.cluster.service import render_status

    bind = args.metrics
    if not bind:
        config = load(Path(args.config) if args.config else None)
        bind = config.get("metrics", "http")
    if not bind:
        print("appliance: cluster show needs the node's metrics.http address (--metrics HOST:PORT)", file=sys.stderr)
        return 2
    host, port = parse_hostport(bind, "--metrics")
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/cluster", timeout=5) as response:
            data = json.loads(response.read())
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"appliance: cannot reach the node at {host}:{port}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(render_status(data.get("members", [])))
    if data.get("members"):
        print(f"\nreplication factor {data['replication_factor']}: {data['sessions_owned']} sessions here, "
              f"{data['under_replicated']} under-replicated, {data['replica_copies']} replica copies held, "
              f"{data['acks_waiting']} acks waiting for peers")
    else:
        print("clustering is off on this node")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="appliance", description="Edge MQTT appliance broker node")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a broker node (defaults: 127.0.0.1:1883, ./data)")
    run.add_argument("--config", help="TOML configuration file")
    run.add_argument("--listen", help="MQTT TCP listener HOST:PORT (overrides listener.tcp)")
    run.add_argument("--data-dir", help="data directory (overrides node.data_dir)")
    run.add_argument("--node-name", help="node name (overrides node.name)")
    run.add_argument("--metrics", help="metrics HTTP HOST:PORT, empty to disable (overrides metrics.http)")
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    pw = sub.add_parser("passwd", help="add, change or delete a user in a password file")
    pw.add_argument("file")
    pw.add_argument("user")
    pw.add_argument("--delete", action="store_true")
    pw.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    sub.add_parser("store", help="store tools: `appliance store inspect --data-dir DIR`", add_help=False)
    sub.add_parser("upload", help="upload closed delivery-log segments", add_help=False)
    cl = sub.add_parser("cluster", help="cluster tools: `appliance cluster show`")
    cl.add_argument("what", choices=["show"])
    cl.add_argument("--config", help="the node's TOML configuration (for metrics.http)")
    cl.add_argument("--metrics", help="the node's metrics HTTP HOST:PORT")
    cl.add_argument("--json", action="store_true", help="print the raw JSON")
    cfg = sub.add_parser("config", help="print the documented default configuration")
    cfg.add_argument("what", choices=["defaults"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["store"]:
        return _store(argparse.Namespace(), argv[1:])
    if argv[:1] == ["upload"]:
        return _upload(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "passwd":
            return _passwd(args)
        if args.command == "cluster":
            return _cluster_show(args)
        if args.command == "config":
            sys.stdout.write(defaults_toml())
            return 0
    except ConfigError as exc:
        print(f"appliance: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
