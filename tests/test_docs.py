"""The docs site and the README: built, complete, offline, and saying what the code does.

`mkdocs build --strict`, then checks of the built HTML: every page, every public module and name
in the API reference, every notebook listed, no nbval markers shown, nothing loaded from another
host. The Results page's tables and the README's headline are held equal to equarx_ref/data/*.json,
the README's "Use" snippet is run, its printed values compared with what its comments say, the
README is held short, and every file path a page cites exists.

The browser tests serve the built site on loopback (`python -m http.server`), open pages in
Debian's `chromium`, check the DOM (the home page's generated figure, a notebook's stored PNG
outputs, formulas typeset by the vendored KaTeX) and save a screenshot of each, checked not to
be blank. One of them opens every page of the site, as a reader's browser lays it out (1280
pixels wide), and checks every link on it (each internal link resolves to a page or file of the
site, each #anchor to an element of its target), that no code block or output spills out of
the page or breaks its lines mid-word, and that no figure is scaled down below 75% of its size.
Without chromium they skip and say why; under CI=true they fail instead.
"""

from __future__ import annotations

import base64
import functools
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
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
DIRECTIVE = re.compile(r"^::: (equarx_ref(?:\.\w+)*)\s*$", re.M)
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


@pytest.mark.slow
def test_strict_build_has_every_page(site):
    for rel in ["", "concepts", "results", "contributing"]:
        _page(site, rel)
    for page in API_PAGES:
        _page(site, "api" if page.stem == "index" else f"api/{page.stem}")
    for nb in NOTEBOOKS:
        html = _page(site, f"notebooks/{nb.stem}")
        assert "data:image/png;base64," in html or "<svg" in html, f"{nb.name}: no figure"


def test_no_unfilled_markers_or_raw_placeholders(site):
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert "<!-- gen:" not in text, f"{html}: an unfilled generator marker"


def test_api_pages_read_well(site):
    """Signatures formatted and wrapped (ruff, line_length); the sidebar lists the page's
    sections and modules, not every member."""
    html = _page(site, "api/collectives")
    links = re.findall(r'<a href="#([^"]+)" class="md-nav__link">', html)
    assert "equarx_ref.collectives" in links and "equarx_ref.outliers" in links, links
    modules = DIRECTIVE.findall((ROOT / "docs" / "api" / "collectives.md").read_text("utf-8"))
    members = [a for a in links if a.startswith("equarx_ref.") and a not in modules]
    assert not members, f"the API sidebar lists members: {members[:5]}"
    assert 'id="equarx_ref.collectives.all_reduce"' in html  # the members keep their anchors
    start = html.index("doc-signature", html.index('id="equarx_ref.collectives.AllReduce"'))
    signature = re.sub(r"<[^>]+>", "", html[start:html.index("</code>", start)])
    lines = signature.split("\n")
    assert len(lines) > 5 and max(map(len, lines)) <= 90, signature


def _public_modules() -> set[str]:
    """Every module and subpackage of equarx_ref but the private ones and the CLI's."""
    pkg = ROOT / "equarx_ref"
    mods = {"equarx_ref." + ".".join(p.relative_to(pkg).with_suffix("").parts)
            for p in pkg.rglob("*.py") if p.name != "__init__.py"}
    mods |= {"equarx_ref." + ".".join(p.parent.relative_to(pkg).parts)
             for p in pkg.rglob("__init__.py") if p.parent != pkg}
    return {m for m in mods if not any(part.startswith("_") for part in m.split("."))
            and not m.startswith("equarx_ref.cli")}


def test_api_pages_document_every_public_module_once():
    documented = [m for page in API_PAGES
                  for m in DIRECTIVE.findall(page.read_text(encoding="utf-8"))]
    assert len(documented) == len(set(documented)), f"documented twice: {documented}"
    missing = _public_modules() - set(documented)
    assert not missing, f"modules on no page of docs/api/: {sorted(missing)}"
    assert {"equarx_ref.models.predict", "equarx_ref.models.hlo"} <= set(documented)
    unknown = set(documented) - _public_modules()
    assert not unknown, f"docs/api/ documents what is not a public module: {sorted(unknown)}"


