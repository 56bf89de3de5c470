"""The documentation (issue 39): the site builds with `mkdocs build --strict`,
so a broken link, a missing anchor or an API name that no longer exists
fails here; the README is a guide with a table of contents; and its quick
start prints what the README shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The site and the quick start do not depend on the backend: they run once
# per suite, under this one.
ONCE = pytest.mark.skipif(keras.backend.backend() != "jax",
                          reason="built once per suite, under KERAS_BACKEND=jax")


API = re.findall(r"^::: (\S+)$", (ROOT / "docs" / "api.md").read_text(), re.M)


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


@ONCE
def test_the_site_builds_strictly_and_needs_no_network(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert done.returncode == 0, done.stderr[-4000:]
    home = (site / "index.html").read_text()
    assert "is a Keras 3 callback" in home      # the README is the home page
    assert 'src="demo-cpu-jax.png"' in home     # its picture, found on the site
    api = (site / "api" / "index.html").read_text()
    for identifier in API:
        assert f'id="{identifier}"' in api, identifier
    pages = "".join(path.read_text() for path in site.rglob("*.html"))
    assert "fonts.googleapis.com" not in pages


def test_the_api_reference_covers_every_public_name():
    import keras_memwatch

    assert sorted(identifier.rsplit(".", 1)[1] for identifier in API) == sorted(
        keras_memwatch.__all__)


def test_the_readme_is_a_guide_with_contents():
    lines = README.splitlines()
    assert len(lines) <= 420, "measurements and their stories belong in docs/"
    headings = [line[3:] for line in lines if line.startswith("## ")]
    contents = re.findall(r"\[([^\]]+)\]\(#[^)]+\)", README.split("\n## ", 1)[0])
    assert contents == headings
    assert "Troubleshooting and FAQ" in headings


@ONCE
def test_the_quick_start_prints_what_the_readme_shows(tmp_path):
    block = section("Quick start")
    code = re.search(r"```python\n(.*?)```", block, re.S).group(1)
    code += "print('flagged', watch.spikes[['device', 'batch']].values.tolist())\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    flagged = [["host", 14], ["host", 29], ["host", 44]]
    assert done.stdout.splitlines()[-1] == f"flagged {flagged}"
    assert "Where the memory went:" in done.stdout
    # The alerts and the spike table shown in the README are of the same run.
    for batch in (14, 29, 44):
        alert = f"memory spike at epoch 0 batch {batch} on host: peak "
        assert alert in block and alert in done.stderr
        assert re.search(rf"^\d\s+0\s+{batch}\s+host\s+\d+\s+\d+$", block, re.M)
    named = ("memory spike at epoch 0 batch 14 came with input shape (128, 64, 64, 3), "
             "where most batches had (8, 64, 64, 3): the activations of conv2d grew "
             "most: 8.0 MiB -> 128 MiB (from shapes)")
    assert named in block and named in done.stderr
