"""Many processes with ``torch.distributed``: who am I, my share of the work, put the results back together.

The data loops of the package (key statistics, averaged traces, edit evaluation) call these
helpers and run unchanged in one process. Under ``torchrun`` (or any initialised process group,
or with ``group=``) they shard their items over the ranks and combine the results, so that every
rank returns the single-process answer:

* :func:`shard_indices` — rank ``r`` of ``W`` takes items ``r, r + W, r + 2W, …`` (strided: long
  and short items spread evenly); :func:`gather_in_order` puts per-rank lists back in item order.
* :func:`all_reduce_sum` — sums of tensors (any device: CUDA tensors go through NCCL, or through
  the CPU under gloo).
* :func:`init_from_env` — what ``torchrun`` needs: the process group from its environment
  (``nccl`` with one GPU per local rank when CUDA is there, else ``gloo`` on the CPU) with a
  timeout, so that a rank that dies stops the job with its error instead of leaving the others
  waiting forever (``GPT2_INTERP_DIST_TIMEOUT`` seconds, default 1800).

Only rank 0 should print and write files (:func:`is_main`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
_Number = TypeVar("_Number", int, float)  # all_reduce_number returns the type it is given
ENV_TIMEOUT = "GPT2_INTERP_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800


def is_distributed(group: Any = None) -> bool:
    """True when a process group is initialised and has more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def rank(group: Any = None) -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def world_size(group: Any = None) -> int:
    """Number of ranks (1 without a process group)."""
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def is_main(group: Any = None) -> bool:
    """True on rank 0 (and in a single process): the rank that prints and writes files."""
    return rank(group) == 0


def shard_indices(n: int, group: Any = None) -> range:
    """This rank's item indices out of ``n``: ``rank, rank + W, …`` (all of them in one process)."""
    return range(rank(group), n, world_size(group))


def shard(items: Sequence[T], group: Any = None) -> list[T]:
    """This rank's items (see :func:`shard_indices`)."""
    return [items[i] for i in shard_indices(len(items), group)]


def gather_in_order(local: Sequence[T], n: int, group: Any = None) -> list[T]:
    """Every rank's ``local`` results (one per index of :func:`shard_indices`) as one list in item
    order, on every rank. Objects travel pickled (``all_gather_object``)."""
    if not is_distributed(group):
        return list(local)
    W = world_size(group)
    parts: list[Any] = [None] * W
    dist.all_gather_object(parts, list(local), group=group)
    out: list[Any] = [None] * n
    for r, part in enumerate(parts):
        expected = len(range(r, n, W))
        if len(part) != expected:
            raise RuntimeError(f"rank {r} returned {len(part)} results for its {expected} items")
        out[r::W] = part
    return out


def _backend_device(group: Any) -> torch.device | None:
    """Where a collective's tensors must live: CPU under gloo, None (as given) otherwise."""
    return torch.device("cpu") if dist.get_backend(group) == "gloo" else None


def all_reduce_sum(t: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The sum of ``t`` over the ranks (a new tensor on ``t``'s device; ``t`` itself in one process)."""
    if not is_distributed(group):
        return t
    where = _backend_device(group) or t.device
    x = t.detach().to(where, copy=True)
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    return x.to(t.device)


def all_reduce_number(x: _Number, group: Any = None, op: str = "sum") -> _Number:
    """A Python number reduced over the ranks: ``op`` is ``sum``, ``min`` or ``max``."""
    if not is_distributed(group):
        return x
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    if op not in ops:
        raise ValueError(f"op must be one of {sorted(ops)}, not {op!r}")
    dev = _backend_device(group) or (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    )
    t = torch.tensor([x], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=ops[op], group=group)
    v = float(t.item())
    return int(v) if isinstance(x, int) else v


def barrier(group: Any = None) -> None:
    if is_distributed(group):
        dist.barrier(group=group)


def timeout() -> timedelta:
    """The collective timeout: ``$GPT2_INTERP_DIST_TIMEOUT`` seconds, default 1800 (a value that is
    not a finite number of seconds > 0 raises a ValueError naming the variable)."""
    return timedelta(seconds=_timeout_seconds(os.environ))


def _timeout_seconds(env: Mapping[str, str]) -> float:
    text = env.get(ENV_TIMEOUT)
    if text is None:
        return float(DEFAULT_TIMEOUT_S)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{ENV_TIMEOUT}={text!r} must be a finite number of seconds > 0 (default {DEFAULT_TIMEOUT_S})")
    return value


LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env_int(env: Mapping[str, str], name: str, minimum: int) -> int:
    text = env[name]
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} must be an integer ≥ {minimum}") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be ≥ {minimum}")
    return value


