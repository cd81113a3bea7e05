"""Reading trackers' files back with their own packages (tests only).

W&B's offline run file (``run-<id>.wandb``) is W&B's record log: a 7-byte header
(``:W&B``, magic 0xBEE1, version), then 32 KiB blocks of records, each with a 7-byte
header (crc32, length, type: full, first, middle, last); every record is a
``wandb_internal_pb2.Record``. This reads the history rows out of it.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

__all__ = ["mlflow_metrics", "tensorboard_scalars", "wandb_history"]

_BLOCK = 32768
_HEADER = 7


def _wandb_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:_HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
    pos, pending, out = _HEADER, b"", []
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer: padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
            pending = b""
    return out


def wandb_history(run_file: Path, *, wait_s: float = 30.0) -> list[dict[str, Any]]:
    """The history rows (``run.log`` calls) of a W&B offline run file. W&B's service
    process writes the file after ``finish()`` returns: read it once its ``exit`` record
    is there (at most ``wait_s``)."""
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + wait_s
    while True:
        records = []
        for raw in _wandb_records(run_file):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, f"{run_file}: no exit record after {wait_s} s"
        time.sleep(0.2)
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value)]`` read with TensorBoard's ``EventAccumulator``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_metrics(
    tracking_uri: str, run_id: str, keys: list[str]
) -> dict[str, list[tuple[int, float]]]:
    """``key -> [(step, value)]`` of one run, read with ``MlflowClient``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    return {
        k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys
    }
