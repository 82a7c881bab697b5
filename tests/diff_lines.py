"""What a patched function's diff changes, line by line, against what the PR's hunks change.

Shared by tests/test_vllm_patch.py and tests/test_replica.py: a rewrite that
keeps every installed line removes and adds exactly the lines its hunks
change, no more (a line lost or doubled) and no fewer (a hunk not applied).
"""

from __future__ import annotations

import difflib
import textwrap
from collections import Counter


def hunk_changes(hunks) -> tuple[Counter, Counter]:
    """The lines (stripped) the hunks remove and add, each hunk's old lines against its new ones."""
    removed, added = Counter(), Counter()
    for hunk in hunks:
        old, new = (
            [line.strip() for line in textwrap.dedent(t).strip("\n").splitlines()] for t in (hunk.old, hunk.new)
        )
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
            removed.update(old[i1:i2] if tag in ("replace", "delete") else [])
            added.update(new[j1:j2] if tag in ("replace", "insert") else [])
    return removed, added


def diff_changes(diff: str) -> tuple[Counter, Counter]:
    """The lines (stripped) a unified diff removes and adds."""
    lines = diff.splitlines()
    removed = Counter(line[1:].strip() for line in lines if line.startswith("-") and not line.startswith("---"))
    added = Counter(line[1:].strip() for line in lines if line.startswith("+") and not line.startswith("+++"))
    return removed, added
