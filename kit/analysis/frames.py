"""Stack frames of a trace entry as one short line, for verdicts and tables."""

from __future__ import annotations

from kit.errors import as_text


def frame_line(frames: list) -> str:
    """The first three frames as `name (file:line) < name (file:line) < ...`."""

    def one(f: dict) -> str:
        filename = as_text(f.get("filename", "?")).rsplit("/", 1)[-1]
        return f"{as_text(f.get('name', '?'))} ({filename}:{as_text(f.get('line', '?'))})"

    return " < ".join(one(f) for f in frames[:3] if isinstance(f, dict))


def first_user_frame(frames: list) -> str:
    """The first stack frame outside torch itself, as `name (file:line)`."""
    for f in frames or ():
        if isinstance(f, dict) and "/torch/" not in as_text(f.get("filename", "")):
            return frame_line([f])
    return frame_line(frames[:1]) if frames else ""