def test_api_reference_renders_every_public_name(site):
    """Each name `import equarx_ref as eq` exports has its entry (anchor) on an API page."""
    import equarx_ref as eq

    html = "".join(_page(site, "api" if p.stem == "index" else f"api/{p.stem}")
                   for p in API_PAGES)
    anchors = set(re.findall(r'id="(equarx_ref\.[\w.]+)"', html))
    missing = [name for name in eq.__all__ if name not in ("gemma", "viz")
               and not any(a.endswith("." + name) for a in anchors)]
    assert not missing, f"exported but not rendered in the API reference: {missing}"
    assert "equarx_ref._checks" not in html


def test_home_page_lists_every_notebook(site):
    home = _page(site, "")
    for nb in NOTEBOOKS:
        assert f'href="notebooks/{nb.stem}/"' in home, f"the home page does not list {nb.name}"


def test_notebook_pages_hide_nbval_markers(site):
    for nb in NOTEBOOKS:
        if "# NBVAL_" in nb.read_text(encoding="utf-8"):
            html = _page(site, f"notebooks/{nb.stem}")
            assert "NBVAL_" not in html, f"{nb.name}: an nbval marker is shown on its page"


def test_site_loads_nothing_from_another_host(site):
    """Scripts, styles, fonts and images all come from the site itself (it renders offline)."""
    loads = re.compile(r'<script\b[^>]*\bsrc="([^"]*)"|<img\b[^>]*\bsrc="([^"]*)"|'
                       r'<link\b(?=[^>]*\brel="(?:stylesheet|icon|preload|modulepreload)")'
                       r'[^>]*\bhref="([^"]*)"')
    remote = re.compile(r"^(?:[a-z]+:)?//", re.I)
    for html in site.rglob("*.html"):
        urls = [u for m in loads.finditer(html.read_text(encoding="utf-8")) for u in m.groups()
                if u and remote.match(u)]
        assert not urls, f"{html.relative_to(site)} loads {urls}"
    for css in site.rglob("*.css"):
        urls = re.findall(r"url\(\s*['\"]?((?:[a-z]+:)?//[^)'\"]+)", css.read_text("utf-8"))
        assert not urls, f"{css.relative_to(site)} loads {urls}"


# ---------------------------------------------------------------------------- README

README = ROOT / "README.md"
README_MAX_LINES = 150  # read in three minutes; every other table is on the Results page


def _docs_gen(name: str | None = None):
    """A module of docs/gen (the site's generators; the package itself without a name), imported
    as the hooks import it."""
    import importlib

    sys.path.insert(0, str(ROOT / "docs"))
    try:
        return importlib.import_module("gen" if name is None else f"gen.{name}")
    finally:
        sys.path.remove(str(ROOT / "docs"))


@functools.cache
def _page_markdown(name: str) -> str:
    """docs/NAME.md as the site renders it: every `<!-- gen:... -->` marker filled by its
    generator, as docs/hooks.py fills it (no mkdocs build needed)."""
    generators = _docs_gen().GENERATORS
    text = (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")
    return re.sub(r"<!-- gen:([a-z0-9_-]+) -->", lambda m: generators[m.group(1)]().markdown, text)


def _results_section(heading: str) -> str:
    """The section of the rendered Results page whose `## ` heading begins with `heading`."""
    parts = re.split(r"^## ", _page_markdown("results"), flags=re.M)
    found = [p for p in parts if p.startswith(heading)]
    assert len(found) == 1, f"docs/results.md: {len(found)} sections '## {heading}...'"
    return found[0]


def _data(name: str):
    """A stored result (equarx_ref/data/NAME), as the package ships it."""
    from equarx_ref import data

    return data.load(name.removesuffix(".json"))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): a newcomer reads it in "
        "three minutes; move tables to docs/results.md and prose to the site")


