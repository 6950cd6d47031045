"""What someone who only pip-installs gets: ``python -m build`` makes the sdist and, from it, the wheel; the
wheel carries the package, the embedded model and its data and nothing else large; installed into a fresh
venv it runs the CLI and the README tour from a folder outside the repository.

The build runs offline (``--no-isolation``: the build backend comes from the running environment). The fresh
venv sees the running interpreter's site-packages through a ``.pth`` file, so torch is not installed again;
that file names plain folders, which Python adds without reading their ``.pth`` files, so an editable install
of the repository there stays invisible, and the venv's own site-packages comes first.
"""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

import pytest

import gpt2_interp

ROOT = Path(__file__).resolve().parents[2]
MODEL = "gpt2_interp/models/gpt2-facts/model.safetensors"
# Outside the package: what must never be in the wheel, as path parts.
FOREIGN = {"tests", "analyses", "notebooks", "benchmarks", "scripts", "docs", "build", "dist", ".cache", "runs"}
JUNK = re.compile(r"(^|/)(__pycache__|\.ipynb_checkpoints|\.pytest_cache|\.mypy_cache|\.ruff_cache)(/|$)|\.py[cod]$")
# everything but the model's weights: code, vocabulary, fact base, hparams, metadata and the views' plotly.js
# cartesian bundle (1.5 MB, so that a page starts in a fresh browser in about a second)
OTHER_BYTES_BUDGET = 5_500_000


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would put the repository on ``sys.path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return env | {"PYTHONNOUSERSITE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} | extra


def _source_files() -> set[str]:
    """The package's files in the checkout: git's tracked and untracked-but-not-ignored files (what a build
    of this checkout sees), or every file but caches outside git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "gpt2_interp"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        files = {line for line in out.splitlines() if (ROOT / line).is_file()}
    except (OSError, subprocess.CalledProcessError):
        files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gpt2_interp").rglob("*") if p.is_file()}
    return {f for f in files if not JUNK.search(f)}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="the test extra installs build")
    out = tmp_path_factory.mktemp("dist")
    run = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        env=_clean_env(),
        cwd=out,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (path,) = dist.glob("*.whl")
    return path


@pytest.mark.slow
def test_wheel_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        infos = z.infolist()
        metadata = Parser().parsestr(
            z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        )
    names = {i.filename for i in infos}
    version = gpt2_interp.__version__
    dist_info = f"gpt2_interp-{version}.dist-info"
    assert {PurePosixPath(n).parts[0] for n in names} == {"gpt2_interp", dist_info}
    assert not [n for n in names if JUNK.search(n) or FOREIGN & set(PurePosixPath(n).parts)]

    # exactly the package's files: every module and data file, nothing left over from an older build
    package = {n for n in names if n.startswith("gpt2_interp/")}
    source = _source_files()
    assert source - package == set(), "files of the package missing from the wheel"
    assert package - source == set(), "files in the wheel that the checkout does not have"
    for pattern in _pyproject()["tool"]["setuptools"]["package-data"]["gpt2_interp"]:
        assert any(PurePosixPath(n).match(f"gpt2_interp/{pattern}") for n in package), pattern

    sizes = sorted(((i.file_size, i.filename) for i in infos), reverse=True)
    total = sum(s for s, _ in sizes)
    print(f"wheel {wheel.name}: {wheel.stat().st_size:,} bytes compressed, {total:,} uncompressed, {len(infos)} files")
    print("largest:", ", ".join(f"{n} {s:,}" for s, n in sizes[:3]))
    assert sizes[0][1] == MODEL
    assert total - sizes[0][0] < OTHER_BYTES_BUDGET, sizes[:5]

    assert metadata["Version"] == version
    assert {f"{dist_info}/licenses/LICENSE", f"{dist_info}/entry_points.txt"} <= names


@pytest.mark.slow
def test_wheel_requirements_are_pyprojects(wheel: Path) -> None:
    from packaging.requirements import Requirement

    project = _pyproject()["project"]
    with zipfile.ZipFile(wheel) as z:
        metadata = Parser().parsestr(z.read(f"gpt2_interp-{gpt2_interp.__version__}.dist-info/METADATA").decode())
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    base = sorted(str(r) for r in requires if r.marker is None)
    assert base == sorted(str(Requirement(r)) for r in project["dependencies"])
    assert sorted(metadata.get_all("Provides-Extra")) == sorted(project["optional-dependencies"])


@pytest.mark.slow
def test_sdist_contents(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    prefix = f"gpt2_interp-{gpt2_interp.__version__}"
    with tarfile.open(sdist) as t:
        members = [m.name for m in t.getmembers() if m.isfile()]
    assert all(m.startswith(prefix + "/") for m in members)
    rel = {m[len(prefix) + 1 :] for m in members}
    top = {PurePosixPath(m).parts[0] for m in rel}
    assert top <= {
        "PKG-INFO",
        "README.md",
        "LICENSE",
        "CHANGELOG.md",
        "MANIFEST.in",
        "pyproject.toml",
        "setup.cfg",
        "docs",
        "gpt2_interp",
        "gpt2_interp.egg-info",
    }, top
    assert {"README.md", "LICENSE", "CHANGELOG.md", "pyproject.toml", "docs/guide/index.md"} <= rel
    assert _source_files() <= rel  # the wheel is built from the sdist, so it must hold the whole package
    assert not [m for m in rel if JUNK.search(m)]


def test_changelog_has_the_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert versions[0] == "Unreleased"
    assert versions[1] == gpt2_interp.__version__  # the newest release is the package's version


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from gpt2_interp.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gpt2-interp {gpt2_interp.__version__}\n"


TOUR = """
import json, sys
import gpt2_interp
from gpt2_interp.editing.hparams import hparams_file
from gpt2_interp.facts import FactBase

model = gpt2_interp.load("gpt2-facts")
logits, cache = model.run_with_cache("The capital of France is", names_filter=lambda n: "resid" in n)
print(model.generate("The capital of France is", max_new_tokens=3, do_sample=False))
print(json.dumps({
    "file": gpt2_interp.__file__,
    "logits": list(logits.shape),
    "cached": len(cache),
    "facts": len(FactBase.load()),
    "rome_hparams": hparams_file("rome", "gpt2-facts"),
    "transformers_loaded": "transformers" in sys.modules,
}))
"""


@pytest.mark.slow
def test_installed_wheel_runs_outside_the_repo(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=_clean_env())
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index"]
    run = subprocess.run([*install, "--no-cache-dir", str(wheel)], capture_output=True, text=True, env=_clean_env())
    assert run.returncode == 0, run.stdout + run.stderr

    # the dependencies: the running interpreter's site-packages (never the repository's source tree)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    deps = sorted(d for d in deps if Path(d).is_dir())
    assert not any(Path(d).resolve() == ROOT or (Path(d) / "pyproject.toml").is_file() for d in deps), deps
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    ).stdout.strip()
    Path(purelib, "_running_interpreter_deps.pth").write_text("\n".join(deps) + "\n", encoding="utf-8")

    outside = tmp_path / "elsewhere"
    outside.mkdir()

    def sh(*args: str) -> str:
        done = subprocess.run(args, capture_output=True, text=True, cwd=outside, env=_clean_env(), timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    cli = str(venv / "bin" / "gpt2-interp")
    assert sh(cli, "--version").strip() == f"gpt2-interp {gpt2_interp.__version__}"

    with zipfile.ZipFile(wheel) as z:
        config = json.loads(z.read("gpt2_interp/models/gpt2-facts/config.json"))
        facts = [line for line in z.read("gpt2_interp/facts/data/facts.jsonl").decode().splitlines() if line.strip()]
        rome = json.loads(z.read("gpt2_interp/editing/hparams/rome/gpt2-facts.json"))
    info = sh(cli, "info").splitlines()
    assert info[0].startswith(f"gpt2-facts: {config['n_layer']} layers, d_model {config['n_embd']}, ")

    out = sh(str(python), "-c", TOUR).splitlines()
    generated, report = out[-2], json.loads(out[-1])
    assert generated.startswith("The capital of France is") and "Paris" in generated
    installed = Path(report["file"]).resolve()
    assert installed.is_relative_to(venv.resolve()), installed
    assert not installed.is_relative_to(ROOT)
    assert report["logits"][0] == 1 and report["logits"][-1] == config["vocab_size"]
    assert report["cached"] > 0
    assert report["facts"] == len(facts)
    assert report["rome_hparams"] == rome
    assert report["transformers_loaded"] is False
