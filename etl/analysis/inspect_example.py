"""`etl inspect`: one example's text token by token, trained tokens highlighted, turns marked.

Reads one row of `DST/data/<split>` (only its row group, without image bytes) and its rows of
`DST/turns/<split>`, so it stays instant on large outputs. Two renderings: rich styles for a
terminal, and plain text where `[[...]]` wraps every run of trained tokens (for pipes, diffs and
tests). In an image run's example each image's span (`<|vision_start|>`, its pads,
`<|vision_end|>`) shows as one label: `<image 1: 640x427 -> grid 1x30x46, 345 tokens>`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from etl import columns as C
from etl.analysis.inspect_render import (
    TRAIN_CLOSE,
    TRAIN_OPEN,
    collapse_images,
    plain_body,
    rich_body,
    rich_legend,
)
from etl.analysis.stats import image_block
from etl.errors import EtlError
from etl.output.parts import listed_parts, listed_splits, open_part
from etl.tokens.loading import load_tokenizer, load_tokenizer_from_manifest
from etl.tokens.tokenizer import BYTES, TextTokenizer

SHA_SHOWN = 12  # hex digits of a sha256 in messages: enough to tell two tokenizer files apart


def read_example(
    dst: str | os.PathLike[str],
    *,
    split: str = "train",
    row: int | None = None,
    example_id: str | None = None,
) -> dict[str, Any]:
    """One example of `DST/data/<split>` as a dict of its columns (plus `row`, its index).

    Args:
        dst: output folder of `etl run`.
        split: split folder to read.
        row: 0-based row over the split's part files in name order.
        example_id: find the example by `id` instead of by row.

    Raises:
        EtlError: the split does not exist, the row is out of range or the id is not found.
    """
    files = _split_files(dst, C.DATA_DIR, split)
    offset = 0
    for path in files:
        meta = open_part(path)
        # An image run's row group holds its images' bytes (tens of MiB): inspect shows none.
        columns = [name for name in meta.schema_arrow.names if name != C.IMAGES]
        for group in range(meta.num_row_groups):
            n = meta.metadata.row_group(group).num_rows
            if row is not None and offset <= row < offset + n:
                found = meta.read_row_group(group, columns=columns).slice(row - offset, 1)
                return {**found.to_pylist()[0], "row": row}
            if example_id is not None:
                ids = meta.read_row_group(group, columns=[C.ID]).column(C.ID).to_pylist()
                if example_id in ids:
                    index = ids.index(example_id)
                    found = meta.read_row_group(group, columns=columns).slice(index, 1)
                    return {**found.to_pylist()[0], "row": offset + index}
            offset += n
    if example_id is not None:
        raise EtlError(
            f"no example with id {example_id!r} in split {split!r}; check --split, "
            "or pick an example by position with --row N"
        )
    raise EtlError(
        f"row {row} is out of range: split {split!r} has {offset} rows "
        f"(use --row 0..{max(offset - 1, 0)})"
    )


def read_turns(dst: str | os.PathLike[str], *, split: str, example_id: str) -> list[dict[str, Any]]:
    """The rows of `DST/turns/<split>` of one example, by `turn_index` (empty without turns)."""
    # pyarrow.dataset (~400 modules): only when turns are read
    import pyarrow.dataset as ds

    files = [str(p) for p in listed_parts(dst, f"{C.TURNS_DIR}/{split}")]
    if not files:
        return []
    table = ds.dataset(files, format="parquet").to_table(filter=pc.field(C.ID) == example_id)
    return sorted(table.to_pylist(), key=lambda t: t[C.TURN_INDEX])


def token_strings(
    manifest: dict[str, Any], ids: Sequence[int], *, tokenizer: str | None = None
) -> list[str]:
    """Display string of every id, from the tokenizer recorded in the manifest.

    With the `bytes` tokenizer a multi-byte UTF-8 character spans several tokens: it is shown
    whole on its first byte's token, and its other bytes show as "" (one string per id still).

    Args:
        manifest: the run's `_manifest.json`.
        ids: token ids to show.
        tokenizer: a tokenizer path (or `bytes`) to use instead of the manifest's path; it
            must be the same tokenizer (same sha256) as the run's.
    """
    strings = _load_run_tokenizer(manifest, override=tokenizer).token_strings(list(ids))
    if (manifest.get("tokenizer") or {}).get("name") == BYTES:
        strings = _join_utf8(ids, strings)
    return strings


def _load_run_tokenizer(manifest: dict[str, Any], *, override: str | None = None) -> TextTokenizer:
    """The tokenizer a run used: from the manifest's path, or `override`, checked by sha256.

    Raises:
        EtlError: the tokenizer file is missing, or its sha256 is not the one the run recorded
            (ids would show as the wrong text); both messages suggest `--tokenizer PATH`.
    """
    info = manifest.get("tokenizer") or {}
    if info.get("name", BYTES) == BYTES and override in (None, BYTES):
        return load_tokenizer_from_manifest(manifest)  # built-in: nothing to find or check
    recorded = str(info.get("path") or info.get("name") or BYTES)
    if override is None and not Path(recorded).exists():
        raise EtlError(
            f"the run's tokenizer {recorded} is not found (a relative path is from the folder "
            "`etl run` started in); pass the same tokenizer with --tokenizer PATH"
        )
    tok = load_tokenizer(override or recorded)
    if tok.sha256 != info.get("sha256"):
        raise EtlError(
            f"tokenizer {override or recorded} (sha256 {_short(tok.sha256)}) is not the one the run "
            f"used: {recorded} (sha256 {_short(info.get('sha256'))}); pass that tokenizer with "
            "--tokenizer PATH"
        )
    return tok


def _short(sha256: str | None) -> str:
    # None is the built-in `bytes` tokenizer: it has no file to hash.
    return sha256[:SHA_SHOWN] if sha256 else "none: built-in bytes"


def describe(example: dict[str, Any], turns: Sequence[dict[str, Any]]) -> list[str]:
    """Header lines: where the example comes from and its counts."""
    dropped = [t for t in turns if not t[C.KEPT]]
    origin = (
        f"row {example['row']} of {example[C.SPLIT]} · id {example[C.ID]} · "
        f"{example[C.SOURCE_FILE]}:{example[C.SOURCE_LINE]} · domain {example[C.DOMAIN]}"
    )
    counts = (
        f"tokens {example[C.NUM_TOKENS]} · trained {example[C.NUM_TRAINED]} · turns "
        f"{example[C.NUM_TURNS]} ({len(turns) - len(dropped)} kept, {len(dropped)} dropped)"
        f" · truncated {'yes' if example[C.TRUNCATED] else 'no'}"
    )
    lines = [origin, counts, *_image_counts(example)]
    if dropped:
        lines.append(
            "dropped turns: "
            + ", ".join(
                f"{t[C.TURN_INDEX]} ({t[C.ROLE]}, {t[C.NUM_TOKENS]} tokens)" for t in dropped
            )
        )
    return lines


def _image_counts(example: dict[str, Any]) -> list[str]:
    """The header line of an image run's example: its images and their tokens (none for text)."""
    if C.IMAGE_GRID_THW not in example:
        return []
    tokens, total = example[C.NUM_IMAGE_TOKENS], example[C.NUM_TOKENS]
    share = f" ({tokens / total:.0%} of tokens)" if total else ""
    return [f"images {len(example[C.IMAGE_GRID_THW] or [])} · image tokens {tokens}{share}"]


