"""`appliance upload`: ship closed delivery-log segments to S3-compatible storage or a directory, at least once."""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import json
import os
import random
import signal
import sys
import threading
import time
import tomllib
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

from .segments import PARQUET, closed_segments, fsync_dir, write_synced

_PERMANENT_S3 = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidBucketName"}


class UploadError(Exception):
    """An upload step failed; `permanent` errors are not worth retrying (bad bucket, bad credentials)."""

    def __init__(self, message: str, permanent: bool = False, segment_only: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.segment_only = segment_only  # only this segment is affected: go on with the others


class Target(Protocol):
    """Where segments go; every method raises UploadError on failure."""

    def describe(self) -> str: ...

    def confirmed(self, key: str, size: int, sha256: str) -> bool: ...  # the object exists with this size and hash

    def put(self, key: str, data: bytes, sha256: str) -> None: ...


class DirTarget:
    """A plain directory (a mounted share, or a staging area another tool syncs)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def describe(self) -> str:
        """Human-readable destination."""
        return f"directory {self.root}"

    def confirmed(self, key: str, size: int, sha256: str) -> bool:
        """True if the file at `key` has exactly this size and SHA-256."""
        path = os.path.join(self.root, key)
        try:
            if os.path.getsize(path) != size:
                return False
            with open(path, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest() == sha256
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise UploadError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def put(self, key: str, data: bytes, sha256: str) -> None:
        """Write `data` to `key` atomically and durably."""
        path = os.path.join(self.root, key)
        tmp = path + ".uploading"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_synced(tmp, data)
            os.replace(tmp, path)
            fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise UploadError(f"cannot write {path}: {exc.strerror or exc}") from exc


class S3Target:
    """An S3-compatible bucket; each PUT carries Content-MD5 and the SHA-256 as metadata, checked by HEAD."""

    def __init__(self, cfg: UploadConfig) -> None:
        import boto3  # device extra; only the S3 target needs it
        from botocore.config import Config

        self.bucket = cfg.bucket
        self.endpoint = cfg.endpoint
        session = boto3.session.Session(
            aws_access_key_id=cfg.access_key_id or None,
            aws_secret_access_key=cfg.secret_access_key or None,
            region_name=cfg.region,
        )
        options: dict[str, Any] = {
            "retries": {"total_max_attempts": 1},  # we retry ourselves, with our own backoff
            "connect_timeout": cfg.timeout,
            "read_timeout": cfg.timeout,
            "s3": {"addressing_style": "path"},
            # plain Content-MD5 PUTs, which every S3 clone takes (botocore >= 1.36 would add CRC trailers)
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        }
        try:
            config = Config(**options)
        except TypeError:  # an older botocore: it sends no trailers anyway
            del options["request_checksum_calculation"], options["response_checksum_validation"]
            config = Config(**options)
        self.client = session.client("s3", endpoint_url=cfg.endpoint or None, config=config)

    def describe(self) -> str:
        """Human-readable destination."""
        return f"s3://{self.bucket} at {self.endpoint or 'the default endpoint'}"

    def _error(self, action: str, key: str, exc: Exception) -> UploadError:
        """One-line UploadError for a botocore failure."""
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        text = f"{action} s3://{self.bucket}/{key} failed: {code + ' ' if code else ''}{exc}".replace("\n", " ")
        return UploadError(text, permanent=code in _PERMANENT_S3)

    def confirmed(self, key: str, size: int, sha256: str) -> bool:
        """True if HEAD shows the object with this size and SHA-256 metadata."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._error("HEAD", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("HEAD", key, exc) from exc
        return bool(head.get("ContentLength") == size and head.get("Metadata", {}).get("sha256") == sha256)

    def put(self, key: str, data: bytes, sha256: str) -> None:
        """PUT the object; the server rejects it if the body does not match Content-MD5."""
        from botocore.exceptions import BotoCoreError, ClientError

        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentMD5=md5, ContentType=_content_type(key),
                Metadata={"sha256": sha256},
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error("PUT", key, exc) from exc


def _content_type(key: str) -> str:
    """MIME type of a segment object."""
    return "application/vnd.apache.parquet" if key.endswith(PARQUET) else "application/gzip"


@dataclass(slots=True)
class UploadConfig:
    """The [upload] section, after flags override it."""

    log_dir: str = "/var/lib/appliance/deliverylog"
    endpoint: str = ""
    bucket: str = ""
    prefix: str = ""
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = ""
    dest_dir: str = ""
    interval: float = 300.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    timeout: float = 10.0
    keep: bool = False  # keep local segments after a confirmed upload


@dataclass(slots=True)
class Totals:
    """What one pass did."""

    uploaded: int = 0
    already: int = 0  # found in place (an earlier run crashed between upload and delete)
    bytes: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


def first_record(path: str) -> dict[str, Any]:
    """The first record of a segment (gzip: its first JSON line, decompressing only as much as needed)."""
    if path.endswith(PARQUET):
        from .columnar import parquet_first_record

        return parquet_first_record(path)
    decomp = zlib.decompressobj(31)
    buf = b""
    with open(path, "rb") as f:
        while b"\n" not in buf:
            chunk = f.read(4096)
            if not chunk:
                break
            buf += decomp.decompress(chunk)
    line = buf.split(b"\n", 1)[0]
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("first line is not a JSON object")
    return record


def _part(value: str) -> str:
    """One Hive partition value, safe as a key component."""
    return quote(value, safe="-_.~@")


def object_key(prefix: str, segment_name: str, record: dict[str, Any]) -> str:
    """prefix/fleet=<f>/date=<YYYY-MM-DD>/device=<d>/<segment>: derived from the segment alone, so always the same."""
    day = datetime.fromtimestamp(int(record["ts_wall_us"]) / 1e6, UTC).strftime("%Y-%m-%d")
    key = f"fleet={_part(str(record['fleet']))}/date={day}/device={_part(str(record['device']))}/{segment_name}"
    prefix = prefix.strip("/")
    return f"{prefix}/{key}" if prefix else key


class Uploader:
    """One pass over the closed segments, oldest first, each retried with exponential backoff."""

    def __init__(self, cfg: UploadConfig, target: Target, out: Any = None) -> None:
        self.cfg = cfg
        self.target = target
        self.out = out if out is not None else sys.stdout
        self.stopping = False

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early when asked to stop."""
        deadline = time.monotonic() + seconds
        while not self.stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.2, left))

    def _attempt(self, what: str, fn: Any, *args: Any) -> Any:
        """Call fn(*args), retrying UploadErrors that are not permanent with capped, jittered exponential backoff."""
        attempt = 1
        while True:
            try:
                return fn(*args)
            except UploadError as exc:
                if exc.permanent or attempt >= self.cfg.max_attempts or self.stopping:
                    raise
                delay = min(self.cfg.backoff_max, self.cfg.backoff_base * 2 ** (attempt - 1)) * random.uniform(0.5, 1)
                print(f"retry {attempt}/{self.cfg.max_attempts - 1} of {what} in {delay:.1f}s: {exc}", file=self.out)
                self.sleep(delay)
                attempt += 1

    def ship(self, name: str, totals: Totals) -> None:
        """Upload one segment unless already confirmed in place, confirm it, then delete it locally."""
        path = os.path.join(self.cfg.log_dir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
            key = object_key(self.cfg.prefix, name, first_record(path))
        except FileNotFoundError:
            return  # evicted by the writer's disk budget meanwhile (it recorded that)
        except (OSError, ValueError, KeyError, zlib.error) as exc:
            try:  # set it aside (kept for inspection) so later runs do not trip over it again
                os.rename(path, path + ".bad")
            except OSError:
                pass
            raise UploadError(f"unreadable segment {name} (kept as {name}.bad): {exc}", permanent=True,
                              segment_only=True) from exc
        sha = hashlib.sha256(data).hexdigest()
        if self._attempt(f"HEAD {key}", self.target.confirmed, key, len(data), sha):
            totals.already += 1
            print(f"already uploaded {key}", file=self.out)
        else:
            self._attempt(f"PUT {key}", self.target.put, key, data, sha)
            if not self._attempt(f"HEAD {key}", self.target.confirmed, key, len(data), sha):
                raise UploadError(f"{key}: uploaded object does not match the local segment (size or SHA-256)")
            totals.uploaded += 1
            totals.bytes += len(data)
            print(f"uploaded {key} ({len(data)} B)", file=self.out)
        if not self.cfg.keep:
            try:
                os.unlink(path)
                fsync_dir(self.cfg.log_dir)
            except FileNotFoundError:
                pass

    def run_once(self) -> Totals:
        """Ship every closed segment; stop at the first one that keeps failing (the rest would wait on it too)."""
        totals = Totals()
        for name in closed_segments(self.cfg.log_dir):
            if self.stopping:
                break
            try:
                self.ship(name, totals)
            except UploadError as exc:
                totals.failed += 1
                totals.errors.append(str(exc))
                if not exc.segment_only:
                    break
        remaining = len(closed_segments(self.cfg.log_dir)) if not self.cfg.keep else 0
        print(
            f"upload: {totals.uploaded} uploaded ({totals.bytes} B), {totals.already} already present, "
            f"{totals.failed} failed, {remaining} waiting, to {self.target.describe()}",
            file=self.out,
        )
        return totals


def _parser() -> argparse.ArgumentParser:
    """Flags; each overrides the [upload] key of the same name."""
    p = argparse.ArgumentParser(prog="appliance upload", description=__doc__)
    p.add_argument("--config", help="TOML file with an [upload] section")
    p.add_argument("--log-dir", help="directory of delivery-log segments")
    p.add_argument("--endpoint", help="S3-compatible endpoint URL")
    p.add_argument("--bucket")
    p.add_argument("--prefix", help="key prefix before fleet=/date=/device=")
    p.add_argument("--region")
    p.add_argument("--access-key-id")
    p.add_argument("--secret-access-key")
    p.add_argument("--dest-dir", help="upload to this directory instead of S3")
    p.add_argument("--loop", action="store_true", help="keep running, one pass every --interval seconds")
    p.add_argument("--interval", type=float)
    p.add_argument("--max-attempts", type=int, help="attempts per request before giving up this pass")
    p.add_argument("--backoff-base", type=float, help="first retry delay in seconds (doubles per attempt)")
    p.add_argument("--backoff-max", type=float)
    p.add_argument("--timeout", type=float, help="connect/read timeout in seconds")
    p.add_argument("--keep", action="store_true", default=None, help="keep local segments after upload")
    return p


def _table(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """doc[name] when it is a table, else an empty one."""
    value = doc.get(name)
    return value if isinstance(value, dict) else {}


def load_config(args: argparse.Namespace) -> UploadConfig:
    """UploadConfig from the TOML [upload] section (if any) with flags on top; raises ValueError when invalid."""
    cfg = UploadConfig()
    known = set(UploadConfig.__dataclass_fields__)
    if args.config:
        try:
            with open(args.config, "rb") as f:
                doc = tomllib.load(f)
        except OSError as exc:
            raise ValueError(f"cannot read config {args.config}: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"config {args.config} is not valid TOML: {exc}") from exc
        section = doc.get("upload", {})
        if not isinstance(section, dict):
            raise ValueError(f"config {args.config}: [upload] must be a table")
        if "log_dir" not in section:  # where the broker writes: [deliverylog] dir, else <[node] data_dir>/deliverylog
            broker_dir = _table(doc, "deliverylog").get("dir") or ""
            data_dir = _table(doc, "node").get("data_dir") or ""
            if isinstance(broker_dir, str) and broker_dir:
                section = {**section, "log_dir": broker_dir}
            elif isinstance(data_dir, str) and data_dir:
                section = {**section, "log_dir": os.path.join(data_dir, "deliverylog")}
        for key, value in section.items():
            if key not in known:
                raise ValueError(f"config {args.config}: unknown key upload.{key}")
            want = type(getattr(cfg, key))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ValueError(f"config {args.config}: upload.{key} must be {want.__name__}")
            setattr(cfg, key, value)
    for key in known:
        value = getattr(args, key, None)
        if value is not None:
            setattr(cfg, key, value)
    if not cfg.dest_dir and not cfg.bucket:
        raise ValueError("no destination: set upload.bucket (S3) or upload.dest_dir")
    if cfg.dest_dir and cfg.bucket:
        raise ValueError("choose one destination: upload.bucket or upload.dest_dir, not both")
    if cfg.max_attempts < 1 or cfg.backoff_base < 0 or cfg.backoff_max < 0 or cfg.interval <= 0 or cfg.timeout <= 0:
        raise ValueError("max_attempts must be >= 1; backoff, interval and timeout must be positive")
    if not os.path.isdir(cfg.log_dir):
        raise ValueError(f"log directory {cfg.log_dir} does not exist")
    return cfg


def main(argv: list[str] | None = None) -> int:
    """Run `appliance upload`; 0 when every closed segment is uploaded, 1 on errors, 2 on bad usage."""
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args)
        target: Target = DirTarget(cfg.dest_dir) if cfg.dest_dir else S3Target(cfg)
    except ValueError as exc:
        print(f"appliance upload: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # boto3 missing or a malformed endpoint: one line, not a traceback
        print(f"appliance upload: error: {type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 2
    lock_fd = os.open(os.path.join(cfg.log_dir, ".upload.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"appliance upload: error: another upload is running on {cfg.log_dir}", file=sys.stderr)
        os.close(lock_fd)
        return 1
    uploader = Uploader(cfg, target)

    def stop(signum: int, frame: Any) -> None:
        uploader.stopping = True

    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)} if in_main else {}
    try:
        while True:
            totals = uploader.run_once()
            for err in totals.errors:
                print(f"appliance upload: error: {err}", file=sys.stderr)
            if not args.loop:
                return 1 if totals.failed else 0
            uploader.sleep(cfg.interval)
            if uploader.stopping:
                return 0
    finally:
        os.close(lock_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
