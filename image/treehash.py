#!/usr/bin/env python3
"""Print one sha256 over a directory tree's paths, types, modes, owners, mtimes, contents and link targets."""

from __future__ import annotations

import hashlib
import os
import stat
import sys


def entries(root: str):
    """Yield (relative path, description line) for every entry under root, sorted, not crossing mounts."""
    root_dev = os.lstat(root).st_dev
    stack = [""]
    while stack:
        rel = stack.pop()
        path = os.path.join(root, rel) if rel else root
        st = os.lstat(path)
        mode = st.st_mode
        kind = stat.S_IFMT(mode)
        detail = ""
        if stat.S_ISREG(mode):
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            detail = f"{st.st_size} {digest.hexdigest()}"
        elif stat.S_ISLNK(mode):
            detail = os.readlink(path)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            detail = f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
        mtime = "" if stat.S_ISLNK(mode) else str(int(st.st_mtime))
        yield rel or ".", f"{kind:o} {stat.S_IMODE(mode):o} {st.st_uid}:{st.st_gid} {mtime} {detail}"
        if stat.S_ISDIR(mode) and st.st_dev == root_dev:
            for name in sorted(os.listdir(path), reverse=True):
                stack.append(os.path.join(rel, name) if rel else name)


def main(argv: list[str]) -> int:
    """treehash.py DIR [LISTFILE]: print the tree hash; optionally write the per-entry list for diffing builds."""
    if len(argv) not in (2, 3):
        print("usage: treehash.py DIR [LISTFILE]", file=sys.stderr)
        return 2
    lines = sorted(f"{rel}\t{desc}" for rel, desc in entries(argv[1]))
    total = hashlib.sha256()
    for line in lines:
        total.update(line.encode("utf-8", "surrogateescape") + b"\n")
    if len(argv) == 3:
        with open(argv[2], "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write("\n".join(lines) + "\n")
    print(total.hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
