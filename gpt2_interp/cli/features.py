"""``sae train|eval|features``: sparse autoencoders on a hook point."""

from __future__ import annotations

import argparse

from . import DEFAULT_MODEL, add_model_args, add_output_args, count, emit, load_model, number


def _texts_arg(p: argparse.ArgumentParser, default: str = "brown") -> None:
    p.add_argument(
        "--texts",
        default=default,
        help=f"'brown' (the Brown corpus), 'generated' (the model's samples), 'facts' (the fact corpus) or a .txt "
        f"file/folder (default {default})",
    )
    p.add_argument("--context", type=count(2), default=64, help="tokens per window, BOS first (default 64)")
    p.add_argument("--windows", type=count(1), default=256, help="windows to read (default 256)")


def register(sub: argparse._SubParsersAction) -> None:
    from ..analysis.features.sae import ARCHITECTURES

    sae = sub.add_parser("sae", help="sparse autoencoders: train, evaluate, view latents")
    cmds = sae.add_subparsers(dest="sae_command", metavar="SAE_COMMAND", required=True)

    p = cmds.add_parser("train", help="train an SAE on a hook point and save it (SAELens's layout)")
    add_model_args(p)
    p.add_argument("--hook", required=True, help="hook point, e.g. blocks.3.hook_resid_pre")
    p.add_argument("--save", required=True, metavar="DIR", help="folder to write the SAE to")
    p.add_argument(
        "--texts", default="brown", help="'brown', 'generated', 'facts' or a .txt file/folder (default brown)"
    )
    p.add_argument("--context", type=count(2), default=64, help="tokens per window, BOS first (default 64)")
    p.add_argument("--architecture", choices=list(ARCHITECTURES), default="topk")
    p.add_argument("--expansion", type=count(1), default=8, help="latents per input dimension (default 8)")
    p.add_argument("--k", type=count(1), default=32, help="active latents per token, top-k kinds (default 32)")
    p.add_argument("--l1", type=number(0.0), default=5.0, help="L1 coefficient of a relu SAE (default 5)")
    p.add_argument("--tokens", type=count(1), default=2_000_000, help="training tokens (default 2,000,000)")
    p.add_argument("--batch-size", type=count(1), default=4096, help="activations per step (default 4096)")
    p.add_argument("--lr", type=number(0.0, open_min=True), default=None, help="Adam step (default by size)")
    p.add_argument(
        "--epochs", type=count(1), default=1, help="passes over the text (later ones from memory; default 1)"
    )
    p.add_argument("--checkpoint", default=None, metavar="DIR", help="resumable checkpoints here")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=train)

    p = cmds.add_parser("eval", help="L0, variance explained, CE loss recovered, dead/dense latents")
    _sae_model_args(p)
    p.add_argument("sae", metavar="SAE_DIR", help="an SAE folder (ours or SAELens's)")
    _texts_arg(p)
    add_output_args(p, figure=False)
    p.set_defaults(func=evaluate)

    p = cmds.add_parser("features", help="a latent's view, or latents by promoted token or by prompt")
    _sae_model_args(p)
    p.add_argument("sae", metavar="SAE_DIR", help="an SAE folder (ours or SAELens's)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--latent", type=count(0), help="show this latent's view")
    which.add_argument("--token", help="latents that promote this token (e.g. ' Paris')")
    which.add_argument("--prompt", help="latents most active at this prompt's last token")
    p.add_argument("--top", type=count(1), default=10, help="contexts or latents to show (default 10)")
    _texts_arg(p)
    add_output_args(p)
    p.set_defaults(func=features)


def _sae_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``/``--device``/``--dtype`` of a command that reads an SAE file: the model defaults to the one
    the SAE's ``cfg.json`` records (its ``model_name``)."""
    add_model_args(p)
    p.set_defaults(model=None)
    for action in p._actions:
        if action.dest == "model":
            action.help = "model name or path (default: the model the SAE's cfg.json records, else gpt2-facts)"


def load_model_and_sae(args: argparse.Namespace):
    """``(model, sae)`` for ``args.sae``: the model is ``--model`` when given, else the one the SAE was trained on
    (``model_name`` in its ``cfg.json``), else the default; the SAE is then checked against it."""
    from ..analysis.features.sae import SAE

    sae = SAE.load(args.sae)
    recorded = sae.cfg.model_name
    if args.model is None:
        args.model = recorded or DEFAULT_MODEL
        try:
            model = load_model(args)
        except Exception as e:
            if not recorded:
                raise
            raise ValueError(
                f"{args.sae} records the model {recorded!r} (cfg.json), which could not be loaded "
                f"({' '.join(str(e).split())}); give --model"
            ) from e
    else:
        model = load_model(args)
    try:
        sae.check_model(model)
        _check_width(model, sae)
    except ValueError as e:
        trained = f" (it was trained on {recorded}: --model {recorded})" if recorded and recorded != args.model else ""
        raise ValueError(f"{e}{trained}") from None
    return model, sae.to(model.device)


def _check_width(model, sae) -> None:
    """Refuse (ValueError) an SAE whose input width is not the activation width at its hook point (one
    token run as far as the hook)."""
    import torch

    from ..analysis.features.sae_train import run_to_hook

    with torch.no_grad():
        width = run_to_hook(model, model.to_tokens("a")[:, :1], sae.cfg.hook_name)[0, 0].numel()
    if width != sae.cfg.d_in:
        raise ValueError(
            f"{model.cfg.name}'s activations at {sae.cfg.hook_name} have width {width}; this SAE reads {sae.cfg.d_in}"
        )


def train(args: argparse.Namespace) -> int:
    from ..analysis.features.sae_train import SAETrainConfig, text_source, token_windows, train_sae

    model = load_model(args)
    cfg = SAETrainConfig(
        hook_name=args.hook,
        expansion=args.expansion,
        architecture=args.architecture,
        k=args.k,
        l1_coefficient=args.l1,
        tokens=args.tokens,
        batch_size=args.batch_size,
        lr=args.lr,
        context_size=args.context,
        epochs=args.epochs,
        seed=args.seed,
    )
    windows = token_windows(model, text_source(model, args.texts, seed=args.seed), args.context)
    sae, log = train_sae(model, cfg, windows=windows, checkpoint=args.checkpoint)
    path = sae.save(args.save)
    print(
        f"{cfg.architecture} SAE ({sae.cfg.d_sae} latents) at {cfg.hook_name} of {model.cfg.name} saved to {path}: "
        f"{log.steps} steps, {log.tokens} tokens; last training FVU {log.fvu[-1]:.3f}, L0 {log.l0[-1]:.1f}"
    )
    return 0


def _windows(model, args: argparse.Namespace):
    from ..analysis.features.sae_train import text_source, token_windows

    return token_windows(model, text_source(model, args.texts), args.context)[: args.windows]


def evaluate(args: argparse.Namespace) -> int:
    from ..analysis.features.sae_eval import evaluate_sae

    model, sae = load_model_and_sae(args)
    r = evaluate_sae(model, sae, _windows(model, args))
    return emit(args, r, data=r.summary())


def features(args: argparse.Namespace) -> int:
    from ..analysis.features.sae_views import feature_view, latents_firing, latents_promoting

    model, sae = load_model_and_sae(args)
    if args.token is not None:
        return emit(args, latents_promoting(model, sae, args.token, args.top))
    if args.prompt is not None:
        return emit(args, latents_firing(model, sae, args.prompt, args.top))
    return emit(args, feature_view(model, sae, args.latent, _windows(model, args), top=args.top))
