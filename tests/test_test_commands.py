"""The commands README gives for the tests say what they do and how long they take.

A newcomer read "bash tests/run.sh" with no duration (it ran over an hour) and, as root, saw it
install chromium unannounced. The quick start now names the fast loop and the full run, each
with its minutes; `docs/contributing.md` says the same; `tests/run.sh` takes `--fast` (the tests
not marked slow) and leaves apt alone under EQUARX_NO_APT=1.
"""

import pathlib
import re
import subprocess
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONTRIBUTING = (ROOT / "docs" / "contributing.md").read_text()
RUN = (ROOT / "tests" / "run.sh").read_text()


def _minutes(text: str, command: str) -> int:
    """The minutes `text` gives for `command`, in "COMMAND ... about N min" within a line or two."""
    m = re.search(re.escape(command) + r"[^\n]*?(?:\n[^\n]*?){0,2}?about (\d+) min", text)
    assert m, f"no 'about N min' after {command!r}"
    return int(m.group(1))


def test_the_quick_start_gives_each_test_command_its_minutes():
    block = re.search(r"<!-- test-command -->\n```bash\n(.*?)\n```\n<!-- /test-command -->",
                      README, re.S)
    assert block and block.group(1).strip() == "bash tests/run.sh", "the CI command changed"
    fast, full = _minutes(README, "bash tests/run.sh --fast"), _minutes(README, "as CI runs it")
    assert 0 < fast <= 5 and fast < full <= 90, (fast, full)  # 90: CI's hard limit
    assert "FASTMIN" not in README + CONTRIBUTING and "FULLMIN" not in README + CONTRIBUTING
    # contributing.md gives the same commands and the same minutes
    assert _minutes(CONTRIBUTING, "bash tests/run.sh --fast") == fast
    assert _minutes(CONTRIBUTING, "as CI runs it") == full


def test_the_quick_start_says_what_root_installs_and_how_to_stop_it():
    assert "chromium" in README and "EQUARX_NO_APT=1" in README
    apt = RUN.index("apt-get update")  # said first, and skipped under EQUARX_NO_APT
    assert RUN.index("EQUARX_NO_APT") < RUN.index("as root: apt-get install chromium") < apt


def test_the_fast_loop_is_the_tests_not_marked_slow():
    assert '-m "not slow"' in RUN[RUN.index('if [ "$mode" = fast ]'):]
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]
    assert "--strict-markers" in options["addopts"]
    assert any(m.startswith("slow:") for m in options["markers"])
    slow = sum(p.read_text().count("@pytest.mark.slow") for p in (ROOT / "tests").glob("*.py"))
    assert slow >= 50, slow  # the cases of many CPU-seconds are marked


def test_run_sh_refuses_arguments_to_fast_in_one_line():
    out = subprocess.run(["bash", str(ROOT / "tests" / "run.sh"), "--fast", "tests/x.py"],
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "EQUARX_NO_APT": "1"})
    assert out.returncode == 2 and out.stderr.strip() == "tests/run.sh: --fast takes no arguments"
