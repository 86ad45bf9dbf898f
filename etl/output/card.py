"""The dataset card `DST/README.md`: YAML `configs` that name the exact parts of each split, so
`datasets.load_dataset(DST)` (and `load_dataset(DST, "turns")`) reads what the run wrote and no
stray file, plus a short description. It is a file of the run like a part: journaled, listed in
the manifest, replaced by the next run; a README.md etl did not write is left alone.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from etl import columns as c
from etl.errors import EtlWarning
from etl.kinds import KINDS, SFT
from etl.output.ownership import tmp_of
from etl.output.parquet import KIND_SCHEMAS, TURNS_SCHEMA, data_schema
from etl.output.writer import OutputWriter

# Config name -> folder of parts. `default` is what `load_dataset(DST)` returns.
CONFIGS = {"default": c.DATA_DIR, "turns": c.TURNS_DIR}
GUIDE = "etl's docs, docs/training.md 'Training with TRL and HF datasets'"


def _split_files(files: list[dict[str, Any]], folder: str) -> dict[str, list[str]]:
    """Hugging Face split name -> the part paths of `folder/<split>/` in `files`, train first."""
    found = {}
    for split in c.SPLITS:
        prefix = f"{folder}/{split}/"
        paths = [f["path"] for f in files if f["path"].startswith(prefix) and f["path"].endswith(".parquet")]
        if paths:
            found[c.HF_SPLITS[split]] = sorted(paths)
    return found


def _front_matter(files: list[dict[str, Any]], kind: str = SFT) -> list[str]:
    """YAML by hand (no PyYAML dependency; fixed order, so the bytes are deterministic). Paths are
    etl's own `<folder>/<split>/part-NNNNN.parquet`: plain scalars, no glob characters."""
    lines = []
    for name, folder in CONFIGS.items():
        splits = _split_files(files, folder)
        if splits:
            lines += [f"- config_name: {name}", "  data_files:"]
            for split, paths in splits.items():
                lines += [f"  - split: {split}", "    path:", *(f"    - {p}" for p in paths)]
    # No data (every record dropped): `configs: []` lets datasets say there is nothing to load.
    return ["---", "configs:" if lines else "configs: []", *lines, "tags:", "- etl", f"- {kind}", "---"]


def _rows(files: list[dict[str, Any]]) -> list[str]:
    rows = {f["path"]: f["rows"] or 0 for f in files}
    table = ["| split | folder | examples | parts |", "|---|---|---|---|"]
    for split, paths in _split_files(files, c.DATA_DIR).items():
        folder = paths[0].rsplit("/", 1)[0]
        table.append(f"| {split} | `{folder}/` | {sum(rows[p] for p in paths):,} | {len(paths)} |")
    return table


def _template_text(manifest: dict[str, Any]) -> str:
    """The template the run used (`auto` resolved: the manifest never holds it) and the system
    prompt it gave a conversation that had none (`default_system`, resolved the same way)."""
    config, name = manifest.get("config") or {}, manifest["template"]["name"]
    text = f"template `{name}`" + (" (the tokenizer's own chat_template)" if name == "hf" else "")
    if "default_system" not in config or config.get("input_type") == "text":
        return text
    system = config["default_system"]
    given = "none" if system is None else json.dumps(system, ensure_ascii=False)
    return f"{text}, default system prompt {given}"


def _columns(kind: str, weights: bool) -> list[str]:
    if KINDS[kind].pair:
        return [(f"- `data/<split>/`: {', '.join(KIND_SCHEMAS[kind].names)}. {KINDS[kind].card.masks} is false on a "
                 "completion token that is not trained (a tool result inside a multi-turn completion).")]
    return [(f"- `data/<split>/`: {', '.join(data_schema(weights=weights).names)}. `loss_mask[i]`"
             " (and `assistant_masks[i]`) is true where `input_ids[i]` is a training target."),
            (f"- `turns/<split>/`: {', '.join(TURNS_SCHEMA.names)}; start and end are token offsets in"
             " `input_ids` (-1: turn dropped by truncation).")]


def card_text(files: list[dict[str, Any]], manifest: dict[str, Any], *, weights: bool) -> str:
    """The card's text, from the run's file entries and manifest only (no time, no DST path)."""
    tok, counts, seq_len = manifest["tokenizer"], manifest["counts"], manifest["seq_len"]
    kind = manifest.get(c.MANIFEST_KIND, SFT)
    what, rows, use, _ = KINDS[kind].card
    sha = f", sha256 {tok['sha256'][:12]}" if tok.get("sha256") else ""
    lost = sum(counts["dropped"].values()) + sum(counts["rejected"].values())
    turns = [] if KINDS[kind].pair else ['turns = load_dataset("path/to/this/folder", "turns")  # one row per turn']
    return "\n".join([
        *_front_matter(files, kind),
        "",
        "# etl output",
        "",
        (f"Tokenized {what} written by `etl run` (etl {manifest['etl_version']}): tokenizer "
         f"`{tok['name']}`{sha}, {_template_text(manifest)}, seq_len {seq_len}. Read {counts['read']:,} "
         f"records, wrote {counts['written']:,} {rows} ({counts['truncated']:,} truncated), dropped or "
         f"rejected {lost:,}."),
        "",
        *_rows(files),
        "",
        "## Load",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'ds = load_dataset("path/to/this/folder")              # train [, validation]: one row per {rows[:-1]}',
        *turns,
        "```",
        "",
        *(line.format(seq_len=seq_len) for line in use),
        "",
        "## Columns",
        "",
        *_columns(kind, weights),
        "",
        f"`{c.MANIFEST_FILE}` holds the config, tokenizer, template ids, counts with reasons, and",
        f"every file etl wrote (path, rows, bytes, sha256); `{c.REJECTS_DIR}/` the records it could not",
        "use. etl wrote this card; its next run into this folder replaces it (an edited card is kept).",
        "",
    ])


def write_card(output: OutputWriter, manifest: dict[str, Any], *, weights: bool) -> Path | None:
    """Write `README.md` through the run's writer (journal, temp name + rename, file list).

    Call it after the last part, so the card lists every part. A README.md already there is not
    etl's (the writer removed the previous run's card, unless it was edited): it is kept, no card
    is written and one warning says so; the run still succeeds.

    Returns:
        The card's path, or None when it was skipped.
    """
    path = output.root / c.CARD_FILE
    if path.exists() or path.is_symlink():
        warnings.warn(
            f"{path} is not etl's (yours, or a card etl wrote that was edited): left as it is and "
            f"no dataset card written; `datasets.load_dataset` reads its `configs` (see the {GUIDE})",
            EtlWarning,
            stacklevel=2,
        )
        return None
    text = card_text(output.files(), manifest, weights=weights)
    output.reserve(path)
    tmp = tmp_of(path)
    tmp.write_bytes(text.encode("utf-8"))
    os.replace(tmp, path)
    output.add(path)
    return path