def test_readme_tables_are_rendered_from_the_data():
    text = README.read_text(encoding="utf-8")
    assert "<!-- gen:readme-headline -->" in text
    assert text == _docs_gen("readme").render(text), (
        "README.md's generated blocks differ from equarx_ref/data/*.json: run `python "
        "docs/hooks.py readme` (or `refresh` to measure anew)")


def test_readme_headline_agrees_with_the_json():
    """Read independently of the generator: the README's headline rows and figures carry the
    stored numbers."""
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    shown = 0
    for r in _data("demo.json")["rows"]:
        found = [_cells(x) for x in lines if x.startswith("|")
                 and _cells(x)[:2] == [r["algorithm"], r["format"]]]
        assert len(found) <= 1, f"README: {len(found)} rows for demo {r['algorithm']} {r['format']}"
        if found:
            shown += 1
            for value in (f"{r['bytes_sent']:,}", f"{r['rel_error']:.2%}"):
                assert value in found[0], f"README demo row {found[0]} lacks {value}"
    assert shown >= 4, f"the README's headline shows {shown} demo rows"
    g = next(r for r in _data("gemma.json")["rows"] if (r["algorithm"], r["format"]) ==
             ("ring", "int8"))
    assert f"ΔNLL {g['dnll']:+.4f} ± {g['dnll_se']:.4f}" in text and f"{g['top1']:.1f}%" in text
    m = next(r for r in _data("model-v5e.json")["rows"] if r["message_bytes"] == 16 << 20)
    assert f"int8 {m['int8_speedup']:.2f}x and int4 {m['int4_speedup']:.2f}x" in text, m
    for r in _data("model-v5e.json")["prefill"]:
        assert f"{r['speedup']:.2f}x" in text, r
    run = _data("multihost-100mbit.json")
    for r in run["results"]:
        if r["algorithm"] == "ring" and r["format"] != "bf16" and r["message_bytes"] == 32 << 20:
            assert f"{r['format']} {r['speedup_vs_bf16']:.2f}x" in text, r


@pytest.mark.slow
def test_results_table_rows_agree_with_the_json():
    """Read independently of the generator: each JSON row has its row on the Results page, with
    the same numbers."""
    lines = _results_section("Every collective").splitlines()
    for r in _data("demo.json")["rows"]:
        found = [_cells(x) for x in lines if x.startswith("|") and _cells(x)[:2] == [
            r["algorithm"], r["format"] + (f" ({r['note']})" if r["note"] else "")]]
        assert len(found) == 1, f"Results: {len(found)} demo rows {r['algorithm']} {r['format']}"
        for value in (f"{r['bytes_sent']:,}", f"{r['rel_error']:.2%}", f"{r['time_ratio']:.2f}"):
            assert value in found[0], f"Results demo row {found[0]} lacks {value}"
    lines = _results_section("What quantizing costs").splitlines()
    bench = _data("bench.json")  # {"codec", "quantizer", ...}; before the codec rows, a list
    for r in bench["quantizer"] if isinstance(bench, dict) else bench:
        found = [_cells(x) for x in lines if x.startswith(f"| `{r['format']}` |")]
        assert len(found) == 1 and f"{r['ratio']:.2f}x" in found[0], (r, found)
    report = _data("gemma.json")
    lines = _results_section("Quality on Gemma").splitlines()
    header = next(_cells(x) for x in lines if x.startswith("| algorithm | format | NLL |"))
    table = [_cells(x) for x in lines if x.startswith("|") and len(_cells(x)) == len(header)]
    for r in report["rows"]:
        found = [c for c in table if c[0] == r["algorithm"] and c[1] == r["label"].removeprefix(
            f"{r['algorithm']} ")]
        assert len(found) == 1, f"Results: {len(found)} Gemma rows for {r['label']}"
        assert f"{r['dnll']:+.4f} ± {r['dnll_se']:.4f}" in found[0][header.index(
            "ΔNLL ± SE (nats / token)")], (r["label"], found[0])
        assert found[0][header.index("top-1 agreement")] == f"{r['top1']:.1f}%", r["label"]


