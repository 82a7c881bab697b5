"""Rewriting an installed function from its own source, hunk by hunk.

`kit.patch.pr` applies PR 63155 the way the PR does, to vLLM and to the
replica alike: it edits the few lines the PR changes in each function and
keeps every other line as installed. A `Hunk` is one such edit: the lines as
they stand (compared without their indentation) and the lines that replace
them. `rewrite()` reads the function's source, applies its hunks, and
compiles the result in the function's own module globals, so the new
function sees exactly the names the old one did. If a hunk does not match
exactly once, the installed code is not the code the hunk was written for and
`rewrite()` refuses with a `KitError` naming the function and the line.

The rewritten source is registered with `linecache`, so a traceback through a
patched function shows the patched lines, and `Rewrite.diff()` shows the
change as a unified diff.
"""

import __future__

import difflib
import inspect
import linecache
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kit.errors import KitError

_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag


@dataclass(frozen=True)
class Hunk:
    """Replace `old` (lines compared without indentation) by `new` (indented relative to `old`'s first line)."""

    old: str
    new: str


@dataclass(frozen=True)
class Rewrite:
    """A function rewritten from its source: the original, the new one and both sources."""

    where: str  # module.qualname of the original
    original: Callable[..., Any]
    function: Callable[..., Any]
    old_source: str
    new_source: str
    filename: str

    def diff(self) -> str:
        """The change as a unified diff, labelled with the function's module and name."""
        return "".join(
            difflib.unified_diff(
                self.old_source.splitlines(True),
                self.new_source.splitlines(True),
                fromfile=f"{self.where} (installed)",
                tofile=f"{self.where} (PR 63155)",
            )
        )


def _lines(text: str) -> list[str]:
    return textwrap.dedent(text).strip("\n").splitlines()


def apply_hunk(lines: list[str], hunk: Hunk, where: str, label: str) -> list[str]:
    """`lines` with `hunk` applied; refuses unless its old lines occur exactly once (`label` names the codebase)."""
    old = [line.strip() for line in _lines(hunk.old)]
    starts = [
        i for i in range(len(lines) - len(old) + 1) if all(lines[i + k].strip() == old[k] for k in range(len(old)))
    ]
    if len(starts) != 1:
        found = "is not there" if not starts else f"is there {len(starts)} times"
        raise KitError(f"unsupported {label}: {where}: the line `{old[0]}` {found}; nothing was patched")
    i = starts[0]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    new = [indent + line if line.strip() else "" for line in _lines(hunk.new)]
    return lines[:i] + new + lines[i + len(old) :]


def rewrite(
    function: Callable[..., Any],
    hunks: tuple[Hunk, ...],
    *,
    where: str,
    label: str,
    owner: type | None = None,
    names: dict | None = None,
) -> Rewrite:
    """`function` with `hunks` applied, compiled in its module's globals.

    `label` names the codebase in a refusal (`vLLM 0.33.0`); `owner` is the
    class a method is defined in (its zero-argument `super()` needs it);
    `names` are extra names the new lines use, handed in as closure variables
    so the module's globals stay untouched.
    """
    code_fn = inspect.unwrap(function)
    free = set(code_fn.__code__.co_freevars) - {"__class__"}
    if free:
        raise KitError(f"unsupported {label}: {where} is a closure over {sorted(free)}; nothing was patched")
    try:
        old_source = textwrap.dedent(inspect.getsource(code_fn))
    except (OSError, TypeError) as exc:
        raise KitError(
            f"unsupported {label}: the source of {where} cannot be read ({exc}); nothing was patched"
        ) from None
    lines = old_source.splitlines()
    for hunk in hunks:
        lines = apply_hunk(lines, hunk, where, label)
    new_source = "\n".join(lines) + "\n"
    names = dict(names or {})
    filename = f"<PR 63155: {where}>"
    factory = "\n".join(
        [f"def __kit_rewrite__(__class__, {', '.join(names)}):" if names else "def __kit_rewrite__(__class__):"]
        + ["    " + line if line.strip() else "" for line in lines]
        + [f"    return {code_fn.__name__}"]
    )
    flags = code_fn.__code__.co_flags & _FUTURE_FLAGS
    namespace: dict[str, Any] = {}
    exec(compile(factory, filename, "exec", flags=flags, dont_inherit=True), code_fn.__globals__, namespace)
    new = namespace["__kit_rewrite__"](owner, **names)
    linecache.cache[filename] = (len(factory), None, factory.splitlines(True), filename)
    for obj in {id(new): new, id(inspect.unwrap(new)): inspect.unwrap(new)}.values():
        obj.__qualname__ = code_fn.__qualname__
        obj.__kit_original__ = function
    return Rewrite(where, function, new, old_source, new_source, filename)
