"""What `etl run` says when it finishes, read from the manifest: summary, hints, exit status.

Each function returns the stderr lines (and the status); `etl.commands.run` prints them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow.parquet as pq

from etl.columns import DETAIL, REASON, REJECTS_DIR
from etl.errors import EXIT_EMPTY, EXIT_INCOMPLETE, EXIT_OK
from etl.formats.base import record_keys
from etl.formats.layout_hint import input_type_hint


def summary_lines(manifest: dict[str, Any], dst: str) -> list[str]:
    """The lines of a run without --quiet: mixture notes, the counts, the input-type hint."""
    lines = [f"etl run: {note}" for note in _mixture_notes(manifest)]
    lines.append(_summary(manifest, dst))
    if hint := _format_hint(manifest, dst):
        lines.append(hint)
    return lines


def timing_lines(timings: Mapping[str, float], manifest: dict[str, Any]) -> list[str]:
    """--timings' lines: wall seconds per stage, longest first, then the token cache's line.

    tokenize_plan includes the tokenizer's own time, shown on its own line too; tokenizer
    includes tokenizer_ids (copying ids out of the tokenizer's Python lists into numpy).
    """
    # etl.cache.encoder imports polars (docs/design.md, Measured costs): only --timings needs it
    from etl.cache.encoder import SAVED

    stages = {name: sec for name, sec in timings.items() if name != SAVED}
    shown = ", ".join(f"{name} {sec:.2f}s" for name, sec in sorted(stages.items(), key=lambda kv: -kv[1]))
    lines = [f"etl run timings: {shown}"]
    if line := _cache_line(manifest.get("token_cache"), timings.get(SAVED)):
        lines.append(line)
    return lines


def run_outcome(manifest: dict[str, Any], dst: str, *, quiet: bool,
                timings: Mapping[str, float] | None = None) -> tuple[int, list[str]]:
    """The exit status, and the lines that explain it, shown even with --quiet (after --timings'
    lines: `timing_lines`, when `timings` are given).

    0; 3 when some input was not read to its end; 4 when records were read and none written.
    4 outranks 3: an output with nothing to train on is unusable whatever the cause (a damaged
    file's records rejected as `corrupt_file` included); the damaged inputs are still named.
    Nothing read (an empty file or folder) is an empty dataset, not a failure: 0.
    """
    counts = manifest["counts"]
    empty = bool(counts["read"]) and not counts["written"]
    status, lines = _incomplete(manifest, empty=empty)
    lines = (timing_lines(timings, manifest) if timings is not None else []) + lines
    lines += _header_cut(manifest) + _special_text(manifest)
    if not empty:
        return status, lines
    if quiet and (hint := _format_hint(manifest, dst)):  # the one line that says how to fix it
        lines.append(hint)
    queries = "".join(f" --query {q}" for q, key in (("rejects", "rejected"), ("drops", "dropped")) if counts[key])
    outranks = f", which outranks {EXIT_INCOMPLETE}" if status else ""
    read = "the 1 record read was" if counts["read"] == 1 else f"all {counts['read']:,} records read were"
    lines.append(f"etl run: error: nothing written: {read} rejected or dropped; `etl stats {dst}{queries}` says "
                 f"why (exit status {EXIT_EMPTY}{outranks})")
    return EXIT_EMPTY, lines


def by_reason(counts: Mapping[str, int], *, none: str) -> str:
    """`total (reason n, ...)` of records counted by reason; `none` when there are none."""
    detail = ", ".join(f"{reason} {n:,}" for reason, n in counts.items())
    return f"{sum(counts.values()):,} ({detail})" if detail else none


def _summary(manifest: dict[str, Any], dst: str) -> str:
    """One line: the counts that must add up, and the tokens written."""
    n = manifest["counts"]
    copies = f" + {n['repeated']:,} repeated copies" if n.get("repeated") else ""
    return (
        f"etl run: read {n['read']:,}, written {n['written']:,}{copies} ({n['truncated']:,} truncated), "
        f"dropped {by_reason(n['dropped'], none='0')}, rejected {by_reason(n['rejected'], none='0')}; "
        f"{n['tokens']:,} tokens ({n['trained_tokens']:,} trained) -> {dst}{_template_note(manifest)}"
    )


def _template_note(manifest: dict[str, Any]) -> str:
    """The template the run used (`auto` resolved), which decides every id of the structure."""
    name = (manifest.get("template") or {}).get("name")
    return f" (template {name})" if name else ""


def _mixture_notes(manifest: dict[str, Any]) -> list[str]:
    """One line per source of a mixture whose share needed repeating or was not met."""
    return [s["note"] for s in (manifest.get("mixture") or {}).get("sources", []) if s.get("note")]


def _cache_line(cache: dict[str, Any] | None, saved: float | None) -> str | None:
    """The token cache's line: texts read back, and the tokenizer seconds that saved."""
    if not cache:
        return None
    where = f"token cache {cache['dir']}" if cache["dir"] else "no token cache (--cache DIR keeps one)"
    line = (f"etl run: {where}: {cache['strings']:,} texts, {cache['distinct']:,} distinct per batch, "
            f"{cache['from_cache']:,} read from the cache ({cache['hit_rate']:.1%}), {cache['tokenized']:,} tokenized"
            + (f" ({cache['backend']})" if cache.get("backend") else ""))
    if saved:
        line += (f"; saved ~{saved:.1f}s of tokenizing ({cache['tokens_from_cache']:,} tokens at the rate this "
                 "tokenizer's backend measured)")
    if parsed := cache.get("parsed_chunks"):
        line += f"; {parsed['from_cache']:,} of {parsed['from_cache'] + parsed['parsed']:,} input chunks read back parsed"
    return line


def _format_hint(manifest: dict[str, Any], dst: str) -> str | None:
    """When most records lack the key the input type needs, name the type their keys suggest.

    The keys come from the first `missing_key` reject's detail, which the builder wrote from
    the whole parsed record (`etl.formats.base.with_record_keys`): its `raw` column keeps only
    the first 500 characters, too few to parse a long record.
    """
    counts = manifest["counts"]
    missing = counts["rejected"].get("missing_key", 0)
    if not counts["read"] or missing * 2 < counts["read"]:
        return None
    rejects = pq.read_table(f"{dst}/{REJECTS_DIR}", filters=[(REASON, "=", "missing_key")], columns=[DETAIL])
    keys = record_keys(rejects.column(DETAIL)[0].as_py() if rejects.num_rows else None)
    hint = input_type_hint(missing, keys, manifest["config"]["input_type"])
    return f"etl run: hint: {hint}" if hint else None


def _incomplete(manifest: dict[str, Any], *, empty: bool) -> tuple[int, list[str]]:
    """A warning for every input not read to its end, and the status that says so (unless nothing
    was written: then `run_outcome` names its own)."""
    lost = manifest.get("incomplete_inputs") or []
    lines = [f"etl run: warning: {item['path']}: {_lost(item)} ({item['error']})" for item in lost]
    if lost:
        status = "" if empty else f" (exit status {EXIT_INCOMPLETE})"
        lines.append(f"etl run: warning: {len(lost)} input(s) incomplete; the output holds everything else{status}")
    return (EXIT_INCOMPLETE if lost else EXIT_OK), lines


def _header_cut(manifest: dict[str, Any]) -> list[str]:
    """The warning for examples written without a whole header (`etl.pipeline.truncation.headers_cut`).

    They stay written: DESIGN's whole-turn truncation ends in a hard cut that keeps the final
    end-of-turn, and a long final answer is cut that way at any S; the line says how many and
    how to get whole turns instead (a larger S, or `drop`, which skips what does not fit).
    """
    counts = manifest["counts"]
    if not (cut := counts.get("header_cut")):
        return []
    policy = (manifest.get("config") or {}).get("truncation", "drop_oldest_turns")
    return [(f"etl run: warning: {cut:,} of {counts['written']:,} examples written were cut through a turn's "
            f"header to fit --seq-len {manifest['seq_len']:,} (truncation {policy}: the window starts or ends "
            "inside a turn); raise --seq-len, or pass --truncation drop to drop what does not fit")]


def _special_text(manifest: dict[str, Any]) -> list[str]:
    """The warning for examples whose ids differ from the template's rendering for a reason etl knows:
    a message spells a control token, which etl tokenizes as text (content is data)."""
    counts = manifest["counts"]
    if not (n := counts.get("special_text")):
        return []
    return [(f"etl run: warning: {n:,} of {counts['written']:,} examples written have messages that spell a "
             "control token (e.g. <|im_end|>): tokenized as text, so their ids differ from apply_chat_template's, "
             "which reads it as the token; `etl check-template` shows them")]


def _lost(item: dict[str, Any]) -> str:
    """What became of an input not read to its end (docs/outputs.md "Every input is counted")."""
    n = item["records_read"]
    if item["reason"] == "unreadable_dir":
        return "folder could not be listed"
    if item["reason"] == "corrupt_file":  # read only after its check passed: changed since?
        return (f"failed its integrity check after {n:,} records were used (did it change during the run?)" if n
                else "failed its integrity check; none of its records were used")
    return f"{n:,} records salvaged, the rest lost" if n else "nothing could be read"
