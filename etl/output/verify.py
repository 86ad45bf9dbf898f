"""A manifest is verified before it is trusted: its own checksum, then its facts against the
template it records and against the parts it lists.

`seal` adds RECORD_SHA256 (the sha256 of the record's canonical JSON) to every record etl writes;
`check_manifest` (called by `read_manifest`, so by every reader) refuses a manifest whose checksum
fails, or whose pad/end-of-turn ids disagree with its template; `check_rows` (called by
`etl.output.parts.listed_parts` for each data part, after its sha256 matched) refuses a manifest
whose `seq_len` is below the part's longest row, whose kind is not the part's, or whose vocabulary
the part's ids exceed. Cost: one sha256 of a few KB of JSON plus a footer read each part (already
read for its row count); preference parts read their length columns (4 bytes a row each).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from etl import columns as c
from etl.errors import EtlError, EtlWarning
from etl.kinds import KINDS, SFT

RERUN = "rerun `etl run` to rewrite the output"
# The columns a row of each manifest kind must have, and those holding token ids.
ID_COLUMNS = frozenset({c.INPUT_IDS, c.PROMPT_IDS, c.CHOSEN_IDS, c.REJECTED_IDS, c.COMPLETION_IDS})


def record_digest(body: dict[str, Any]) -> str:
    """sha256 of `body` less RECORD_SHA256 as canonical JSON: the same for any spacing, key order
    or float spelling of the file, different for any change of a value or key.

    Raises:
        ValueError: a value JSON cannot hold (NaN, inf: etl never writes one).
    """
    rest = {k: v for k, v in body.items() if k != c.RECORD_SHA256}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def seal(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its checksum (RECORD_SHA256) set: what every etl record is written as."""
    return {**body, c.RECORD_SHA256: record_digest(body)}


def check_manifest(manifest: Any, path: Path) -> dict[str, Any]:
    """The manifest at `path`, once its checksum and its own facts hold.

    A manifest of format_version 3 or newer must carry its checksum (a one-bit flip of its key's
    name is refused too); one of format_version 2 without it (an etl before checksums) is read
    with a warning, its facts and parts checked all the same.

    Raises:
        EtlError: one line naming `path` and saying to rerun `etl run`.
    """
    if not isinstance(manifest, dict):
        raise EtlError(f"{path} is not a JSON object: the manifest is damaged; {RERUN}")
    version = manifest.get("format_version")
    if check_seal(manifest, path, fix=RERUN, required=not isinstance(version, int)
                  or version >= c.MANIFEST_FORMAT_VERSION) is None and version == c.MANIFEST_FILES_VERSION:
        warnings.warn(f"{path} has no checksum (written by an etl before format_version "
                      f"{c.MANIFEST_FORMAT_VERSION}); its facts and parts are checked, not the manifest "
                      f"itself: {RERUN} to add one", EtlWarning, stacklevel=3)
    _check_facts(manifest, path)
    return manifest


def check_seal(record: dict[str, Any], path: Path, *, fix: str, required: bool) -> str | None:
    """Refuse a record whose RECORD_SHA256 is not the digest of its content, or that lacks one
    while `required` (its format has one); the digest, or None for an older record without.

    Raises:
        EtlError: one line naming `path` and `fix`.
    """
    recorded = record.get(c.RECORD_SHA256)
    if recorded is None:
        if required:
            raise EtlError(f"{path} lacks its checksum `{c.RECORD_SHA256}`: it was changed after etl wrote it; {fix}")
        return None
    try:
        ok = record_digest(record) == recorded
    except ValueError:  # NaN or inf: never written by etl
        ok = False
    if not ok:
        raise EtlError(f"{path} fails its checksum `{c.RECORD_SHA256}`: it was changed after etl wrote it; {fix}")
    return recorded


def _check_facts(m: dict[str, Any], path: Path) -> None:
    """What a manifest says about itself: S a valid length, a known kind, pad and end-of-turn ids
    equal to its template's, every recorded id inside the vocabulary. Keys a hand-built manifest
    leaves out (tests' fixtures) are not asked for; a sealed etl manifest has them all."""
    seq_len, kind = m.get("seq_len"), m.get(c.MANIFEST_KIND, SFT)
    if seq_len is not None and (type(seq_len) is not int or seq_len < c.MIN_SEQ_LEN):
        _refuse(path, f"seq_len {seq_len!r} {c.SEQ_LEN_RULE}")
    if kind not in KINDS:
        _refuse(path, f"kind {kind!r} is none of {', '.join(KINDS)}")
    template, eot, pad = m.get("template"), m.get("eot_id"), m.get("pad_id")
    if isinstance(template, dict):
        specials = m.get("special_ids") if isinstance(m.get("special_ids"), dict) else {}
        ends = {i for r in (template.get("roles") or {}).values() if isinstance(r, dict) for i in r.get("end_ids") or ()}
        want = specials.get(template.get("eot"))
        if (want is not None and eot != want) or (want is None and ends and eot not in ends):
            _refuse(path, f"eot_id {eot!r} is not the end-of-turn id of its template {template.get('name')!r} "
                          f"({want if want is not None else sorted(ends)})")
        if pad != eot:  # etl pads with the end-of-turn id (DESIGN §6)
            _refuse(path, f"pad_id {pad!r} is not its eot_id {eot!r}")
        for key in ("bos_ids", "eos_ids"):
            if key in m and key in template and m[key] != template[key]:
                _refuse(path, f"{key} {m[key]} differ from its template's {template[key]}")
    vocab = (m.get("tokenizer") or {}).get("vocab_size") if isinstance(m.get("tokenizer"), dict) else None
    if isinstance(vocab, int):
        ids = {"eot_id": eot, "pad_id": pad, **{f"special id of {k}": v for k, v in (m.get("special_ids") or {}).items()}}
        for name, value in ids.items():
            if isinstance(value, int) and not 0 <= value < vocab:
                _refuse(path, f"{name} {value} is outside its tokenizer's vocabulary of {vocab:,}")


