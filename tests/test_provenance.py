"""Stored results (equarx_ref/data/*.json) name the command that made them and are no older
than the code that produces them; the loader the notebooks use says clearly what it has."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from equarx_ref import data

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
from gen import commands, provenance  # noqa: E402

sys.path.remove(str(ROOT / "docs"))


def test_every_stored_result_has_its_command_and_producers():
    stored = set(data.names())
    assert stored == {n.removesuffix(".json") for n in commands.COMMANDS}, (
        "equarx_ref/data/ and docs/gen/commands.py COMMANDS disagree")
    assert stored == set(provenance.PRODUCERS), (
        "equarx_ref/data/ and docs/gen/provenance.py PRODUCERS disagree")
    for name in stored:
        command = commands.COMMANDS[f"{name}.json"]
        assert data.command(name) == command, f"{name}.json was made by another command"
        assert command.endswith(f"--json equarx_ref/data/{name}.json"), command
        result = data.load(name)
        if isinstance(result, dict) and "command" in result:  # the CLI's own record of it
            assert result["command"] == command, name
        assert data.info(name)["sources"]["modules"], name


@pytest.mark.parametrize("name", data.names())
def test_stored_result_is_no_older_than_its_code(name):
    why = provenance.stale(name)
    assert why is None, why


def test_loader_errors_say_what_exists():
    with pytest.raises(ValueError, match=r"no stored result named 'nope'; the package ships "):
        data.load("nope")
    with pytest.raises(ValueError, match=r"without '\.json'"):
        data.load("demo.json")
    with pytest.raises(TypeError, match="a str"):
        data.load(3)
    assert "demo" in data.names() and "multihost-1gbit" in data.names()


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """A copy of the package the digest is taken from, to edit."""
    src = tmp_path / "equarx_ref"
    shutil.copytree(ROOT / "equarx_ref", src,
                    ignore=shutil.ignore_patterns("*.json", "__pycache__"))
    monkeypatch.setattr(provenance, "SRC", src)
    return src


def _digest(name="sweep"):
    return provenance.digest(provenance.modules(name))


def test_digest_ignores_moves_docs_and_imports_but_not_code(package_copy):
    src = package_copy
    before, mods = _digest(), provenance.modules("sweep")
    assert "equarx_ref.formats" in mods and "equarx_ref.runs.sweep" in mods
    formats = src / "formats.py"
    text = formats.read_text(encoding="utf-8")
    # a docstring and a comment edited, an import added: same code
    edited = text.replace('"""', '"""Edited. ', 1).replace(
        "\nimport ", "\n# a note\nimport os\nimport ", 1)
    formats.write_text(edited, encoding="utf-8")
    assert _digest() == before
    # the module moved into a folder, its importers pointed there: same code
    (src / "core").mkdir()
    (src / "core" / "__init__.py").write_text("", encoding="utf-8")
    shutil.move(formats, src / "core" / "formats.py")
    for path in src.rglob("*.py"):
        t = path.read_text(encoding="utf-8")
        t = t.replace("from .formats import", "from .core.formats import")
        t = t.replace("from ..formats import", "from ..core.formats import")
        path.write_text(t, encoding="utf-8")
    (src / "core" / "formats.py").write_text(
        (src / "core" / "formats.py").read_text(encoding="utf-8").replace("from .", "from .."),
        encoding="utf-8")
    moved = provenance.modules("sweep")
    assert "equarx_ref.core.formats" in moved and "equarx_ref.formats" not in moved
    assert _digest() == before
    # a line of code changed: another digest
    path = src / "core" / "formats.py"
    t = path.read_text(encoding="utf-8")
    assert "return " in t
    path.write_text(t.replace("return ", "return 0 or ", 1), encoding="utf-8")
    assert _digest() != before


def test_stale_names_the_command(package_copy, monkeypatch, tmp_path):
    # the digest also covers the stored results the code reads (provenance.READS): they come too
    for name in {n for reads in provenance.READS.values() for n in reads}:
        shutil.copy(ROOT / "equarx_ref" / "data" / f"{name}.json", tmp_path)
    envelope = json.loads((ROOT / "equarx_ref" / "data" / "sweep.json").read_text("utf-8"))
    envelope["sources"]["digest"] = "sha256:" + "0" * 64
    (tmp_path / "sweep.json").write_text(json.dumps(envelope), encoding="utf-8")
    monkeypatch.setattr(provenance, "DATA", tmp_path)
    why = provenance.stale("sweep")
    assert why and "python docs/hooks.py refresh sweep.json" in why and "equarx-ref sweep" in why
