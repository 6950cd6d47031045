"""The line a sweep, trace or attribution writes before it starts: its runs, tokens and forward passes
(counted by hand on the 2-layer ``tiny`` model) and an expected time; silent with ``progress=False``;
no extra run seen by a caller's hooks."""

from __future__ import annotations

import re

from gpt2_interp.analysis.attribution import attribute
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import patch
from gpt2_interp.analysis.tracing import causal_trace, trace_work

CLEAN, CORRUPT = "The capital of France is", "The capital of Italy is"  # 6 tokens with BOS on tiny


def test_patch_states_its_runs_and_expected_time_before_running(tiny, capsys):
    patch(tiny, CLEAN, CORRUPT, logit_diff(" Paris", " Rome"), hook="mlp_out", progress=True)
    err = capsys.readouterr().err
    # 2 layers × 6 positions; row (l, p) runs blocks l… over positions p…: Σ_p (6 − p) = 21 tokens per layer,
    # (2 + 1) · 21 = 63 token-layers = 63 / 12 = 5.25 forward passes of the prompt
    assert re.search(r"patching mlp_out: 12 runs over 42 tokens ≈ 5\.2 forward passes, expected ≈ [\d.]+ (s|min)", err)
    patch(tiny, CLEAN, CORRUPT, logit_diff(" Paris", " Rome"), hook="mlp_out", progress=False)
    assert capsys.readouterr().err == ""


def test_trace_line_counts_the_rows_trace_work_counts(tiny, capsys):
    causal_trace(tiny, "The Eiffel Tower is in Paris", "Eiffel Tower", samples=2, noise=1.0, progress=True)
    err = capsys.readouterr().err
    runs = int(re.search(r"tracing hidden: (\d+) runs", err).group(1))
    w = trace_work(tiny, [("The Eiffel Tower is in Paris", "Eiffel Tower")], "hidden", samples=2)
    toks = tiny.to_str_tokens("The Eiffel Tower is in Paris")
    n_tok, first = len(toks), toks.index(" E")  # the subject's first token
    assert "".join(toks[first : first + 3]) == " Eiffel"
    assert runs == (n_tok - first) * tiny.cfg.n_layer * 2  # cells from the subject on × layers × samples
    assert w.runs == runs + 1 * (2 + 1)  # and the clean run and the 2 noised runs


def test_attribution_states_its_passes_and_the_exact_sweeps(tiny, capsys):
    attribute(tiny, CLEAN, CORRUPT, logit_diff(" Paris", " Rome"), hook="mlp_out", method="atp", progress=True)
    err = capsys.readouterr().err
    assert re.search(r"attribution \(atp\) of mlp_out: 2 runs over 12 tokens ≈ 4\.0 forward passes, expected", err)
    assert "exact patching: ≈ 7.2" in err  # 2 + 5.25


def test_a_callers_hooks_see_no_extra_run(tiny, capsys):
    calls = []
    with tiny.hooks([("hook_embed", lambda act, hook: calls.append(act.shape[0]))]):
        patch(tiny, CLEAN, CORRUPT, logit_diff(" Paris", " Rome"), hook="mlp_out", progress=True)
    assert calls == [1, 1]  # the base and the source run; the patched rows start from cached residuals
    assert "expected ≈" in capsys.readouterr().err


def test_cli_writes_the_line_to_stderr_unless_quiet(capsys):
    from gpt2_interp.cli import main

    argv = [
        "patch",
        "--clean",
        CLEAN,
        "--corrupted",
        CORRUPT,
        "--answer",
        " Paris",
        "--hook",
        "mlp_out",
        "--layers",
        "5",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert re.search(r"patching mlp_out: \d+ runs over \d+ tokens ≈ [\d.]+ forward passes, expected ≈", err)
    assert "expected" not in out and "patched metric" in out
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""