def image_span_ids(manifest: dict[str, Any]) -> list[int] | None:
    """The [start, pad, end] ids of an image's span (the manifest's images block); None for a
    text run."""
    block = image_block(manifest)
    return [int(i) for i in block["span_ids"]] if block and block.get("span_ids") else None


def _tokens(
    example: dict[str, Any],
    turns: Sequence[dict[str, Any]],
    strings: Sequence[str],
    span_ids: Sequence[int] | None,
) -> tuple[Sequence[int], Sequence[bool], Sequence[str], Mapping[int, Sequence[str]], set[int]]:
    """(ids, mask, strings, markers, label positions) to render: in an image run's example with
    images, each image's span one label (`collapse_images`); any other as written."""
    ids, mask, markers = example[C.INPUT_IDS], example[C.LOSS_MASK], _turn_markers(turns)
    if not (span_ids and example.get(C.IMAGE_GRID_THW)):  # text: nothing to look for
        return ids, mask, strings, markers, set()
    images = (span_ids, example.get(C.IMAGE_SIZES) or [], example[C.IMAGE_GRID_THW])
    return collapse_images(ids, mask, strings, markers, images)


def _turn_marker(turn: dict[str, Any]) -> str:
    """The line printed where a kept turn starts."""
    state = "trained" if turn[C.TRAINED] else "not trained"
    return (
        f"── turn {turn[C.TURN_INDEX]} · {turn[C.ROLE]} · tokens "
        f"[{turn[C.START]}, {turn[C.END]}) · {state} ──"
    )


