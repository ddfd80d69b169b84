"""No branch in ``sidecar_fsm/`` rests on human text: errors by errno or type, the proxy by data.

The proxy says what it is (``-describe``) and why a start failed (its exit code); an OS error
says why by its errno. Words (a help line, a log line, our own reason strings) may be reworded at
any time, so a branch on them changes behaviour silently. This greps the package for the shapes
such a branch took (issue 37) and fails naming the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

import sidecar_fsm

PACKAGE = Path(sidecar_fsm.__file__).parent

BRANCHES_ON_TEXT = re.compile(
    r"""(?x)
    \bin\s+str\((?:exc|error|err|e)\)       # "words" in str(exc)
    | \bin\s+(?:log_tail|\w*usage\w*)\b     # a log tail or help text searched
    | "\s+in\s+\w+\.(?:stdout|stderr)\b     # words in a child's output
    | \b(?:reason|strerror|message)\s*==    # an error compared by its words
    | \.endswith\(":"\)                     # a heading line told by its colon
    | already\ in\ use"\s+in\b
    """
)
# Python 3.10's sqlite3 errors carry no error code; from 3.11 the code decides (state/store.py).
ALLOWED = {("state/store.py", 'else "locked" in str(exc)')}


def test_no_branch_on_human_text() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if BRANCHES_ON_TEXT.search(code) and not any(name == f and s in code for f, s in ALLOWED):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []


def test_the_pattern_finds_what_it_is_for() -> None:
    for line in (
        'clash = [line for line in tail if "address already in use" in line]',
        'reports_listen="listen" in ready_usage and "json" in ready_usage',
        'if reason == "permission denied":',
        'telling = [line for line in lines if not line.endswith(":")]',
        'if "timed out" in str(error):',
        'if "not defined" in result.stderr:',
    ):
        assert BRANCHES_ON_TEXT.search(line), line