def check_launch_env(env: Mapping[str, str] | None = None) -> None:
    """Check a ``torchrun``-style launch environment before any process group is made, so that a value
    wrong on its face is reported at once (a ValueError naming the variable) rather than as a
    traceback or a rendezvous timeout: ``RANK``/``WORLD_SIZE`` need ``MASTER_ADDR``/``MASTER_PORT``;
    ``0 ≤ RANK < WORLD_SIZE``; ``0 ≤ LOCAL_RANK < LOCAL_WORLD_SIZE`` (when set); a port 1–65535; a
    host name without spaces; ``GPT2_INTERP_DIST_TIMEOUT`` a number of seconds > 0. Nothing is
    checked without ``RANK``/``WORLD_SIZE`` (one process) except the timeout."""
    env = os.environ if env is None else env
    _timeout_seconds(env)
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return
    missing = [k for k in LAUNCH_VARS if not env.get(k, "").strip()]
    if missing:
        raise ValueError(
            f"the launch environment sets {' and '.join(k for k in ('RANK', 'WORLD_SIZE') if k in env)} "
            f"but not {', '.join(missing)}; launch with torchrun (which sets all of "
            f"{', '.join(LAUNCH_VARS)}) or unset them for one process"
        )
    world = _env_int(env, "WORLD_SIZE", 1)
    rank_ = _env_int(env, "RANK", 0)
    if rank_ >= world:
        raise ValueError(f"RANK={rank_} must be below WORLD_SIZE={world} (ranks are 0..{world - 1})")
    if "LOCAL_RANK" in env:
        local = _env_int(env, "LOCAL_RANK", 0)
        local_world = _env_int(env, "LOCAL_WORLD_SIZE", 1) if "LOCAL_WORLD_SIZE" in env else world
        if local >= local_world:
            raise ValueError(f"LOCAL_RANK={local} must be below LOCAL_WORLD_SIZE={local_world}")
    port = _env_int(env, "MASTER_PORT", 1)
    if port > 65535:
        raise ValueError(f"MASTER_PORT={port} must be a port number 1..65535")
    if any(c.isspace() for c in env["MASTER_ADDR"].strip()):
        raise ValueError(f"MASTER_ADDR={env['MASTER_ADDR']!r} must be a host name or address (no spaces)")


def launched_by_torchrun() -> bool:
    """True when the environment names a rank and a world (torchrun, or a manual launch)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def local_device() -> torch.device:
    """``cuda:LOCAL_RANK`` when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def init_from_env(backend: str | None = None) -> bool:
    """Initialise the default process group from torchrun's environment, once. ``backend``: None
    picks ``nccl`` when CUDA is available (and pins this process to ``cuda:LOCAL_RANK``), else ``gloo``.
    Returns True when a multi-process group is (now) initialised."""
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return is_distributed()
    check_launch_env()
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) < 2:
        return False
    dev = local_device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend or ("nccl" if dev.type == "cuda" else "gloo"), timeout=timeout())
    return True


def shutdown() -> None:
    """Destroy the default process group if this process made one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


__all__ = [
    "all_reduce_number",
    "all_reduce_sum",
    "barrier",
    "check_launch_env",
    "gather_in_order",
    "init_from_env",
    "is_distributed",
    "is_main",
    "launched_by_torchrun",
    "local_device",
    "rank",
    "shard",
    "shard_indices",
    "shutdown",
    "timeout",
    "world_size",
]
