"""mkdocs hooks: the glue between the pages and their generated parts, which live in docs/gen/.

- Nav: the "Course" section lists every notebook in notebooks/ (`gen.course.notebooks`).
- Markers: a page writes `<!-- gen:NAME -->`; `gen.GENERATORS[NAME]` makes what replaces it, and
  the figures it links to are added to the site as generated files.
- Notebook pages: the nbval markers (`# NBVAL_CHECK_OUTPUT`, `# NBVAL_IGNORE_OUTPUT`) tell the
  tests which outputs to compare; they are taken out of the rendered code, not out of the files.
  An image from another host (the Colab badge) is shown as its alt text in a button, so that
  the site loads nothing from elsewhere; its link stays. A link from one notebook to another
  (`02_ring_allreduce.ipynb`, right for Jupyter and Colab, where they sit side by side) is
  pointed at that notebook's page (`../02_ring_allreduce/`), since each page is a directory.
  mkdocs-jupyter makes the contents' links from a heading's text without its `code` while
  the heading's id keeps it (`#5-the-packages` for `5-the-packages-all_reduce`): such a link is
  pointed at the one heading whose id it begins.
- Repository URL: from pyproject's `[project.urls] Repository`, the one place it lives.
- API pages' contents (the sidebar, with `toc.integrate`) list the page's sections and modules,
  not every function and class of them (`API_TOC_LEVEL`); the members keep their anchors.

As a script, from the repository root:

    python docs/hooks.py refresh [FILE ...]   rerun the commands behind equarx_ref/data/*.json,
                                              then rewrite the README's headline from them
    python docs/hooks.py readme               only rewrite the README's headline
"""

from __future__ import annotations

import re
import sys

# docs/ is on sys.path while mkdocs loads this file, and when it runs as a script.
import gen
from gen import commands, course, readme
from gen.common import repo_url
from mkdocs.structure.files import File

MARKER = re.compile(r"<!-- gen:([a-z0-9_-]+) -->")
# A line of a cell that is only an nbval marker, as rendered in a notebook's page: in the
# highlighted code (a Pygments comment span) and in the text the copy button copies.
NBVAL_LINE = re.compile(r'<span class="c1"># NBVAL_[A-Z_]+</span>\n|(?<=[>\n])# NBVAL_[A-Z_]+\n')
# A link to a sibling notebook, as the notebooks write it (Jupyter and Colab resolve it).
NOTEBOOK_LINK = re.compile(r'href="(\d\d_[\w-]+)\.ipynb(#[^"]*)?"')
HEADING_ID = re.compile(r'<h[1-6] id="([^"]+)"')
IN_PAGE_LINK = re.compile(r'href="#([^"]+)"')
# An image loaded from another host, as nbconvert renders markdown: `![alt](https://...)`.
REMOTE_IMG = re.compile(r'<img alt="([^"]*)" src="(?:https?:)?//[^"]*"\s*/?>')
_SECTIONS: dict[str, gen.Section] = {}


def _section(name: str) -> gen.Section:
    if name not in _SECTIONS:
        if name not in gen.GENERATORS:
            raise KeyError(f"docs: no generator for <!-- gen:{name} --> "
                           f"(known: {sorted(gen.GENERATORS)}; see docs/gen/__init__.py)")
        _SECTIONS[name] = gen.GENERATORS[name]()
    return _SECTIONS[name]


def on_config(config):
    url = repo_url()
    config["repo_url"] = url
    config["repo_name"] = url.removeprefix("https://github.com/")
    for i, entry in enumerate(config["nav"]):
        ((key, _),) = entry.items()
        if key == "Course":
            config["nav"][i] = {key: [{title: path} for title, path in course.notebooks()]}
    return config


def on_files(files, config):
    # Generate every marked section now, so that the figures exist before links are checked.
    _SECTIONS.clear()
    figures: dict[str, bytes] = {}
    for page in files.documentation_pages():
        if page.src_uri.endswith(".md"):
            for name in MARKER.findall(page.content_string):
                figures.update(_section(name).figures)
    for path, png in figures.items():
        files.append(File.generated(config, path, content=png))
    return files


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: _section(m.group(1)).markdown, markdown)


API_TOC_LEVEL = 2  # on docs/api/ pages, headings deeper than this stay out of the contents


def on_page_context(context, page, config, nav):
    if page.file.src_uri.startswith("api/"):
        _prune(page.toc, API_TOC_LEVEL)
    return context


def _prune(items, level: int) -> None:
    for item in items:
        if item.level >= level:
            item.children = []
        else:
            _prune(item.children, level)


def on_post_page(output, page, config):
    if page.file.src_uri.endswith(".ipynb"):
        output = NBVAL_LINE.sub("", output)
        output = NOTEBOOK_LINK.sub(lambda m: f'href="../{m.group(1)}/{m.group(2) or ""}"', output)
        output = _link_headings(output)
        return REMOTE_IMG.sub(r'<span class="md-button">\1</span>', output)
    return output


def _link_headings(output: str) -> str:
    """In-page links to no id, pointed at the one heading id they begin (module essay)."""
    ids = set(HEADING_ID.findall(output))

    def fix(m):
        if m.group(1) in ids:
            return m.group(0)
        hits = [i for i in ids if i.startswith(m.group(1))]
        return f'href="#{hits[0]}"' if len(hits) == 1 else m.group(0)

    return IN_PAGE_LINK.sub(fix, output)


if __name__ == "__main__":
    if sys.argv[1:2] == ["refresh"]:
        commands.refresh(sys.argv[2:])
        print("README.md updated" if readme.update() else "README.md unchanged")
    elif sys.argv[1:] == ["readme"]:
        print("README.md updated" if readme.update() else "README.md unchanged")
    else:
        raise SystemExit("usage: python docs/hooks.py refresh [demo.json ...] | readme")
