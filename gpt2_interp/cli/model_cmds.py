"""``info`` and ``generate``."""

from __future__ import annotations

import argparse

from . import add_model_args, count, json_lines, load_model, number


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="the model's config, parameter table and hook names")
    add_model_args(p)
    p.add_argument("--json", action="store_true", help="print JSON (config, parameters and every hook name)")
    p.add_argument("--hooks", action="store_true", help="also list every hook name")
    p.set_defaults(func=info)

    p = sub.add_parser("generate", help="continue a prompt (greedy by default)")
    add_model_args(p)
    p.add_argument("prompt", nargs="+", help="one or more prompts (batched)")
    p.add_argument("-n", "--max-new-tokens", type=count(1), default=20)
    p.add_argument("--temperature", type=number(0.0), default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=count(1), default=None)
    p.add_argument("--top-p", type=number(0.0, 1.0, open_min=True), default=None)
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=generate)


def info(args: argparse.Namespace) -> int:
    from ..model.params import parameter_table

    model = load_model(args)
    table = parameter_table(model)
    if args.json:
        print(json_lines({"config": model.cfg.to_dict(), "parameters": table.to_dict(), "hooks": model.hook_names()}))
        return 0
    c = model.cfg
    kv = f" ({c.n_kv} key/value heads)" if c.n_kv != c.n_head else ""
    arch = "" if c.family == "gpt2" else f"; {c.norm}, {c.positional} positions (θ {c.rope_theta:g}), {c.mlp} MLP"
    if c.hf_type is not None:
        arch += f"; family {c.family}"
    print(
        f"{c.name}: {c.n_layer} layers, d_model {c.d_model}, {c.n_head} heads × {c.d_head}{kv}, d_mlp {c.d_mlp}, "
        f"context {c.n_ctx}, vocabulary {c.d_vocab}{arch}; {model.device}, {model.dtype}"
    )
    print(table.table())
    if args.hooks:
        print("\n".join(model.hook_names()))
    return 0


def generate(args: argparse.Namespace) -> int:
    model = load_model(args)
    prompts = args.prompt
    outs = model.generate(
        prompts, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
    )
    for o in outs:
        print(o)
    return 0
