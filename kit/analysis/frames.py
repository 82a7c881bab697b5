"""Stack frames of a trace entry as one short line, for verdicts and tables."""

from __future__ import annotations

from kit.errors import as_text


def frame_line(frames: list) -> str:
    """The first three frames as `name (file:line) < name (file:line) < ...`."""

    def one(f: dict) -> str:
        filename = as_text(f.get("filename", "?")).rsplit("/", 1)[-1]
        return f"{as_text(f.get('name', '?'))} ({filename}:{as_text(f.get('line', '?'))})"

    return " < ".join(one(f) for f in frames[:3] if isinstance(f, dict))


# Frames that say nothing about the program: torch itself, code inductor generated
# (hashed file names in its cache), and the kit's own recorder.
NOT_USER = ("/torch/", "torchinductor", "/kit/record/")


def is_user_frame(frame: object) -> bool:
    """Whether a stack frame is the program's own Python: not torch's, inductor's or the recorder's."""
    if not isinstance(frame, dict):
        return False
    filename = as_text(frame.get("filename", ""))
    return filename.endswith(".py") and not any(part in filename for part in NOT_USER)


def user_frame_line(frames: list, n: int = 3) -> str:
    """The program's own first `n` frames as one line; torch's first frames when there are none."""
    mine = [f for f in frames or () if is_user_frame(f)]
    return frame_line(mine[:n]) if mine else frame_line(frames or [])


def first_user_frame(frames: list) -> str:
    """The first stack frame outside torch itself, as `name (file:line)`."""
    for f in frames or ():
        if isinstance(f, dict) and "/torch/" not in as_text(f.get("filename", "")):
            return frame_line([f])
    return frame_line(frames[:1]) if frames else ""
