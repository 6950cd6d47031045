"""Which facts of the embedded fact base does a model know? By relation, top-1, plain completion.

    python analyses/known_facts.py --model smollm2-135m [--chat] [--quick]

A fact is *known* when the model's top-1 next token after its first training prompt (BOS + "The
capital of France is") is the first token of the object (" Paris") — the rule ``average_trace``
and the CounterFact evaluation use. Also measured per relation: top-1 accuracy on the relation's
held-out paraphrases, and (``--chat``) on the instruct chat template: the prompt is the user's
turn ("Complete the sentence: …") and the assistant's reply is begun with the prompt itself, so
the next token is again the object's first token.

Writes ``known_facts_<model>.json`` (per-relation counts and the list of known facts, which the other
real-model analyses reuse through :func:`known_facts`) and ``known_facts_<model>.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.tokens import target_ids
from gpt2_interp.core.progress import progress_bar
from gpt2_interp.facts.base import Fact, FactBase

RESULTS = Path(__file__).resolve().parent / "results"
#: SmolLM2-Instruct's chat template (its GGUF's tokenizer.chat_template, system turn included).
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nComplete the sentence: {prompt}<|im_end|>\n<|im_start|>assistant\n{prompt}")


@torch.inference_mode()
def top1(model, texts: Sequence[str], prepend_bos: bool = True, batch_size: int = 64, desc: str = "") -> list[int]:
    """The model's top-1 next-token id after each text (batched, left-padded)."""
    out: list[int] = []
    for s in progress_bar(range(0, len(texts), batch_size), desc=desc or "top-1", enabled=bool(desc)):
        tokens, mask = model.tokenize(list(texts[s : s + batch_size]), prepend_bos=prepend_bos)
        out += model.last_logits(tokens, attention_mask=mask).argmax(-1).tolist()
    return out


@torch.inference_mode()
def whole_object(model, prompts: Sequence[str], targets: Sequence[str], batch_size: int = 64) -> list[bool]:
    """Whether greedy decoding after each prompt produces every token of its target (teacher-forced:
    each target token is the top-1 after the prompt and the target tokens before it)."""
    out: list[bool] = []
    for s in range(0, len(prompts), batch_size):
        ids = [target_ids(model, t) for t in targets[s : s + batch_size]]
        rows = [model.to_tokens(p)[0].tolist() + i for p, i in zip(prompts[s : s + batch_size], ids)]
        tokens, mask = model.pad(rows)
        pred = model(tokens, attention_mask=mask).argmax(-1)  # [batch, pos]
        w = tokens.shape[1]
        out += [pred[j, w - len(i) - 1 : w - 1].tolist() == i for j, i in enumerate(ids)]
    return out


def informative(model, target: str) -> bool:
    """Whether the target's first token holds more than whitespace. SmolLM2 splits digits, so " 89"
    is [" ", "8", "9"]: its first token says nothing about the fact, and a top-1 match on it is no
    evidence that the model knows the number."""
    return bool(model.tokenizer.decode(target_ids(model, target)[:1]).strip())


def known_facts(model, fb: FactBase | None = None, facts: Sequence[Fact] | None = None,
                batch_size: int = 64) -> list[Fact]:
    """The facts (default: all of the fact base) whose first training prompt the model completes
    top-1 with the object's first token — ``average_trace``'s and the CounterFact evaluation's rule —
    leaving out objects whose first token is only whitespace (see :func:`informative`)."""
    fb = fb or FactBase.load()
    facts = [f for f in (fb.facts() if facts is None else facts) if informative(model, f.target)]
    hits = top1(model, [fb.prompts(f)[0] for f in facts], batch_size=batch_size)
    return [f for f, t in zip(facts, hits) if t == target_ids(model, f.target)[0]]


def known_facts_saved(model, fb: FactBase | None = None, results: Path = RESULTS) -> list[Fact]:
    """:func:`known_facts` as saved by this script for ``model`` (``known_facts_<model>.json``, full run),
    or computed now when there is no such file. Same rule, no recomputation in every analysis."""
    fb = fb or FactBase.load()
    path = results / f"known_facts_{model.cfg.name}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if not saved.get("quick"):
            facts = {(f.relation, f.subject, f.object): f for f in fb.facts()}
            return [facts[tuple(x)] for x in saved["known_facts"] if tuple(x) in facts]
    return known_facts(model, fb)


