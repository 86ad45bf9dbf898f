"""`etl run --config mix.toml DST`: several sources, each with its own options, mixed by weight.

Pass one runs each source through the pipeline with its own config (input type and keys,
default system, masks, truncation, max_items, domain) over the run's one tokenizer and template,
writing its examples to the staging folder (`etl.output.part_writer.StagedParts`); the run driver
(`etl.pipeline.driver`) does it as for any run, on the local engine. A source's token count is
known only once it is tokenized, so the mix comes second: `etl.mixture.shares` sizes each
source's share and `etl.mixture.resample` rewrites the staged parts into `data` and `turns` with
each record taken 0, 1 or more times. The second pass reads back and rewrites the compressed token
lists once (its cost: docs/mixtures.md).

Accounting per source and in total: read == written + dropped + rejected, where records the
mixture left out are dropped as `not_drawn` and up-sampled copies are counted apart (`repeated`).
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import TYPE_CHECKING, Any

from etl.config.run_config import Mixture, RunSettings, RunSource
from etl.errors import EtlError
from etl.output.part_writer import PartWriter, StagedParts
from etl.pipeline.accounting import Counts
from etl.pipeline.driver import drive
from etl.pipeline.run import LocalEngine

if TYPE_CHECKING:
    import duckdb

    from etl.cache.folder import CacheSettings

__all__ = ["run_mixture"]


def run_mixture(
    settings: RunSettings, *, progress: bool = True, timings: Counter[str] | None = None,
    cache: CacheSettings | None = None,
) -> dict[str, Any]:
    """Run a mixture (`settings.mixture`, its sources `settings.sources`) into its DST; returns
    the manifest it wrote (`cache` as `run`'s)."""
    assert settings.mixture is not None
    _check_schemas(settings.sources)
    mix = functools.partial(_mix, settings.mixture, settings.sources)
    return drive(settings, LocalEngine(), mix=mix, progress=progress, timings=timings, cache=cache)


def _check_schemas(sources: tuple[RunSource, ...]) -> None:
    """The sources' data parts share one schema: loss_weight on all of them or none."""
    weighted = {bool(s.config.input_options.get("weight_key")) for s in sources}
    if len(weighted) > 1:
        raise EtlError("config: input.weight_key is set on some sources only; set it on every source or "
                       "none (the data files of a run share one schema)")


def _mix(mix: Mixture, sources: tuple[RunSource, ...], staged: StagedParts, before: list[Counts],
         con: duckdb.DuckDBPyConnection, parts: PartWriter) -> tuple[dict[str, Any], Counts]:
    """Pass two (`etl.pipeline.driver.SecondPass`): the manifest's `mixture` section and the run's counts."""
    # Polars: imported at pass two, not before the first chunk's parse starts
    from etl.mixture.resample import mix_sources

    return mix_sources(mix, sources, staged, before, con, parts)
