"""Per-model editing settings as data (gpt2_interp/editing/hparams/<method>/<model>.json): every file
loads, names only fields of the hparams dataclass, justifies every setting with a run of the documented
form, and resolves to the values the library used before the settings became data."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpt2_interp.editing import hparams as hp_data
from gpt2_interp.editing.memit import DELTA_DEFAULTS, MemitHparams, default_layers
from gpt2_interp.editing.memit import MODEL_HPARAMS as MEMIT_MODEL_HPARAMS
from gpt2_interp.editing.settings import DEFAULT_LAYERS, MODEL_HPARAMS, RomeHparams, default_layer, hparams_for

FOLDER = Path(hp_data.__file__).parent
FILES = sorted(FOLDER.glob("*/*.json"))
RUN = re.compile(
    r"analyses/results/(rome_counterfact|mass_editing|mass_editing_window|mass_editing_stats|"
    r"nullspace_rules|subject_specificity|causal_trace|paper_departures)/(gpt2-facts|smollm2-135m)"
)
ROME_FIELDS = {f.name for f in fields(RomeHparams)}
MEMIT_OWN = {f.name for f in fields(MemitHparams)} - {"rome"}
ALLOWED = {
    "rome": ROME_FIELDS,
    "memit": MEMIT_OWN - {"nullspace_threshold", "nullspace_rule", "alpha", "alpha_scale"} | (ROME_FIELDS - {"layer"}),
    "alphaedit": {"nullspace_threshold", "nullspace_rule", "alpha", "alpha_scale"},
}


def _model(name: str, n_layer: int = 30):
    return SimpleNamespace(cfg=SimpleNamespace(name=name, n_layer=n_layer))


def test_every_method_has_a_default_and_files_for_both_shipped_models():
    for method in hp_data.METHODS:
        for name in ("default", "gpt2-facts", "smollm2-135m"):
            assert (FOLDER / method / f"{name}.json").is_file(), (method, name)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_file_names_only_dataclass_fields_and_justifies_each_with_a_documented_run(path):
    method, name = path.parent.name, path.stem
    data = json.loads(path.read_text())
    assert data["method"] == method and data["model"] == name
    assert set(data["settings"]) <= ALLOWED[method], set(data["settings"]) - ALLOWED[method]
    named = [s for group in data["justified_by"] for s in group["settings"]]
    assert sorted(named) == sorted(data["settings"])  # every setting exactly once
    for group in data["justified_by"]:
        assert group["why"].strip() and "\n" not in group["why"]
        assert ("run" in group) != ("source" in group)
        if "run" in group:
            assert RUN.fullmatch(group["run"]), group["run"]
            if name != "default":  # a model's setting was chosen on that model
                assert group["run"].endswith("/" + name), group["run"]
    # the loader accepts it, and the dataclasses accept its values
    settings = hp_data.load_hparams(method, name)
    if method == "rome":
        RomeHparams.of(**settings)
    else:
        MemitHparams.of(_model(name), **{k: v for k, v in settings.items() if k != "layers"})


def test_a_malformed_file_is_refused_naming_it():
    bad = {"settings": {"v_lr": 1.0}, "justified_by": [{"settings": ["v_lr"], "run": "results/x", "why": "w"}]}
    with pytest.raises(ValueError, match=r"rome/x\.json.*not of the form"):
        hp_data._check_file(bad, "rome/x.json")
    bad["justified_by"][0]["run"] = "analyses/results/rome_counterfact/gpt2-facts"
    bad["settings"]["v_steps"] = 3
    with pytest.raises(ValueError, match="every setting exactly once"):
        hp_data._check_file(bad, "rome/x.json")


def test_default_files_agree_with_the_dataclass_defaults():
    rome_default = hp_data.load_hparams("rome", "default")
    assert {k: getattr(RomeHparams(), k) for k in rome_default} == rome_default
    for method in ("memit", "alphaedit"):
        own = {k: v for k, v in hp_data.load_hparams(method, "default").items() if k in MEMIT_OWN}
        assert {k: getattr(MemitHparams(), k) for k in own} == own


def test_resolved_settings_equal_the_former_dictionaries():
    """Values copied by hand from rome.py/memit.py before the settings became data."""
    assert MODEL_HPARAMS == {
        "gpt2-facts": {"v_lr": 5.0, "v_steps": 60, "bare_weight": 0.5, "early_stop": 1.0, "bare_early_stop": 0.5},
        "smollm2-135m": {"early_stop": 0.1},
    }
    assert DEFAULT_LAYERS == {
        "gpt2": 4,
        "gpt2-medium": 8,
        "gpt2-large": 12,
        "gpt2-xl": 17,
        "gpt2-facts": 0,
        "smollm2-135m": 3,
    }
    assert MEMIT_MODEL_HPARAMS == {
        "gpt2-facts": {"layers": (0,), "mom2_weight": 1000.0, "prefix_lengths": (5, 10), "delta_norm": "mlp_out"},
        "smollm2-135m": {"delta_norm": "mlp_out", "mom2_weight": 100.0},
    }
    assert DELTA_DEFAULTS == {"prefix_lengths": (10,), "prefixes_per_length": 5, "key_weighting": "per_context_type"}
    rome_defaults = dict(
        v_steps=20,
        v_lr=0.5,
        kl_factor=0.0625,
        weight_decay=0.5,
        clamp_factor=4.0,
        early_stop=0.05,
        prefix_lengths=(5, 10),
        prefixes_per_length=5,
        prefix_seed=0,
        kl_prompt="{} is a",
        keep_factor=1.0,
        exact_edit=True,
        bare_weight=None,
        bare_early_stop=None,
        corpus=None,
        n_samples=100_000,
        # the departures from the authors' code, at ours (docs/guide/editing.md)
        key_weighting="uniform",
        target_state="averaged",
        kl_positions="subject_last_and_after",
        step_count="updates",
        prefix_style="sampled",
        prepend_bos=True,
        preset=None,
    )
    facts, smol = _model("gpt2-facts", 2), _model("smollm2-135m", 30)
    got = asdict(hparams_for(facts))
    assert got == rome_defaults | {
        "layer": 0,
        "v_lr": 5.0,
        "v_steps": 60,
        "bare_weight": 0.5,
        "early_stop": 1.0,
        "bare_early_stop": 0.5,
    }
    assert asdict(hparams_for(smol)) == rome_defaults | {"layer": 3, "early_stop": 0.1}
    memit_defaults = dict(
        mom2_weight=1000.0,
        nullspace_threshold=1e-3,
        nullspace_rule="relative",
        alpha=0.1,
        chunk=None,
        preset=None,
        alpha_scale="trace",
    )
    m = MemitHparams.of(facts).to_dict()
    assert m == memit_defaults | {
        "alpha": 10.0,
        "alpha_scale": "absolute",
        "layers": (0,),
        "delta_norm": "mlp_out",
        "rome": rome_defaults
        | {
            "v_lr": 5.0,
            "v_steps": 60,
            "bare_weight": 0.5,
            "early_stop": 1.0,
            "bare_early_stop": 0.5,
            "prefix_lengths": (5, 10),
            "layer": None,
            "key_weighting": "per_context_type",  # MEMIT's own default (hparams/memit/default.json)
        },
    }
    m = MemitHparams.of(smol).to_dict()
    assert m == memit_defaults | {
        "mom2_weight": 100.0,
        "nullspace_threshold": 1e-2,
        "layers": None,
        "delta_norm": "mlp_out",
        "rome": rome_defaults
        | {"early_stop": 0.1, "prefix_lengths": (10,), "layer": None, "key_weighting": "per_context_type"},
    }
    assert default_layer(smol) == 3 and default_layers(smol) == [1, 2, 3] and default_layers(facts) == [0]


def test_a_model_without_a_file_gets_the_defaults_and_a_third_of_its_depth():
    other = _model("my-model", 24)
    assert asdict(hparams_for(other)) == asdict(RomeHparams())
    assert default_layer(other) == 8
    m = MemitHparams.of(other)
    assert m.delta_norm == "resid" and m.rome.prefix_lengths == (10,) and m.layers is None
    assert hp_data.load_hparams("rome", "../rome/gpt2-facts") == hp_data.load_hparams("rome", "default")


def test_memit_refuses_romes_layer_setting_naming_layers():
    with pytest.raises(ValueError, match=r"unknown MEMIT hyperparameter.*'layer'.*layers"):
        MemitHparams.of(_model("gpt2-facts", 2), layer=0)


def test_the_cache_digest_follows_the_settings_and_ignores_the_justifications(tmp_path):
    """A cached editing result is keyed by the files' settings: rewording a justification keeps the key,
    changing a value (or adding a model's file) changes it."""
    root = tmp_path / "hparams"
    shutil.copytree(FOLDER, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    path = root / "alphaedit" / "gpt2-facts.json"
    base = hp_data.settings_digest(root)
    assert base == hp_data.defaults_digest()
    data = json.loads(path.read_text())
    data["justified_by"][0]["why"] += " (reworded)"
    path.write_text(json.dumps(data, indent=1))
    assert hp_data.settings_digest(root) == base
    data["settings"]["alpha"] = data["settings"]["alpha"] * 2
    path.write_text(json.dumps(data))
    changed = hp_data.settings_digest(root)
    assert changed != base
    (root / "rome" / "another-model.json").write_text(json.dumps({"settings": {"v_steps": 5}}))
    assert hp_data.settings_digest(root) not in (base, changed)
