"""The nullspace_rules experiment, quick mode through the runner, against eigen-decompositions made here."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.editing.memit import MemitHparams
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.editing.targets import context_prefixes, subject_states
from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # the statistics, the keys of 12 requests and four null spaces


def test_dims_leak_and_key_energy_from_the_spectrum(facts_model, tmp_path):
    """The relative rule's dimension is the count of eigenvalues ≤ τ·λ_max of the statistics; the energy
    rule's is the largest number of smallest eigenvalues summing to ≤ τ·tr C₀; the edit keys' energy is
    ‖K P‖²/‖K‖² with ``P`` built here from the eigenvectors."""
    res = run_experiment("nullspace_rules", facts_model, quick=True, out=tmp_path, progress=False)
    report = res.data
    ev, U = torch.linalg.eigh(key_second_moment(facts_model, 0, n_samples=3000).C.double())
    ev = ev.clamp(min=0)
    hp = MemitHparams.of(facts_model)
    prefixes = context_prefixes(facts_model, hp.rome.prefix_lengths, hp.rome.prefixes_per_length, hp.rome.prefix_seed)
    keys, _ = subject_states(facts_model, [c.request for c in known_cases(facts_model, 12, 0)], [0], prefixes)
    K = keys[0].double()
    assert report["layers"] == [0] and len(report["rows"]) == 4 and report["n_keys"] == 12
    for r in report["rows"]:
        if r["rule"] == "relative":
            assert r["null_dim"] == int((ev <= r["tau"] * ev[-1]).sum())
            Un = U[:, : r["null_dim"]]  # eigh sorts ascending: the null directions come first
            assert r["edit_key_energy"] == pytest.approx(float((K @ Un).pow(2).sum() / K.pow(2).sum()), abs=1e-5)
        else:
            cum = ev.cumsum(0) / ev.sum()
            assert r["leak"] <= r["tau"] + 1e-9 and cum[r["null_dim"]] > r["tau"]
        assert 0 <= r["edit_key_energy"] <= 1
    d = tmp_path / "nullspace_rules" / "gpt2-facts" / "quick"
    assert (d / "nullspace_rules.png").stat().st_size > 0 and "| relative | 0.001 |" in (
        d / "nullspace_rules.md"
    ).read_text()
