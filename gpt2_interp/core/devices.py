"""Devices and dtypes given as text (``"cuda:1"``, ``"bf16"``): parsed and checked once, with
errors that list what is accepted and say what this machine has."""

from __future__ import annotations

import torch

from .boundary import boundary

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


@boundary
def available_devices() -> list[str]:
    """Devices this machine can run on, e.g. ``['cpu', 'cuda', 'cuda:0', 'cuda:1']``."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


@boundary
def resolve_device(device: torch.device | str | None) -> torch.device | None:
    """``device`` as a ``torch.device`` that exists on this machine (None stays None = the current device).

    Accepts ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device``. An unknown, unsupported
    or absent device (no CUDA, ``N`` beyond the GPU count, no MPS) raises a ValueError naming the
    device, what is accepted and what this machine has; a value of another type raises TypeError."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device must be a string like 'cpu' or 'cuda:0' or a torch.device, got {type(device).__name__}"
        )
    have = ", ".join(available_devices())
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"unknown device {str(device)!r}: use cpu, cuda, cuda:N or mps (this machine has: {have})"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {str(device)!r} is not available: this machine has no CUDA GPU usable by torch "
                f"(available: {have})"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} is not available: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s) (available: {have})"
            )
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"device {str(device)!r} is not available on this machine (available: {have})")
    elif dev.type != "cpu":
        raise ValueError(f"device {str(device)!r} is not supported: use cpu, cuda, cuda:N or mps (available: {have})")
    return dev


@boundary
def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``dtype`` as a floating ``torch.dtype``: a torch dtype or one of ``fp32 bf16 fp16`` (or their long
    names, with or without ``torch.``); None stays None. A non-floating torch dtype or an unknown name
    raises ValueError."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point type (fp32, bf16, fp16), got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise ValueError(f"unknown dtype {dtype!r}: accepted are {', '.join(DTYPES)} or a torch floating dtype")
