"""Byte units, defined once: every module that counts in KiB, MiB or GiB imports them from here, and
`format_bytes`, the one way the kit writes a byte count for a reader."""

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
_SCALE = {"B": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB}


def format_bytes(n: float, unit: str | None = None, digits: int = 2) -> str:
    """Bytes in binary units: 5.18 GiB, 20.00 MiB, -2.00 MiB, 512 B, in the unit that fits.

    With `unit`, always that one, thousands separated, to `digits` places (`format_bytes(n, "MiB", 1)`:
    1,536.0 MiB), so that figures of one table line up.
    """
    if unit is not None:
        return f"{n / _SCALE[unit]:,.{digits}f} {unit}"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for name in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or name == "GiB":
            return f"{sign}{n:.0f} {name}" if name == "B" else f"{sign}{n:.{digits}f} {name}"
        n /= 1024
    raise AssertionError("unreachable")
