"""Memory as a number: what a device has free now, and the peak bytes of the tensors a block of code creates.

:func:`free_memory` is what the sizing of big jobs reads (CUDA: the driver's free memory; CPU: the
kernel's ``MemAvailable``, capped by a cgroup limit when the process runs in one). :class:`TensorMemory`
counts, on any device, the bytes of every storage the operations inside it create while the storage
is alive — the activation memory of a run, without the weights or the allocator's caching — so a
test can compare an estimate or a claim ("this cache keeps only what was asked for") with a
measurement, also on a CPU, where ``torch.cuda.max_memory_allocated`` has no counterpart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .boundary import boundary

__all__ = ["TensorMemory", "free_memory"]


def _cgroup_free() -> int | None:
    """Bytes the process's cgroup (v2 or v1) may still allocate, or None when it has no limit."""
    for limit, used in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            text = Path(limit).read_text().strip()
            if text == "max" or int(text) >= 1 << 60:
                return None
            return max(0, int(text) - int(Path(used).read_text()))
        except (OSError, ValueError):
            continue
    return None


@boundary
def free_memory(device: torch.device | str = "cpu") -> int:
    """Bytes that ``device`` can still allocate now: CUDA's free memory (``torch.cuda.mem_get_info``),
    else the host's available memory (``MemAvailable`` of ``/proc/meminfo``, capped by the cgroup's
    limit; 4 GiB where neither can be read, e.g. off Linux). A device this machine does not have is refused
    (ValueError naming it and the devices it has)."""
    from .devices import resolve_device

    dev = resolve_device(device)
    assert dev is not None, "a device was given"
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    free: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    cg = _cgroup_free()
    if cg is not None:
        free = cg if free is None else min(free, cg)
    return free if free is not None else 4 << 30


@boundary
class TensorMemory(TorchDispatchMode):
    """Inside ``with TensorMemory() as mem:``, the bytes of the storages that operations create are
    counted while those storages are alive: ``current`` now, ``peak`` the most at any moment
    (views of one storage are counted once; tensors that exist before the block, such as the
    weights, and views of them are not counted). Slows every operation a little: a measuring tool for tests and
    benchmarks, not for production runs."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self._current = 0
        self.peak = 0

    @property
    def current(self) -> int:
        """Bytes of the counted storages alive now."""
        self._expire()
        return self._current

    def _expire(self) -> None:
        dead = [k for k, (ref, _) in self._live.items() if ref.expired()]
        for k in dead:
            self._current -= self._live.pop(k)[1]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._expire()
        # an output sharing an input's storage (a view, an in-place op) allocates nothing
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                s = t.untyped_storage()
                if s._cdata in self._live or s._cdata in inputs:
                    continue
                self._live[s._cdata] = (StorageWeakRef(s), s.nbytes())
                self._current += s.nbytes()
        self.peak = max(self.peak, self._current)
        return out

    def __exit__(self, *exc: Any) -> Any:
        self._expire()
        return super().__exit__(*exc)
