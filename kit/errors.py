"""The one exception type the kit raises for a user's mistake.

Anything the user can get wrong (a missing file, a corrupt or hostile
snapshot, a malformed workload) ends in a `KitError` whose message is one line.
The command line prints it and exits 2; notebooks show it as is.
"""


class KitError(Exception):
    """A user-facing error: one line, no traceback needed."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
