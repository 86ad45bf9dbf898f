"""Read `DST/_manifest.json`: the config, tokenizer, template, ids, counts and files of a run
(`etl.output.writer.OutputWriter.commit` writes it, last)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from etl.columns import MANIFEST_FILE
from etl.errors import EtlError


def read_manifest(dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Load the manifest of a finished run, verified (`etl.output.verify.check_manifest`), or raise
    an `EtlError` that says what to run."""
    # verify imports numpy and pyarrow: here, not at the top, so that commands importing this module
    # (etl inspect, etl pack) build their --help without them (tests/commands/test_help_imports.py).
    from etl.output.verify import RERUN, check_manifest

    path = Path(dst) / MANIFEST_FILE
    if not path.is_file():
        if (root := _output_above(Path(dst))) is not None:
            raise EtlError(f"{dst} is inside the etl output {root}; pass {root} itself (DST is the folder "
                           f"that holds {MANIFEST_FILE})")
        raise EtlError(
            f"{path} not found: {dst} is not a finished etl output; run `etl run SRC {dst}` first"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # a torn or bit-flipped file: JSONDecodeError, UnicodeDecodeError
        raise EtlError(f"{path} is unreadable ({str(exc).splitlines()[0]}): the manifest is damaged; "
                       f"{RERUN}") from exc
    return check_manifest(manifest, path)  # its checksum and facts, before anyone trusts it


def _output_above(folder: Path) -> Path | None:
    """The etl output `folder` lies in (DST/data/train/part-00000.parquet is 3 levels down), if any."""
    for parent in folder.absolute().parents[:3]:
        if (parent / MANIFEST_FILE).is_file():
            return parent
    return None