def test_stored_model_report_is_this_checkouts_model(tmp_path):
    """equarx_ref/data/model-v5e.json (Results, README) is what `equarx-ref model` prints today: the
    time model changed? `python docs/hooks.py refresh model-v5e.json`."""
    from equarx_ref import cli

    fresh = tmp_path / "model.json"
    assert cli.main(["model", "--chip", "v5e", "--json", str(fresh)]) == 0
    stored = _data("model-v5e.json")
    assert stored == json.loads(fresh.read_text(encoding="utf-8")), (
        "equarx_ref/data/model-v5e.json is stale: run "
        "`python docs/hooks.py refresh model-v5e.json`")


def test_results_time_tables_agree_with_the_json():
    """Read independently of the generators: the model's rows and every stored multi-host row
    (equarx_ref/data/multihost-*.json) have their Results page rows, with the same numbers."""
    lines = [_cells(x) for x in _results_section("Modelled TPU time").splitlines()
             if x.startswith("|")]
    report = _data("model-v5e.json")
    assert report["modelled"] is True
    for r in report["rows"]:
        found = [c for c in lines if c[0].replace(" ", "") in (
            f"{r['message_bytes'] >> 10}KiB", f"{r['message_bytes'] >> 20}MiB",
            f"{r['message_bytes'] >> 30}GiB") and len(c) == 8]
        assert len(found) == 1, f"Results: {len(found)} model rows for {r['message_bytes']} B"
        assert found[0][3] == f"{r['int8_speedup']:.2f}x", (r, found[0])
        assert found[0][6] == f"{r['int4_speedup']:.2f}x", (r, found[0])
    for r in report["prefill"]:
        row = next(c for c in lines if c[0] == r["model"])
        assert f"{r['speedup']:.2f}x" in row, (r, row)
    from equarx_ref import data

    page = _results_section("Measured on capped links")
    lines = [_cells(x) for x in page.splitlines() if x.startswith("|")]
    for name in [n for n in data.names() if n.startswith("multihost-")]:
        result = data.load(name)
        assert f"```bash\n{result['command']}\n```" in page, name
        link = result["link"] or "loopback"
        sizes = sorted({r["message_bytes"] for r in result["results"]})
        for r in result["results"]:
            mib = f"{r['message_bytes'] / 2**20:g} MiB"
            grid = [c for c in lines if c[:3] == [link, r["algorithm"], r["format"]]
                    and len(c) == 3 + len(sizes)]  # model / measured per size
            assert len(grid) == 1, f"Results: {name} {r['algorithm']} {r['format']}: no model row"
            ratio = grid[0][3 + sizes.index(r["message_bytes"])]
            assert ratio == f"{r['predicted_seconds'] / r['seconds']:.2f}", (name, r, ratio)
            found = [c for c in lines if c[:4] == [link, r["algorithm"], r["format"], mib]
                     and f"{r['seconds']:.4f} s" in c]
            assert len(found) == 1, f"Results: {name} {r['algorithm']} {r['format']} {mib}: no row"
            assert f"{r['predicted_seconds']:.4f} s" in found[0]
            assert f"{r['speedup_vs_bf16']:.2f}x" in found[0]


def test_results_schedule_tables_agree_with_the_json():
    """Read independently of the generator: the Results page's section on the TPU's own
    schedule says what its figures are (static, compiled on a CPU machine, modelled), shows
    its command, and has a row with the same numbers for every yardstick, codec kernel and
    AllReduce of equarx_ref/data/tpu-schedule.json."""
    from equarx_ref import data

    page = _results_section("The TPU's own schedule")
    assert f"```bash\n{data.command('tpu-schedule')}\n```" in page
    assert "nothing ran on a TPU" in page and "modelled" in page
    lines = [_cells(x) for x in page.splitlines() if x.startswith("|")]
    record = _data("tpu-schedule.json")["schedule"]
    for r in record["yardsticks"]:
        found = [c for c in lines if c[:2] == [r["topology"], r["program"]]]
        assert len(found) == 1 and f"{r['ratio']:.2f}x" in found[0], (r["program"], found)
        assert f"{r['cycles']:,}" in found[0]
    for r in record["codec"]:
        found = [c for c in lines if c[:2] == [r["topology"], f"`{r['format']}`"]]
        assert len(found) == 1 and f"{r['ratio']:.2f}x" in found[0], (r["format"], found)
    for r in record["all_reduce"]:
        found = [c for c in lines if c[:5] == [r["topology"], r["algorithm"], f"`{r['format']}`",
                                               str(r["num_chunks"]), r["impl"]]]
        assert len(found) == 1, (r["algorithm"], r["format"], found)
        assert found[0][-1] == f"{r['speedup_over_psum']['cycles']:.2f}x", found[0]


