"""Prompt sets for the CLI commands that loop over data (``trace --dataset``, ``patch --dataset``).

A dataset argument is either a JSON Lines file (one JSON object per line; blank lines and lines
starting with ``#`` are skipped) or ``facts`` / ``facts:N`` — the fact base (all of it, or ``N``
items drawn at random with ``--seed``).

``trace --dataset``: objects ``{"prompt": …, "subject": …, "target": …}`` (the subject as it
appears in the prompt; the target a string whose first token is scored); ``facts`` gives each
fact's first training template.

``patch --dataset``: objects ``{"clean": …, "corrupted": …, "answer": …, "wrong": …}`` (each pair
with the same token count; ``wrong`` optional, but on every line or on none: with it the metric
is the logit difference, without it the answer's probability); ``facts`` gives subject swaps
(the same template with another subject of the relation, as many tokens, another answer).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_FIELDS = ("prompt", "subject", "target")
PAIR_FIELDS = ("clean", "corrupted", "answer")


def _facts_count(spec: str) -> int | None | bool:
    """``facts`` → None (all), ``facts:N`` → N; anything else → False (a file)."""
    if spec == "facts":
        return None
    if spec.startswith("facts:"):
        text = spec[len("facts:"):]
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"--dataset {spec!r}: write facts:N with N a positive integer, e.g. facts:200")
        return int(text)
    return False


def read_jsonl(spec: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """The objects of a JSON Lines file, each checked to have the string ``fields`` (and maybe the
    ``optional`` ones); errors name the file and the line."""
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--dataset {spec}: no such file (give a JSON Lines file, or facts / facts:N)")
    rows: list[dict[str, str]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"--dataset {spec} is not UTF-8 text ({e.reason} at byte {e.start}); give a JSON Lines file") from None
    want = ", ".join(f'"{f}"' for f in fields)
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{spec} line {n} is not JSON ({e.msg}); each line must be one object with {want}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{spec} line {n} is a JSON {type(obj).__name__}, not an object with {want}")
        missing = [f for f in fields if f not in obj]
        if missing:
            raise ValueError(f"{spec} line {n} lacks {', '.join(repr(m) for m in missing)}; each line needs {want}")
        bad = [f for f in (*fields, *optional) if f in obj and not (isinstance(obj[f], str) and obj[f])]
        if bad:
            raise ValueError(f"{spec} line {n}: {', '.join(repr(b) for b in bad)} must be non-empty strings")
        rows.append({f: obj[f] for f in (*fields, *optional) if f in obj})
    if not rows:
        raise ValueError(f"--dataset {spec} holds no objects; each line must be one object with {want}")
    return rows


def trace_cases(spec: str, seed: int = 0) -> list[tuple[str, str, str]]:
    """``(prompt, subject, target)`` cases of a ``trace --dataset`` argument."""
    n = _facts_count(spec)
    if n is not False:
        from ..facts.base import FactBase

        fb = FactBase.load()
        facts = fb.facts()
        if n is not None and n < len(facts):
            facts = random.Random(seed).sample(facts, n)
        return fb.cases(facts)
    rows = read_jsonl(spec, TRACE_FIELDS)
    for i, r in enumerate(rows):
        if r["subject"] not in r["prompt"]:
            raise ValueError(f"--dataset {spec}: case {i + 1}'s subject {r['subject']!r} is not in its prompt {r['prompt']!r}")
    return [(r["prompt"], r["subject"], r["target"]) for r in rows]


@dataclass
class PairSet:
    """Prompt pairs of a ``patch --dataset`` argument; ``wrong`` None when the set has no wrong answers."""

    clean: list[str]
    corrupted: list[str]
    answer: list[Any]
    wrong: list[Any] | None

    def __len__(self) -> int:
        return len(self.clean)


def patch_pairs(spec: str, tokenizer: Any, seed: int = 0) -> PairSet:
    """The pairs of a ``patch --dataset`` argument (``facts`` pairs need the model's tokenizer)."""
    n = _facts_count(spec)
    if n is not False:
        from ..facts.base import FactBase
        from ..facts.pairs import subject_swaps

        fb = FactBase.load()
        pairs = subject_swaps(fb, tokenizer, n=n or len(fb.facts()), seed=seed)
        if not len(pairs):
            raise ValueError("the fact base gave no subject-swap pairs for this tokenizer; give a JSON Lines file")
        return PairSet(pairs.clean, pairs.corrupted, pairs.answers, pairs.wrongs)
    rows = read_jsonl(spec, PAIR_FIELDS, optional=("wrong",))
    with_wrong = sum("wrong" in r for r in rows)
    if 0 < with_wrong < len(rows):
        first = next(i for i, r in enumerate(rows) if ("wrong" in r) != ("wrong" in rows[0]))
        raise ValueError(f"--dataset {spec}: {with_wrong} of {len(rows)} pairs have a \"wrong\" answer (pair {first + 1} "
                         "differs from pair 1); give it on every line (logit difference) or on none (probability)")
    return PairSet([r["clean"] for r in rows], [r["corrupted"] for r in rows], [r["answer"] for r in rows],
                   [r["wrong"] for r in rows] if with_wrong else None)
