"""Byte units, defined once: every module that counts in KiB, MiB or GiB imports them from here."""

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