@pytest.mark.slow
def test_readme_use_snippet_prints_what_its_comments_say():
    code = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8")
                     .split("## Use", 1)[1], re.S).group(1)
    expected = re.findall(r"^print\(.*\)\s+# ([-+\d.]+)", code, re.M)
    assert len(expected) == 3, expected
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.split()[-len(expected):]
    for want, got in zip(expected, printed, strict=True):
        decimals = len(want.partition(".")[2])
        assert round(float(got), decimals) == float(want), f"README says {want}, code prints {got}"


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


@pytest.mark.slow
def test_home_page_renders_with_its_figure(server, tmp_path, capsys):
    dom, shot = _browse(server, tmp_path, "home", 1800, capsys)
    assert "equarx-ref" in dom and 'class="md-content"' in dom
    imgs = re.findall(r'<img[^>]+src="([^"]+\.png)"', dom)
    assert imgs, "the home page shows no figure"
    for src in imgs:  # each figure is served and is a PNG
        with urllib.request.urlopen(server + src.lstrip("./").removeprefix("/"), timeout=5) as r:
            assert r.read(8) == b"\x89PNG\r\n\x1a\n", src
    _not_blank(shot)


@pytest.mark.slow
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


# Loaded next to the site, it opens each page in a same-origin iframe of a reader's width and
# reports, as JSON in #out, what the browser made of it: every link (as the browser resolves
# it), every element id, and what in the content does not fit the page.
PAGE_CHECK = """<!doctype html><html><body><pre id="out">pending</pre><script>
const PAGES = PAGES_JSON, WIDTH = 1280, SMALLEST_FIGURE = 0.75;
function scrolls(el, stop, win) {  // inside an element that scrolls sideways?
  for (let e = el; e && e !== stop; e = e.parentElement) {
    if (["auto", "scroll"].includes(win.getComputedStyle(e).overflowX)) return true;
  }
  return false;
}
async function inspect(url) {
  const frame = document.createElement("iframe");
  frame.style.width = WIDTH + "px";
  frame.style.height = "900px";
  document.body.appendChild(frame);
  await new Promise((done) => { frame.onload = done; frame.src = url; });
  await new Promise((done) => setTimeout(done, 500));  // the page's own scripts run
  const win = frame.contentWindow, doc = frame.contentDocument;
  const content = doc.querySelector(".md-content__inner");
  const edge = content.getBoundingClientRect().right;
  const problems = [];
  const what = (el) => el.tagName.toLowerCase() + " '" +
    (el.textContent || el.getAttribute("alt") || "").trim().slice(0, 50) + "'";
  for (const el of content.querySelectorAll("pre, pre > code, table, img, .katex-display, " +
                                             ".jp-OutputArea-output")) {
    const style = win.getComputedStyle(el), box = el.getBoundingClientRect();
    if (box.width && box.right > edge + 1 && !scrolls(el.parentElement, content, win)) {
      problems.push("spills out of the page: " + what(el));
    }
    if ((el.tagName === "PRE" || el.tagName === "CODE") && !["pre", "nowrap"].includes(
        style.whiteSpace) && (style.wordBreak === "break-all" || style.overflowWrap !== "normal")) {
      problems.push(`breaks lines mid-word (${style.whiteSpace}, ${style.wordBreak}, ` +
                    `${style.overflowWrap}): ` + what(el));
    }
    if (el.tagName === "IMG" && el.naturalWidth &&
        el.clientWidth < SMALLEST_FIGURE * el.naturalWidth) {
      problems.push(`a figure shown at ${Math.round(100 * el.clientWidth / el.naturalWidth)}%` +
                    ` of its ${el.naturalWidth} px: ` + what(el));
    }
  }
  const links = [...doc.querySelectorAll("a[href]")].map((a) => a.href);
  const ids = [...doc.querySelectorAll("[id], a[name]")].map((e) => e.id || e.name);
  frame.remove();
  return {url: new URL(url, location.href).href, links, ids, problems};
}
(async () => {
  const out = [];
  for (const page of PAGES) {
    try {
      out.push(await inspect(page));
    } catch (err) {
      out.push({url: page, links: [], ids: [], problems: ["the check failed: " + err]});
    }
  }
  document.getElementById("out").textContent = JSON.stringify(out);
})();
</script></body></html>"""


