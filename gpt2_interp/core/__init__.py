"""The neutral ground floor: result objects, progress bars, argument checks, devices, non-finite checks,
distributed helpers. Imports nothing of ours; its public names are imported on first use."""

from .lazy import lazy_face

_FACE = {
    "result": ("Result", "to_jsonable"),
    "progress": ("progress_bar",),
    "finite": ("NonFiniteWarning", "require_finite", "is_finite"),
    "checks": ("check_count", "check_index", "check_number", "check_choice", "check_str", "check_prompts"),
    "devices": ("resolve_device", "resolve_dtype", "available_devices"),
    "porting": ("PortingWarning",),
    "memory": ("TensorMemory", "free_memory"),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