def render_plain(
    example: dict[str, Any],
    turns: Sequence[dict[str, Any]],
    strings: Sequence[str],
    *,
    token_sep: str = "",
    image_span_ids: Sequence[int] | None = None,
) -> str:
    """Plain text: turn markers on their own lines, `[[...]]` around runs of trained tokens.

    Args:
        example: a row from `read_example`.
        turns: its rows from `read_turns`.
        strings: display string per token (`token_strings`).
        token_sep: written between neighbouring tokens of a run, to show token boundaries.
        image_span_ids: an image run's [start, pad, end] ids (`image_span_ids`): each image's
            span shows as one label.
    """
    out = [*describe(example, turns), f"legend: {TRAIN_OPEN}trained tokens{TRAIN_CLOSE}", ""]
    _, mask, shown, markers, _ = _tokens(example, turns, strings, image_span_ids)
    return "\n".join(out) + "\n" + plain_body(mask, shown, markers, token_sep=token_sep)


def render_rich(
    example: dict[str, Any],
    turns: Sequence[dict[str, Any]],
    strings: Sequence[str],
    *,
    special_ids: set[int],
    image_span_ids: Sequence[int] | None = None,
) -> list[Any]:
    """Rich renderables: header, legend, then the tokens, styled by mask, shaded by position
    (`image_span_ids`: as `render_plain`'s, each image one label)."""
    # rich: only for the coloured rendering, not --plain
    from rich.text import Text

    header = Text("\n".join(describe(example, turns)), style="bold")
    ids, mask, shown, markers, labels = _tokens(example, turns, strings, image_span_ids)
    body = rich_body(ids, mask, shown, markers, special_ids=special_ids, image_at=labels)
    return [header, rich_legend(images=C.IMAGE_GRID_THW in example), Text(""), body]


def _join_utf8(ids: Sequence[int], strings: list[str]) -> list[str]:
    out = list(strings)
    pos = 0
    while pos < len(ids):
        lead = ids[pos]
        # Lead bytes 0xC2..0xF4 announce 1..3 continuation bytes (0x80..0xBF).
        size = (
            2
            if 0xC2 <= lead <= 0xDF
            else 3
            if 0xE0 <= lead <= 0xEF
            else 4
            if 0xF0 <= lead <= 0xF4
            else 1
        )
        chunk = list(ids[pos : pos + size])
        if size > 1 and len(chunk) == size and all(0x80 <= b <= 0xBF for b in chunk[1:]):
            try:
                out[pos : pos + size] = [bytes(chunk).decode("utf-8")] + [""] * (size - 1)
            except UnicodeDecodeError:  # overlong or surrogate forms: keep the bytes as they are
                size = 1
        else:
            size = 1
        pos += size
    return out


def _turn_markers(turns: Sequence[dict[str, Any]]) -> dict[int, list[str]]:
    """The marker lines of the kept turns, by the position where each starts."""
    starts: dict[int, list[str]] = {}
    for turn in turns:
        if turn[C.KEPT] and turn[C.START] is not None and turn[C.START] >= 0:
            starts.setdefault(turn[C.START], []).append(_turn_marker(turn))
    return starts


def _split_files(dst: str | os.PathLike[str], folder: str, split: str) -> list[Path]:
    """The parts the manifest lists for the split, checked (sha256 too: inspect is one-off)."""
    files = listed_parts(dst, f"{folder}/{split}", checksum=True)
    if not files:
        splits = listed_splits(dst)
        raise EtlError(
            f"split {split!r} has no Parquet files under {Path(dst) / folder}; "
            f"choose --split from: {', '.join(splits) or '(none: nothing was written)'}"
        )
    return files