def measure(model, fb: FactBase, per_relation: int | None, chat: bool, batch_size: int = 64,
            chat_per_relation: int | None = None) -> dict:
    """Per relation: facts, known (first train prompt), held-out paraphrase accuracy, and the known rule
    under the chat template, both on the first ``chat_per_relation`` facts of each relation (all: None)."""
    facts = [f for r in fb.relations for f in fb.facts(r)[:per_relation]]
    first = [target_ids(model, f.target)[0] for f in facts]
    plain = top1(model, [fb.prompts(f)[0] for f in facts], batch_size=batch_size, desc="plain prompts")
    whole = whole_object(model, [fb.prompts(f)[0] for f in facts], [f.target for f in facts], batch_size)
    useful = [informative(model, f.target) for f in facts]
    sub = [i for r in fb.relations for i in [j for j, f in enumerate(facts) if f.relation == r][:chat_per_relation]]
    held = [(i, p) for i in sub for p in fb.prompts(facts[i], "heldout")]
    held_top = top1(model, [p for _, p in held], batch_size=batch_size, desc="held-out paraphrases")
    chat_idx = sub
    chat_top = dict(zip(chat_idx, top1(model, [CHAT.format(prompt=fb.prompts(facts[i])[0]) for i in chat_idx],
                                       prepend_bos=False, batch_size=batch_size, desc="chat template"))) if chat else {}
    rel: dict[str, dict] = {}
    for i, f in enumerate(facts):
        d = rel.setdefault(f.relation, {"facts": 0, "known": 0, "whole_object": 0, "blank_first_token": 0,
                                        "heldout_prompts": 0, "heldout_hits": 0,
                                        "chat_facts": 0, "chat_known": 0, "chat_known_plain": 0,
                                        "examples_known": [], "examples_missed": []})
        d["facts"] += 1
        hit = plain[i] == first[i] and useful[i]
        d["known"] += hit
        d["whole_object"] += whole[i]
        d["blank_first_token"] += not useful[i]
        ex = d["examples_known" if hit else "examples_missed"]
        if len(ex) < 3:
            ex.append(f"{fb.prompts(f)[0]} →{f.target}" + ("" if hit else f" (model: {model.to_string([plain[i]])!r})"))
        if i in chat_top:
            d["chat_facts"] += 1
            d["chat_known"] += chat_top[i] == first[i] and useful[i]
            d["chat_known_plain"] += hit
    for (i, _), t in zip(held, held_top):
        d = rel[facts[i].relation]
        d["heldout_prompts"] += 1
        d["heldout_hits"] += t == first[i] and useful[i]
    total = {k: sum(d[k] for d in rel.values())
             for k in ("facts", "known", "whole_object", "blank_first_token", "heldout_prompts", "heldout_hits")}
    for k in ("chat_facts", "chat_known", "chat_known_plain"):
        total[k] = sum(d[k] for d in rel.values())
    known = [f for f, t, w, u in zip(facts, plain, first, useful) if t == w and u]
    return {"per_relation": rel, "total": total,
            "known_facts": [[f.relation, f.subject, f.object] for f in known]}


def markdown(res: dict) -> str:
    chat = res["chat"]
    lines = [f"# Facts of the fact base that {res['model']} knows", "",
             f"`{res['command']}` ({res['seconds']} s)", "",
             "Known = top-1 next token after BOS + the relation's first training prompt is the object's first token, "
             "when that token is more than whitespace (the model splits digits: \" 89\" is [\" \", \"8\", \"9\"], so "
             "atomic numbers can only count under *whole object*). Whole object = greedy decoding produces every token "
             "of the object. Held-out = the known rule over the relation's held-out paraphrases (of the facts the chat "
             "column uses)" +
             (". Chat = the known rule under the instruct chat template (the prompt as the user's turn and as the start of the "
              "reply) on the first facts of each relation, beside the plain known rule on the same facts." if chat else "."),
             "", "| relation | facts | known (plain) | whole object (plain) | held-out paraphrases |"
             + (" chat template (plain on the same facts) |" if chat else ""), "|---|---:|---:|---:|---:|" + ("---:|" if chat else "")]
    rows = list(res["per_relation"].items()) + [("**all**", res["total"])]
    for r, d in rows:
        pc = lambda a, b: f"{a}/{b} ({100 * a / max(b, 1):.0f}%)"  # noqa: E731
        lines.append(f"| {r} | {d['facts']} | {pc(d['known'], d['facts'])} | {pc(d['whole_object'], d['facts'])} | "
                     f"{pc(d['heldout_hits'], d['heldout_prompts'])} |"
                     + (f" {pc(d['chat_known'], d['chat_facts'])} ({d['chat_known_plain']}) |" if chat else ""))
    lines += ["", "Examples (known / missed):", ""]
    for r, d in res["per_relation"].items():
        lines.append(f"- {r}: " + "; ".join(d["examples_known"][:2] + d["examples_missed"][:2]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--chat", action="store_true", help="also measure with the instruct chat template")
    p.add_argument("--chat-per-relation", type=int, default=None, help="facts per relation for the held-out paraphrases and the chat template (default: all)")
    p.add_argument("--quick", action="store_true", help="8 facts per relation (for the test suite)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    model = gi.load(a.model)
    fb = FactBase.load()
    res: dict = {"model": a.model, "chat": a.chat, "quick": a.quick,
                 "command": "python analyses/known_facts.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    res |= measure(model, fb, 8 if a.quick else None, a.chat, a.batch_size, a.chat_per_relation)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"known_facts_{a.model}" + ("_quick" if a.quick else "")
    (a.out_dir / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    (a.out_dir / f"{stem}.md").write_text(markdown(res))
    print(markdown(res))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