def _refuse(path: Path, what: str) -> None:
    raise EtlError(f"{path}: {what}: the manifest was changed after etl wrote it; {RERUN}")


def check_rows(manifest: dict[str, Any], part: Path, meta: pq.FileMetaData, record: Path) -> None:
    """The manifest's facts against one data part that matched its sha256: its kind's columns are
    there, no row is longer than S, every id lies inside the vocabulary. From the footer's
    statistics (num_tokens and the ids' min/max: no data read); preference and unpaired parts read
    their length columns (4 bytes a row each), as does a part without stats.

    Raises:
        EtlError: one line naming the manifest, the part and the fix.
    """
    kind = manifest.get(c.MANIFEST_KIND) or SFT
    names = set(meta.schema.to_arrow_schema().names)
    if missing := [n for n in KINDS[kind].columns if n not in names]:
        _refuse(record, f"kind {kind!r}, but {part} lacks {', '.join(missing)}")
    seq_len = manifest.get("seq_len")
    if isinstance(seq_len, int) and (longest := _longest(manifest, kind, part, meta)) > seq_len:
        _refuse(record, f"seq_len {seq_len:,}, but {part} holds a row of {longest:,} tokens")
    tok = manifest.get("tokenizer")
    vocab = tok.get("vocab_size") if isinstance(tok, dict) else None
    if isinstance(vocab, int) and (span := _id_span(meta)) is not None and not 0 <= span[0] <= span[1] < vocab:
        _refuse(record, f"a vocabulary of {vocab:,}, but {part} holds ids {span[0]:,}..{span[1]:,}")


def _longest(manifest: dict[str, Any], kind: str, part: Path, meta: pq.FileMetaData) -> int:
    """The longest row as S measures it: an SFT row's num_tokens (footer max), a pair's
    prompt + max(chosen, rejected) (`shared` fit: prompt + chosen + rejected, its num_tokens)."""
    if not (sides := KINDS[kind].sides):
        maxima = _column_maxima(meta, c.NUM_TOKENS)
        if maxima is not None:
            return max(maxima, default=0)
        if c.NUM_TOKENS in meta.schema.to_arrow_schema().names:
            return int(pc.max(pq.read_table(part, columns=[c.NUM_TOKENS])[0]).as_py() or 0)
        return int(pc.max(pc.list_value_length(pq.read_table(part, columns=[c.INPUT_IDS])[0])).as_py() or 0)
    fit = (manifest.get("preference") or {}).get("fit", "separate")
    if KINDS[kind].paired and fit == "shared":  # prompt + chosen + rejected
        sides = (c.NUM_TOKENS,)
    table = pq.read_table(part, columns=[c.NUM_PROMPT_TOKENS, *sides])
    cols = [np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64) for col in table.columns]
    rows = cols[1] if len(sides) == 1 and sides[0] == c.NUM_TOKENS else cols[0] + np.max(cols[1:], axis=0)
    return int(rows.max(initial=0))


def _column_maxima(meta: pq.FileMetaData, name: str) -> list[int] | None:
    """Per row group max of a top-level int column from the footer; None when any group lacks it."""
    leaves = [meta.schema.column(j).path for j in range(meta.num_columns)]
    if name not in leaves:
        return None
    j = leaves.index(name)
    out = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(j).statistics
        if stats is None or not stats.has_min_max:
            return None
        out.append(int(stats.max))
    return out


def _id_span(meta: pq.FileMetaData) -> tuple[int, int] | None:
    """(min, max) token id over the part's id columns, from the footer; None when stats lack."""
    lo, hi = None, None
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for j in range(group.num_columns):
            col = group.column(j)
            if col.path_in_schema.split(".")[0] not in ID_COLUMNS or col.num_values == 0:
                continue
            stats = col.statistics
            if stats is None or not stats.has_min_max:
                continue  # an all-empty list column has none; nothing to check there
            lo = stats.min if lo is None else min(lo, stats.min)
            hi = stats.max if hi is None else max(hi, stats.max)
    return None if lo is None else (int(lo), int(hi))
