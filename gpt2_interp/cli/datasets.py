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
Degenerate pairs — clean equal to corrupted, answer equal to wrong under a logit difference, or
clean and corrupted runs that give the same metric — are refused when every pair is one (the
sweep would be all zeros) and otherwise named, with their lines, in a warning
(:func:`degenerate_pairs`, :func:`check_degenerate`).
"""

from __future__ import annotations

import json
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_FIELDS = ("prompt", "subject", "target")
PAIR_FIELDS = ("clean", "corrupted", "answer")


def _facts_count(spec: str) -> int | bool | None:
    """``facts`` → None (all), ``facts:N`` → N; anything else → False (a file)."""
    if spec == "facts":
        return None
    if spec.startswith("facts:"):
        text = spec[len("facts:") :]
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"--dataset {spec!r}: write facts:N with N a positive integer, e.g. facts:200")
        return int(text)
    return False


def read_jsonl(spec: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """The objects of a JSON Lines file, each checked to have the string ``fields`` (and maybe the
    ``optional`` ones); errors name the file and the line."""
    return [row for _, row in read_jsonl_lines(spec, fields, optional)]


def read_jsonl_lines(
    spec: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()
) -> list[tuple[int, dict[str, str]]]:
    """:func:`read_jsonl`'s objects with the file line number (from 1) of each."""
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--dataset {spec}: no such file (give a JSON Lines file, or facts / facts:N)")
    rows: list[tuple[int, dict[str, str]]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"--dataset {spec} is not UTF-8 text ({e.reason} at byte {e.start}); give a JSON Lines file"
        ) from None
    want = ", ".join(f'"{f}"' for f in fields)
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{spec} line {n} is not JSON ({e.msg}); each line must be one object with {want}"
            ) from None
        if not isinstance(obj, dict):
            raise ValueError(f"{spec} line {n} is a JSON {type(obj).__name__}, not an object with {want}")
        missing = [f for f in fields if f not in obj]
        if missing:
            raise ValueError(f"{spec} line {n} lacks {', '.join(repr(m) for m in missing)}; each line needs {want}")
        bad = [f for f in (*fields, *optional) if f in obj and not (isinstance(obj[f], str) and obj[f])]
        if bad:
            raise ValueError(f"{spec} line {n}: {', '.join(repr(b) for b in bad)} must be non-empty strings")
        rows.append((n, {f: obj[f] for f in (*fields, *optional) if f in obj}))
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
            raise ValueError(
                f"--dataset {spec}: case {i + 1}'s subject {r['subject']!r} is not in its prompt {r['prompt']!r}"
            )
    return [(r["prompt"], r["subject"], r["target"]) for r in rows]


@dataclass
class PairSet:
    """Prompt pairs of a ``patch --dataset`` argument; ``wrong`` None when the set has no wrong answers;
    ``lines``: each pair's line in the file (None for the fact base)."""

    clean: list[str]
    corrupted: list[str]
    answer: list[Any]
    wrong: list[Any] | None
    lines: list[int] | None = None

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
    numbered = read_jsonl_lines(spec, PAIR_FIELDS, optional=("wrong",))
    rows = [r for _, r in numbered]
    with_wrong = sum("wrong" in r for r in rows)
    if 0 < with_wrong < len(rows):
        first = next(i for i, r in enumerate(rows) if ("wrong" in r) != ("wrong" in rows[0]))
        raise ValueError(
            f'--dataset {spec}: {with_wrong} of {len(rows)} pairs have a "wrong" answer (pair {first + 1} '
            "differs from pair 1); give it on every line (logit difference) or on none (probability)"
        )
    return PairSet(
        [r["clean"] for r in rows],
        [r["corrupted"] for r in rows],
        [r["answer"] for r in rows],
        [r["wrong"] for r in rows] if with_wrong else None,
        [n for n, _ in numbered],
    )


def degenerate_pairs(pairs: PairSet, answers_matter: bool) -> dict[int, str]:
    """Pairs whose clean–corrupted difference is 0 whatever the model: pair index → why (clean equals
    corrupted; with ``answers_matter``, a logit difference, answer equals wrong)."""
    bad = {}
    for i, (clean, corrupted) in enumerate(zip(pairs.clean, pairs.corrupted)):
        if clean == corrupted:
            bad[i] = "clean equals corrupted"
        elif answers_matter and pairs.wrong is not None and pairs.answer[i] == pairs.wrong[i]:
            bad[i] = "answer equals wrong"
    return bad


def _where(pairs: PairSet, idx: list[int], most: int = 8) -> str:
    """``"lines 3, 5, 9"`` (file lines) or ``"pairs 1, 2"`` (the fact base), at most ``most`` listed."""
    nums = [pairs.lines[i] if pairs.lines is not None else i + 1 for i in idx]
    shown = ", ".join(map(str, nums[:most])) + (f", … ({len(nums) - most} more)" if len(nums) > most else "")
    return f"{'line' if pairs.lines is not None else 'pair'}{'s' if len(nums) > 1 else ''} {shown}"


def check_degenerate(pairs: PairSet, spec: str, bad: dict[int, str]) -> None:
    """Pairs whose clean–corrupted difference is 0 by construction or by measurement (``bad``: pair
    index → why): a one-line ValueError naming the file and the lines when every pair is, else a
    warning naming them and their count."""
    if not bad:
        return
    reasons: dict[str, list[int]] = {}
    for i, why in sorted(bad.items()):
        reasons.setdefault(why, []).append(i)
    summary = "; ".join(f"{why} on {_where(pairs, idx)}" for why, idx in reasons.items())
    if len(bad) == len(pairs):
        raise ValueError(
            f"--dataset {spec}: the clean–corrupted difference of the metric is 0 for every pair ({summary}), "
            "so the sweep would be all zeros; give pairs whose answers (or prompts) differ"
        )
    warnings.warn(
        f"--dataset {spec}: {len(bad)} of {len(pairs)} pairs have a clean–corrupted difference of 0 ({summary}); "
        "they only dilute the average",
        stacklevel=2,
    )