def _site_pages(site: Path) -> list[str]:
    """Every page of the built site, as a URL relative to its root ("./" for the home)."""
    return sorted(p.parent.relative_to(site).as_posix() + "/" for p in site.rglob("index.html"))


@pytest.mark.slow
def test_every_link_anchor_code_block_and_figure_as_a_reader_sees_them(server, site, tmp_path):
    """Every page in the browser: each internal link resolves (a page or a file of the site),
    each #anchor exists in its target, nothing in the content spills out of the page or breaks
    mid-word, no figure is shrunk below 75%. The "Next: 02" links of the notebook pages once
    went to notebooks/01_quantization/02_ring_allreduce.ipynb, a 404 that `--strict` missed."""
    import html as html_lib
    import urllib.parse

    pages = _site_pages(site)
    assert len(pages) >= 10 and {"./", "notebooks/01_quantization/"} <= set(pages), pages
    check = PAGE_CHECK.replace("PAGES_JSON", json.dumps(pages))
    (site / "_page_check.html").write_text(check, encoding="utf-8")
    dom = subprocess.run(
        [_chromium(), *CHROMIUM_FLAGS, "--virtual-time-budget=60000",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1000", "--dump-dom",
         server + "_page_check.html"], capture_output=True, text=True, timeout=300)
    assert dom.returncode == 0, dom.stderr[-3000:]
    out = re.search(r'<pre id="out">(.*?)</pre>', dom.stdout, re.S)
    assert out and out.group(1) != "pending", "the page check did not finish"
    report = json.loads(html_lib.unescape(out.group(1)))
    ids = {r["url"]: set(r["ids"]) for r in report}
    broken, problems, checked = [], [], 0
    for r in report:
        problems += [f"{r['url']}: {p}" for p in r["problems"]]
        for link in r["links"]:
            url = urllib.parse.urlsplit(link)
            if f"{url.scheme}://{url.netloc}/" != server:
                continue  # another host (the site loads nothing from one: checked above)
            checked += 1
            target = urllib.parse.urlunsplit((url.scheme, url.netloc, url.path, "", ""))
            if target in ids:  # a page of the site
                if url.fragment and urllib.parse.unquote(url.fragment) not in ids[target]:
                    broken.append(f"{r['url']} -> {link}: no element #{url.fragment} there")
                continue
            path = site / urllib.parse.unquote(url.path).lstrip("/")
            if not (path.is_file() or (path / "index.html").is_file()):
                broken.append(f"{r['url']} -> {link}: no such page or file")
    print(f"{len(report)} pages, {checked} internal links checked")
    assert len(report) == len(pages)
    assert checked >= 20 * len(pages), f"only {checked} internal links found: the check is blind"
    assert not broken, "broken links:\n  " + "\n  ".join(broken)
    assert not problems, "as a reader sees it:\n  " + "\n  ".join(problems)


