"""The one exception type the kit raises for a user's mistake.

Anything the user can get wrong (a missing file, a corrupt or hostile
snapshot, a malformed workload) ends in a `KitError` whose message is one
short line. The command line prints it and exits 2; notebooks show it as is.
`describe` renders a value from the input for such a message without ever
failing on it (a 10,000-digit integer, a deeply nested list, a huge string);
`check_one_of` is the one refusal of a name outside a known set (a preset, a
scenario, a stream policy).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_MESSAGE = 600


class KitError(Exception):
    """A user-facing error: one line, no traceback needed."""

    def __init__(self, message: str) -> None:
        line = " ".join(str(message).split())
        if len(line) > MAX_MESSAGE:
            line = line[: MAX_MESSAGE - 3] + "..."
        super().__init__(line)


def describe(value: Any, limit: int = 40) -> str:
    """A short rendering of an input value for an error message; never raises."""
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    try:
        size = f" of {len(value)}"
    except Exception:  # noqa: BLE001 - anything without a working len()
        size = ""
    return f"a {type(value).__name__}{size}"


def check_one_of(value: Any, known: Iterable[str], what: str) -> Any:
    """`value`, if it is one of `known`; KitError `unknown <what> <value>: one of <known>` otherwise."""
    known = list(known)
    if value not in known:
        raise KitError(f"unknown {what} {describe(value)}: one of {', '.join(known)}")
    return value


def as_text(value: Any, limit: int = 200) -> str:
    """A value from the input as display text: a short string as it is, anything else as `describe` has it."""
    return value if isinstance(value, str) and len(value) <= limit else describe(value)
