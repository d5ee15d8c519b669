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


def overlay(base_list: str, root: str) -> list[str]:
    """The list of BASE plus the entries under ROOT (a tree holding only additions to the base, and their parents).

    A directory of ROOT that is in the base keeps its base line unless it gained an entry, then it takes ROOT's mtime,
    as it would in the full tree; any other entry of ROOT that the base has must be identical.
    """
    with open(base_list, encoding="utf-8", errors="surrogateescape") as f:
        merged = dict(line.rstrip("\n").split("\t", 1) for line in f if line.strip())
    tree = dict(entries(root))
    added = {rel: desc for rel, desc in tree.items() if rel not in merged}
    gained = {os.path.dirname(rel) or "." for rel in added}
    for rel, desc in tree.items():
        if rel in added:
            merged[rel] = desc
        elif desc.split(" ", 1)[0] == "40000" and merged[rel].split(" ", 1)[0] == "40000":
            if rel in gained:  # only its mtime changes (kind, mode, owner, "", so split() keeps five fields)
                fields = merged[rel].split(" ")
                fields[3] = desc.split(" ")[3]
                merged[rel] = " ".join(fields)
        elif merged[rel] != desc:
            raise SystemExit(f"treehash: {rel} differs from the base ({merged[rel]!r} -> {desc!r})")
    return sorted(f"{rel}\t{desc}" for rel, desc in merged.items())


def main(argv: list[str]) -> int:
    """treehash.py DIR [LISTFILE] | --over BASE_LIST DIR LISTFILE: print the tree hash; write the per-entry list."""
    if len(argv) == 5 and argv[1] == "--over":
        lines = overlay(argv[2], argv[3])
        listfile: str | None = argv[4]
    elif len(argv) in (2, 3) and not argv[1].startswith("-"):
        lines = sorted(f"{rel}\t{desc}" for rel, desc in entries(argv[1]))
        listfile = argv[2] if len(argv) == 3 else None
    else:
        print("usage: treehash.py DIR [LISTFILE] | treehash.py --over BASE_LIST DIR LISTFILE", file=sys.stderr)
        return 2
    total = hashlib.sha256()
    for line in lines:
        total.update(line.encode("utf-8", "surrogateescape") + b"\n")
    if listfile:
        with open(listfile, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write("\n".join(lines) + "\n")
    print(total.hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
