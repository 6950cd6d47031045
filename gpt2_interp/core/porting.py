"""The warning raised where a TransformerLens idiom would silently give another result (see docs/porting.md)."""

from __future__ import annotations


class PortingWarning(UserWarning):
    """A result that would differ from TransformerLens's for the same line of code (see docs/porting.md)."""
