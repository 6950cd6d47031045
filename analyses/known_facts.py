"""Which facts of the fact base does a model know? Per relation: plain completion, whole object, paraphrases, chat.

A fact is *known* by the package's one rule (:mod:`gpt2_interp.analysis.known`): the model's top-1 next
token after BOS + its first training prompt ("The capital of France is") is the object's first token
(" Paris"), and that token is more than whitespace. Also counted per relation:

* *whole object* (:func:`~gpt2_interp.analysis.known.whole_object`): greedy decoding produces every
  token of the object — the only reading under which a number split into digits can count;
* the known rule over the relation's held-out paraphrases (of the first ``chat_per_relation`` facts);
* with ``chat``, the known rule under SmolLM2-Instruct's chat template: the prompt is the user's turn
  ("Complete the sentence: …") and the assistant's reply is begun with the prompt itself, so the next
  token is again the object's first token (beside the plain rule on the same facts).

The data keeps the list of known facts, ``[[relation, subject, object], …]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gpt2_interp.analysis.known import informative, knows, top1_tokens, whole_object
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.base import Fact, FactBase

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2

#: SmolLM2-Instruct's chat template (its GGUF's tokenizer.chat_template, system turn included).
CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nComplete the sentence: {prompt}<|im_end|>\n<|im_start|>assistant\n{prompt}"
)
COUNTS = (
    "facts",
    "known",
    "whole_object",
    "blank_first_token",
    "heldout_prompts",
    "heldout_hits",
    "chat_facts",
    "chat_known",
    "chat_known_plain",
)


@dataclass
class Config(ExperimentConfig):
    per_relation: int | None = field(default=None, metadata={"help": "facts per relation (none: all)"})
    chat: bool = field(default=False, metadata={"help": "also measure under the instruct chat template (SmolLM2's)"})
    chat_per_relation: int | None = field(
        default=None,
        metadata={"help": "facts per relation for the held-out paraphrases and the chat template (none: all)"},
    )
    batch_size: int = field(default=64, metadata={"help": "prompts per forward pass"})

    QUICK: ClassVar[dict[str, Any]] = {"per_relation": 8}


def chat_prompt(prompt: str) -> str:
    """``prompt`` inside SmolLM2-Instruct's chat template, the reply begun with the prompt itself."""
    return CHAT.format(prompt=prompt)


def subset(facts: list[Fact], relations: list[str], per_relation: int | None) -> list[int]:
    """Indices of the first ``per_relation`` facts of each relation (all: None)."""
    return [i for r in relations for i in [j for j, f in enumerate(facts) if f.relation == r][:per_relation]]


def example(fb: FactBase, model: HookedGPT2, fact: Fact, hit: bool, top: int) -> str:
    """``"prompt →target"``, with the model's own top-1 when it missed."""
    return f"{fb.prompts(fact)[0]} →{fact.target}" + ("" if hit else f" (model: {model.to_string([top])!r})")


def relation_rows(
    model: HookedGPT2, fb: FactBase, facts: list[Fact], cfg: Config
) -> tuple[dict[str, dict[str, Any]], list[bool]]:
    """Per relation: the counts of :data:`COUNTS` and up to three examples known and missed; and per
    fact whether the model knows it."""
    first = [fb.prompts(f)[0] for f in facts]
    targets = [f.target for f in facts]
    known = knows(model, first, targets, cfg.batch_size)
    whole = whole_object(model, first, targets, cfg.batch_size)
    useful = [informative(model, t) for t in targets]
    top = top1_tokens(model, first, cfg.batch_size)  # what the model says instead, for the examples
    sub = subset(facts, fb.relations, cfg.chat_per_relation)
    held = [(i, p) for i in sub for p in fb.prompts(facts[i], "heldout")]
    held_hits = knows(model, [p for _, p in held], [targets[i] for i, _ in held], cfg.batch_size)
    chat = (
        dict(
            zip(
                sub,
                knows(
                    model,
                    [chat_prompt(first[i]) for i in sub],
                    [targets[i] for i in sub],
                    cfg.batch_size,
                    prepend_bos=False,
                ),
            )
        )
        if cfg.chat
        else {}
    )
    rel: dict[str, dict[str, Any]] = {}
    for i, f in enumerate(facts):
        d = rel.setdefault(f.relation, {**dict.fromkeys(COUNTS, 0), "examples_known": [], "examples_missed": []})
        d["facts"] += 1
        d["known"] += known[i]
        d["whole_object"] += whole[i]
        d["blank_first_token"] += not useful[i]
        ex = d["examples_known" if known[i] else "examples_missed"]
        if len(ex) < 3:
            ex.append(example(fb, model, f, known[i], top[i]))
        if i in chat:
            d["chat_facts"] += 1
            d["chat_known"] += chat[i]
            d["chat_known_plain"] += known[i]
    for (i, _), hit in zip(held, held_hits):
        rel[facts[i].relation]["heldout_prompts"] += 1
        rel[facts[i].relation]["heldout_hits"] += hit
    return rel, known


def pc(a: int, b: int) -> str:
    """``"a/b (p%)"``."""
    return f"{a}/{b} ({100 * a / max(b, 1):.0f}%)"


def tables(data: dict) -> dict[str, str]:
    chat = data["chat"]
    lines = [
        f"# Facts of the fact base that {data['model']} knows",
        "",
        "Known = top-1 next token after BOS + the relation's first training prompt is the object's first token, "
        'when that token is more than whitespace (the model splits digits: " 89" is [" ", "8", "9"], so '
        "atomic numbers can only count under *whole object*). Whole object = greedy decoding produces every token "
        "of the object. Held-out = the known rule over the relation's held-out paraphrases (of the facts the chat "
        "column uses)"
        + (
            ". Chat = the known rule under the instruct chat template (the prompt as the user's turn and as the "
            "start of the "
            "reply) on the first facts of each relation, beside the plain known rule on the same facts."
            if chat
            else "."
        ),
        "",
        "| relation | facts | known (plain) | whole object (plain) | held-out paraphrases |"
        + (" chat template (plain on the same facts) |" if chat else ""),
        "|---|---:|---:|---:|---:|" + ("---:|" if chat else ""),
    ]
    for r, d in [*data["per_relation"].items(), ("**all**", data["total"])]:
        lines.append(
            f"| {r} | {d['facts']} | {pc(d['known'], d['facts'])} | {pc(d['whole_object'], d['facts'])} | "
            f"{pc(d['heldout_hits'], d['heldout_prompts'])} |"
            + (f" {pc(d['chat_known'], d['chat_facts'])} ({d['chat_known_plain']}) |" if chat else "")
        )
    lines += ["", "Examples (known / missed):", ""]
    for r, d in data["per_relation"].items():
        lines.append(f"- {r}: " + "; ".join(d["examples_known"][:2] + d["examples_missed"][:2]))
    return {"known_facts": "\n".join(lines)}


@register("known_facts", Config, tables=tables)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    fb = FactBase.load()
    facts = [f for r in fb.relations for f in fb.facts(r)[: cfg.per_relation]]
    rel, known = relation_rows(model, fb, facts, cfg)
    return {
        "model": model.cfg.name,
        "chat": cfg.chat,
        "per_relation": rel,
        "total": {k: sum(d[k] for d in rel.values()) for k in COUNTS},
        "known_facts": [[f.relation, f.subject, f.object] for f, k in zip(facts, known) if k],
    }