@pytest.mark.slow
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
    """The site's repository link is made from pyproject's URL, not typed."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        url = tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")
    for path in [ROOT / "mkdocs.yml", *(ROOT / "docs").glob("*.md")]:
        assert url not in path.read_text(encoding="utf-8"), f"{path} types the repository URL"
    assert f'href="{url}"' in _page(site, "")


def test_install_instructions_say_what_the_install_cell_does(site):
    """The home page installs the way the notebooks' install cell does (both are nbtool's);
    while nothing is published it says so, and gives the wheel path instead. The README's quick
    start installs from a clone, says whether the package is published, and builds the wheel
    Colab takes the way the home page does."""
    import html as html_lib

    nbtool = _docs_gen("common").nbtool()
    home = html_lib.unescape(re.sub(r"<[^>]+>", "", _page(site, "")))
    readme = README.read_text(encoding="utf-8")
    for text, where, facts in (
            (home, "home page", (nbtool.BUILD_WHEEL, nbtool.WHEEL_ENV, f"jax{nbtool.jax_range()}")),
            (readme, "README", (nbtool.BUILD_WHEEL,))):
        if nbtool.PUBLIC_SOURCE is None:
            assert "not published\nyet" in text or "not published yet" in text, where
            assert "git+" not in text, f"the {where} installs from a repository that is not public"
        else:
            assert nbtool.PUBLIC_SOURCE in text, where
        for fact in facts:
            assert fact in text, f"the {where} does not say {fact!r}"


def test_readme_says_what_the_demo_runs():
    """The README's line about `equarx-ref demo` names exactly the formats the demo runs."""
    import equarx_ref as eq
    from equarx_ref.runs.demo import DEMO_FORMATS

    text = README.read_text(encoding="utf-8")
    line = re.split(r"\n\s*- ", text.split("`equarx-ref demo`:", 1)[1])[0]
    named = {f for f in eq.FORMAT_NAMES if f"`{f}`" in line}
    assert named == set(DEMO_FORMATS) - {"bf16"}, (named, line)
    assert all(f"`{a}`" in line for a in eq.ALGORITHMS), line
    assert "every algorithm x format" not in text


#: Paths the pages cite as examples of files a reader makes (contributing.md: a new notebook).
EXAMPLE_PATHS = {"notebooks/05_topic.ipynb", "notebooks/05_topic.md"}
CITED_PATH = re.compile(r"(?<![\w./-])((?:equarx_ref|notebooks|docs|tests)/[\w.*/-]*[\w*/])")


def test_every_path_the_pages_cite_exists():
    """Every file or folder of the repository that the README, a docs page (the Results page's
    generated text too) or a notebook's text twin names (`equarx_ref/...`, `notebooks/...`,
    `docs/...`, `tests/...`; a glob must match something) exists: a module moved leaves no stale
    path behind."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted(
        (ROOT / "notebooks").glob("[0-9][0-9]_*.md"))]
    texts = [(page, page.read_text(encoding="utf-8")) for page in pages
             if "docs/notebooks" not in page.as_posix()]  # the notebooks' folder, from docs/
    texts.append((ROOT / "docs" / "results.md", _page_markdown("results")))  # its tables' text
    missing = []
    for page, text in texts:
        for path in CITED_PATH.findall(text):
            here = [ROOT, page.parent]  # docs pages also link relative to themselves
            if path in EXAMPLE_PATHS or any(next(base.glob(path), None) for base in here):
                continue
            missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "cited paths that do not exist:\n  " + "\n  ".join(missing)


@pytest.mark.slow
def test_formulas_are_typeset_by_the_vendored_katex(server, tmp_path, capsys):
    dom, shot = _browse(server + "concepts/", tmp_path, "concepts", 2400, capsys)
    marked = dom.count('class="arithmatex"')
    assert marked >= 10, f"only {marked} formulas marked on the Concepts page"
    assert dom.count('class="katex"') >= marked, "KaTeX did not typeset every formula"
    assert not re.search(r'class="arithmatex">\\[(\[]', dom), "a formula left as TeX source"
    _not_blank(shot)
