"""Rank script: after the process group is up, rank 0 writes every listening TCP socket
of the job (the launcher and all its descendants) to the JSON file given as argument."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist


def _tree(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def _inodes(pids: set[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out[link[8:-1]] = pid
    return out


def _addr(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return f"{'.'.join(str(b) for b in raw[::-1])}:{int(port, 16)}"
    words = [raw[i : i + 4][::-1].hex() for i in range(0, 16, 4)]
    return f"[{''.join(words)}]:{int(port, 16)}"


def listeners(root: int) -> list[dict[str, object]]:
    inodes = _inodes(_tree(root))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                found.append({"pid": inodes[cols[9]], "local": _addr(cols[1])})
    return found


def main() -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 0:
        Path(sys.argv[1]).write_text(json.dumps(listeners(os.getppid())))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
