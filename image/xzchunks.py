#!/usr/bin/env python3
"""Compress a disk image to one .xz stream of fixed-size blocks, reusing cached blocks whose input is unchanged."""

from __future__ import annotations

import argparse
import hashlib
import lzma
import os
import struct
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

MAGIC, FOOTER_MAGIC = b"\xfd7zXZ\x00", b"YZ"
CHECK_CRC64 = 0x04
FLAGS = bytes([0, CHECK_CRC64])


def varint(n: int) -> bytes:
    """xz's multibyte integer: 7 bits per byte, low bits first."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the multibyte integer at pos."""
    value = shift = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            return value, pos


def one_block(stream: bytes) -> tuple[bytes, int, int]:
    """Split a one-block .xz stream into (block bytes incl. padding and check, unpadded size, uncompressed size)."""
    if stream[:6] != MAGIC or stream[6:8] != FLAGS or stream[-2:] != FOOTER_MAGIC:
        raise ValueError("not a CRC64 .xz stream")
    backward = struct.unpack("<I", stream[-8:-4])[0]
    index_start = len(stream) - 12 - (backward + 1) * 4
    index = stream[index_start:-12]
    records, pos = read_varint(index, 1)
    if index[0] != 0 or records != 1:
        raise ValueError(f"expected one block, the index has {records}")
    unpadded, pos = read_varint(index, pos)
    uncompressed, _ = read_varint(index, pos)
    block = stream[12:index_start]
    if len(block) != (unpadded + 3) // 4 * 4:
        raise ValueError("block size does not match the index")
    return block, unpadded, uncompressed


def write_stream(out: BinaryIO, streams: list[Path]) -> None:
    """Write one .xz stream holding the blocks of these one-block streams in order: header, blocks, index, footer."""
    out.write(MAGIC + FLAGS + struct.pack("<I", zlib.crc32(FLAGS)))
    records = []
    for path in streams:  # one block in memory at a time
        block, unpadded, uncompressed = one_block(path.read_bytes())
        out.write(block)
        records.append((unpadded, uncompressed))
    index = bytearray(b"\x00" + varint(len(records)))
    for unpadded, uncompressed in records:
        index += varint(unpadded) + varint(uncompressed)
    index += b"\x00" * (-len(index) % 4)
    index += struct.pack("<I", zlib.crc32(index))
    body = struct.pack("<I", len(index) // 4 - 1) + FLAGS
    out.write(bytes(index) + struct.pack("<I", zlib.crc32(body)) + body + FOOTER_MAGIC)


def chunk_digests(image: Path, size: int) -> tuple[list[str], str]:
    """sha256 of each SIZE-byte chunk of the image, and of the whole image (one read for both)."""
    digests, whole = [], hashlib.sha256()
    with image.open("rb") as f:
        while chunk := f.read(size):
            digests.append(hashlib.sha256(chunk).hexdigest())
            whole.update(chunk)
    return digests, whole.hexdigest()


def compress_chunk(image: Path, index: int, size: int, preset: int, dest: Path) -> None:
    """xz-compress chunk INDEX into the cache file DEST (written under a temporary name, then renamed)."""
    with image.open("rb") as f:
        f.seek(index * size)
        data = f.read(size)
    tmp = dest.with_name(dest.name + f".{os.getpid()}.part")
    tmp.write_bytes(lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=preset))
    tmp.rename(dest)


def main(argv: list[str]) -> int:
    """xzchunks.py IMAGE OUT.xz --cache DIR [--level N] [--chunk-mib N] [--jobs N] [--image-sha256 FILE]."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("image", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--cache", type=Path, required=True, help="compressed blocks by the sha256 of their input")
    p.add_argument("--level", type=int, default=3)
    p.add_argument("--chunk-mib", type=int, default=16)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--image-sha256", type=Path, help="also write the raw image's sha256sum line here")
    args = p.parse_args(argv)
    size = args.chunk_mib << 20
    args.cache.mkdir(parents=True, exist_ok=True)
    digests, whole = chunk_digests(args.image, size)
    if args.image_sha256:
        args.image_sha256.write_text(f"{whole}  {args.image.name}\n")
    paths = [args.cache / f"{d}-{args.chunk_mib}m-{args.level}.xz" for d in digests]
    missing = sorted({path: i for i, path in enumerate(paths) if not path.exists()}.items(), key=lambda kv: kv[1])
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # liblzma runs without the GIL
        list(pool.map(lambda kv: compress_chunk(args.image, kv[1], size, args.level, kv[0]), missing))
    tmp = args.out.with_name(args.out.name + ".part")
    with tmp.open("wb") as f:
        write_stream(f, paths)
    tmp.rename(args.out)
    # Keep the blocks of this image and of the one before it; older ones are dead cache entries.
    used = {path.name for path in paths}
    manifest = args.cache / "last-image.txt"
    previous = set(manifest.read_text().split()) if manifest.exists() else set()
    manifest.write_text("".join(f"{name}\n" for name in sorted(used)))
    for old in args.cache.glob("*.xz"):
        if old.name not in used | previous:
            old.unlink()
    print(f"xz -{args.level}: {len(paths)} blocks of {args.chunk_mib} MiB, {len(paths) - len(missing)} cached, "
          f"{len(missing)} compressed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
