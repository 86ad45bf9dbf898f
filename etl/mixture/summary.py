"""A mixture's line per source in the manifest: what it had, what the mix kept, its shares, a note.

Counts per source add up as a run's do: records the mix left out are dropped as `not_drawn`,
and copies beyond the first are counted apart (`repeated`), so data rows = written + repeated.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from etl import columns as c
from etl.config.run_config import RunSource
from etl.pipeline.accounting import Counts

NOT_DRAWN = "not_drawn"  # drop reason of the records a mixture's down-sampling left out
SHARE_TOLERANCE = 0.01  # realised share within 1% (absolute) of the requested one: "share_met"


@dataclass
class Staged:
    """One source's staged data parts (path, folder, rows) and the sizes of their rows, in order."""

    parts: list[tuple[Path, str, int]]
    sizes: pa.Table

    def units(self, mix_by: str) -> np.ndarray:
        """Per example: its tokens, or 1 (mix_by examples)."""
        if mix_by == "examples":
            return np.ones(self.sizes.num_rows, dtype=np.int64)
        return self.sizes.column(c.NUM_TOKENS).to_numpy().astype(np.int64)

    def totals(self, cp: np.ndarray) -> dict[str, int]:
        """Examples, tokens and trained tokens of these rows taken `cp` times each."""
        tokens = self.sizes.column(c.NUM_TOKENS).to_numpy().astype(np.int64)
        trained = self.sizes.column(c.NUM_TRAINED).to_numpy().astype(np.int64)
        return {"examples": int(cp.sum()), "tokens": int((cp * tokens).sum()),
                "trained_tokens": int((cp * trained).sum())}



def entry(source: RunSource, staged: Staged, cp: np.ndarray, counts: Counts, mix_by: str) -> dict[str, Any]:
    """A source's line of the manifest's mixture: what it had, what the mix kept, its counts."""
    kept = cp > 0
    truncated = staged.sizes.column(c.TRUNCATED).to_numpy(zero_copy_only=False)
    after = dataclasses.replace(counts, dropped=Counter(counts.dropped), written=int(kept.sum()),
                                truncated=int((truncated & kept).sum()), repeated=int((cp - kept).sum()))
    if (~kept).any():
        after.dropped[NOT_DRAWN] += int((~kept).sum())
    mixed = staged.totals(cp)
    after.tokens, after.trained_tokens = mixed["tokens"], mixed["trained_tokens"]
    assert after.add_up(), after
    units = staged.units(mix_by)
    units_before, units_after = units.sum(), units @ cp
    return {"name": source.name, "domain": source.domain, "path": source.path, "weight": source.weight,
            "epochs": source.epochs, "before": staged.totals(np.ones(len(cp), dtype=np.int64)),
            "counts": after.to_json(), "repeat": round(float(units_after / units_before), 4) if units_before else None,
            "_units": int(units_after), "_counts": after}


def shares_realised(entries: list[dict[str, Any]], shares: np.ndarray, *, weighted: bool) -> None:
    """Requested and realised shares of each source, and a one-line note where they differ."""
    units = np.array([e.pop("_units") for e in entries], dtype=np.float64)
    realised = units / units.sum() if units.sum() else np.zeros_like(units)
    for entry, want, got in zip(entries, shares, realised, strict=True):
        entry["requested_share"], entry["realised_share"] = round(float(want), 4), round(float(got), 4)
        entry["share_met"] = bool(abs(got - want) <= SHARE_TOLERANCE)
        entry["note"] = _note(entry, float(want), weighted=weighted)


def _note(entry: dict[str, Any], share: float, *, weighted: bool) -> str | None:
    """What to tell the user about a source whose share needed repeating, or was not met."""
    repeat, name, realised = entry["repeat"], entry["name"], entry["realised_share"]
    if repeat is None:
        return f"source {name} has no examples to mix; the other sources keep their proportions"
    if not weighted:
        return None
    if not entry["share_met"] and entry["epochs"] is not None:
        return (f"source {name} is too small for its {share:.1%} share within epochs={entry['epochs']:g}: "
                f"it makes {realised:.1%} of the mixture")
    if repeat > 1.0 + 1e-9:
        return (f"source {name} is too small for its {share:.1%} share without repeating: repeated "
                f"{repeat:.2f}x (its epochs can cap the repeats)")
    if not entry["share_met"]:
        return f"source {name} makes {realised:.1%} of the mixture, not {share:.1%}: its records are too few or too long"
    return None
