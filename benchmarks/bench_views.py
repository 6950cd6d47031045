"""How long the largest interactive views take to open in a real browser, and how large their pages are.

    python benchmarks/bench_views.py [--loads 5] [--out benchmarks/RESULTS_views.md]

Two views of SmolLM2-135M (the real weights) on one 64-token prompt: the logit lens (31 layer
boundaries × 64 positions, top tokens and the target's rank on hover) and the attention grid (30
layers × 9 query heads over 3 key/value groups, 64 × 64 each). Each page is written to disk and
opened from the file in Debian's headless Chromium, started as the browser tests start it
(``tests/integration/browser.py``, Selenium), two ways:

- **in a running browser**: one browser loads the page ``--loads`` times; the first load is the
  browser's warm-up and is reported apart, the median of the others is the figure;
- **in a fresh browser**: a new browser process per load (the first page a user opens after starting
  the browser), beside a page holding plotly.js and nothing else, which is that browser's floor for
  any Plotly page.

Time is the page's own clock (``performance.now`` origin = navigation start) at the mark
``g2v-views-end`` the page sets once every view is drawn; ``g2v-views-start`` (plotly.js parsed)
splits it into loading plotly.js and drawing the views. Prints a markdown table; ``--out`` also
writes it with its provenance beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.browser import chromium  # noqa: E402 (the browser tests' own headless Chromium)

TEXT = (
    "The old lighthouse stood at the edge of the harbour, its white paint peeling after decades of salt "
    "and wind. Every evening the keeper climbed the spiral stairs, trimmed the wick and watched the ships "
    "come home across the grey water, counting them one by one until the last had passed the rocks. "
    "In winter the storms came early, and "
    "the town below shuttered its windows against the spray."
)

MARKS = (
    "return [performance.getEntriesByName('g2v-views-start')[0].startTime,"
    " performance.getEntriesByName('g2v-views-end')[0].startTime]"
)


def pages(folder: Path) -> dict[str, Path]:
    """Write the lens page, the attention page and a plotly.js-only page; their paths by name."""
    import torch

    import gpt2_interp
    from gpt2_interp.analysis.lens import logit_lens
    from gpt2_interp.views import View, view
    from gpt2_interp.views.attention import attention_patterns

    model = gpt2_interp.load("smollm2-135m")
    tokens = model.to_tokens(TEXT)[:, :64]
    prompt = str(model.to_string(tokens[0, 1:]))
    assert tokens.shape[1] == 64, tokens.shape
    with torch.inference_mode():
        lens = logit_lens(model, prompt, positions="all", k=5, progress=False)
        att = attention_patterns(model, prompt)
    assert tuple(att.pattern.shape) == (30, 9, 64, 64), att.pattern.shape
    out = {
        "lens 31 × 64": folder / "lens.html",
        "attention 30 × 9 × 64²": folder / "attention.html",
        "plotly.js only": folder / "plotly.html",
    }
    view(lens).save(out["lens 31 × 64"])
    view(att).save(out["attention 30 × 9 × 64²"])
    View("plotly.js only").save(out["plotly.js only"])
    return out


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loads", type=int, default=5, help="loads per page and way (default 5)")
    p.add_argument("--out", type=Path, default=None, help="write the table here (and <out>.provenance.json)")
    a = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="g2v-bench-"))
    files = pages(folder)
    load0 = os.getloadavg()
    rows = []
    for name, f in files.items():
        with chromium() as d:
            running = []
            for _ in range(a.loads):
                d.get(f.as_uri())
                running.append(d.execute_script(MARKS))
        fresh = []
        for _ in range(a.loads):
            with chromium() as d:
                d.get(f.as_uri())
                fresh.append(d.execute_script(MARKS))
        warm = running[1:]
        rows.append(
            f"| {name} | {f.stat().st_size / 1e6:.1f} MB "
            f"| {statistics.median(e for _, e in warm):.0f} ms ({statistics.median(s for s, _ in warm):.0f} + "
            f"{statistics.median(e - s for s, e in warm):.0f}) | {running[0][1]:.0f} ms "
            f"| {statistics.median(e for _, e in fresh):.0f} ms ({statistics.median(s for s, _ in fresh):.0f} + "
            f"{statistics.median(e - s for s, e in fresh):.0f}) |"
        )
    shutil.rmtree(folder)
    load1 = os.getloadavg()
    table = "\n".join(
        [
            f"Headless Chromium, median of {a.loads - 1} loads in a running browser (after its first) and of "
            f"{a.loads} loads each in a fresh browser; time from navigation start to every view drawn "
            "(in brackets: plotly.js loaded + views drawn). "
            f"Load average {load0[0]:.2f} before, {load1[0]:.2f} after, on {os.cpu_count()} CPUs.",
            "",
            "| page | size | running browser | its first load | fresh browser |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    if a.out is not None:
        from gpt2_interp.experiments.provenance import standalone, write_beside

        title = "# Interactive views: page size and time to open\n\n"
        a.out.write_text(title + f"`{' '.join(['python', *sys.argv])}`\n\n" + table + "\n")
        write_beside(a.out, standalone(sys.argv))
    return table


if __name__ == "__main__":
    main()
