"""The docs site: `mkdocs build --strict`, then the built site rendered in headless Chromium.

The browser test serves the built site on loopback (`python -m http.server`), opens the home page
and a notebook page in Debian's `chromium`, checks the DOM carries their figures (the home page's
generated figure, the notebook's stored PNG outputs) and saves a screenshot of each, checked not
to be blank. Without chromium it skips and says why; under CI=true it fails instead.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--hide-scrollbars", "--mute-audio",
    # hermetic: every host but loopback fails to resolve at once (no CDN script can stall a page)
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )
    print(f"mkdocs build --strict: {time.perf_counter() - t0:.1f} s")
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-5000:]}"
    assert "WARNING" not in proc.stderr, proc.stderr[-5000:]
    return out


def _page(site: Path, rel: str) -> str:
    path = site / rel / "index.html" if rel else site / "index.html"
    assert path.is_file(), f"{path} was not built"
    return path.read_text(encoding="utf-8")


def test_strict_build_has_every_page(site):
    for rel in ["", "concepts", "results", "contributing", "api"]:
        _page(site, rel)
    for nb in NOTEBOOKS:
        html = _page(site, f"notebooks/{nb.stem}")
        assert "data:image/png;base64," in html or "<svg" in html, f"{nb.name}: no figure"
    for mod in ["devices"]:
        assert "setup_devices" in _page(site, f"api/{mod}")


def test_no_unfilled_markers_or_raw_placeholders(site):
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert "<!-- gen:" not in text, f"{html}: an unfilled generator marker"


# ---------------------------------------------------------------------------- browser


def _chromium() -> str:
    """Debian's chromium (or the browser named by $CHROMIUM); skip without one, unless CI=true."""
    if os.environ.get("CHROMIUM"):
        exe = shutil.which(os.environ["CHROMIUM"])
    else:
        exe = shutil.which("chromium") or shutil.which("/usr/bin/chromium")
    if exe is None:
        reason = ("Debian's chromium is not installed (apt-get install chromium; "
                  "tests/run.sh does it when run as root)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}, and CI=true: the browser check must run in CI")
        pytest.skip(reason)
    return exe


@pytest.fixture(scope="module")
def server(site):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(site)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base, timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("http.server did not start")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _browse(url: str, tmp: Path, name: str, height: int, capsys) -> tuple[str, Path]:
    exe = _chromium()
    shot = tmp / f"{name}.png"
    common = [exe, *CHROMIUM_FLAGS, "--virtual-time-budget=4000",
              "--run-all-compositor-stages-before-draw"]
    dom = subprocess.run(
        [*common, f"--user-data-dir={tmp / (name + '-profile-dom')}", "--dump-dom", url],
        capture_output=True, text=True, timeout=90,
    )
    assert dom.returncode == 0, dom.stderr[-3000:]
    shot_run = subprocess.run(
        [*common, f"--user-data-dir={tmp / (name + '-profile-shot')}",
         f"--window-size=1280,{height}", f"--screenshot={shot}", url],
        capture_output=True, text=True, timeout=90,
    )
    assert shot_run.returncode == 0 and shot.is_file(), shot_run.stderr[-3000:]
    with capsys.disabled():  # shown even when pytest captures output
        print(f"\n  screenshot of {url}: {shot}")
    return dom.stdout, shot


def _not_blank(png: Path) -> None:
    from PIL import Image, ImageStat

    img = Image.open(png).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 200, f"{png}: too few colours, blank page?"
    assert max(ImageStat.Stat(img).stddev) > 20, f"{png}: no contrast, blank page?"


def test_home_page_renders_with_its_figure(server, tmp_path, capsys):
    dom, shot = _browse(server, tmp_path, "home", 1800, capsys)
    assert "equarx-ref" in dom and 'class="md-content"' in dom
    imgs = re.findall(r'<img[^>]+src="([^"]+\.png)"', dom)
    assert imgs, "the home page shows no figure"
    for src in imgs:  # each figure is served and is a PNG
        with urllib.request.urlopen(server + src.lstrip("./").removeprefix("/"), timeout=5) as r:
            assert r.read(8) == b"\x89PNG\r\n\x1a\n", src
    _not_blank(shot)


def test_notebook_page_renders_with_its_stored_figures(server, tmp_path, capsys):
    nb = NOTEBOOKS[0]
    stored = [o["data"]["image/png"] for c in json.loads(nb.read_text())["cells"]
              if c["cell_type"] == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert stored, f"{nb.name} stores no figure"
    dom, shot = _browse(server + f"notebooks/{nb.stem}/", tmp_path, nb.stem, 3000, capsys)
    shown = re.findall(r'src="data:image/png;base64,([^"]+)"', dom)
    assert shown, "no figure in the notebook page"
    norm = {base64.b64decode(s) for s in shown}
    assert all(base64.b64decode("".join(s) if isinstance(s, list) else s) in norm
               for s in stored), "the page does not show every stored figure of the notebook"
    _not_blank(shot)


def test_home_page_quick_start_runs():
    """The quick start on the home page is real code: run it as written."""
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "no python quick start on the home page"
    proc = subprocess.run([sys.executable, "-c", "\n".join(blocks)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "devices" in proc.stdout


def test_repository_url_comes_from_pyproject(site):
    """The site's repository link and install line are made from pyproject's URL, not typed."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        url = tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")
    for path in [ROOT / "mkdocs.yml", *(ROOT / "docs").glob("*.md")]:
        assert url not in path.read_text(encoding="utf-8"), f"{path} types the repository URL"
    home = _page(site, "")
    assert f'href="{url}"' in home and f"git+{url}" in home
