"""Read `DST/_manifest.json`: the config, tokenizer, template, ids, counts and files of a run
(`etl.output.ownership.OutputWriter.commit` writes it, last)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from etl.columns import MANIFEST_FILE
from etl.errors import EtlError


def read_manifest(dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Load the manifest of a finished run, or raise an `EtlError` that says what to run."""
    path = Path(dst) / MANIFEST_FILE
    if not path.is_file():
        raise EtlError(
            f"{path} not found: {dst} is not a finished etl output; run `etl run SRC {dst}` first"
        )
    return json.loads(path.read_text(encoding="utf-8"))
