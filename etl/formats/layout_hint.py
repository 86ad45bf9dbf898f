"""The input type a record's keys suggest, when records lack the keys their input type reads.

`etl run` and `etl check-template` read the keys from the first `missing_key` reject's detail
(`etl.formats.base.record_keys`), which the builder wrote from the whole parsed record.
"""

from __future__ import annotations

from collections.abc import Iterable

# Keys that identify a known record layout, and the input type that reads it (first match wins).
KEY_HINTS = (
    ("conversations", "sharegpt"),
    ("messages", "chat"),
    ("instruction", "instruction"),
    ("completion", "prompt_completion"),
    ("chosen", "transcript"),
    ("text", "text"),
)


def input_type_hint(missing: int, keys: Iterable[str], current: str) -> str | None:
    """`missing` records of input type `current` lack its keys: the type `keys` suggest, in words.

    None when no other input type reads a layout with these keys.
    """
    keys = set(keys)
    kind = next((kind for key, kind in KEY_HINTS if key in keys and kind != current), None)
    if kind is None:
        return None
    return (f"{missing:,} records lack the keys input type {current!r} reads; they have "
            f"{sorted(keys)}: try --input-type {kind} (options in --config)")
