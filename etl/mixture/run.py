"""`etl run --config mix.toml DST`: several sources, each with its own options, mixed by weight.

Pass one runs each source through the pipeline with its own config (input type and keys,
default system, masks, truncation, max_items, domain) over the run's one tokenizer and template,
writing its examples to the staging folder (`etl.output.part_writer.StagedParts`). A source's
token count is known only once it is tokenized, so the mix comes second: `etl.pipeline.mix_plan`
sizes each source's share and `etl.pipeline.mix_write` rewrites the staged parts into `data`
and `turns` with each record taken 0, 1 or more times. The second pass costs ~8% of a run (T0 20k chats as two
sources: 0.45 s of 5.9 s): it reads back and rewrites the compressed token lists once.

Accounting per source and in total: read == written + dropped + rejected, where records the
mixture left out are dropped as `not_drawn` and up-sampled copies are counted apart (`repeated`).
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from etl.cache.parsed import ParsedChunks, open_parsed
from etl.config.mixture import MixSource, Mixture
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.ingest.discover import Source
from etl.ingest.prefetch import Prefetch
from etl.output.parquet import identity_keys
from etl.output.part_writer import PartWriter, StagedParts
from etl.output.writer import OutputWriter
from etl.pipeline.accounting import Counts, Timings
from etl.pipeline.run import (
    Item,
    finish,
    parsed_chunks,
    prepare_all,
    process,
    start_parsing,
    write_empty_rejects,
)
from etl.pipeline.startup import tune_malloc
from etl.safe_paths import check_no_symlink

if TYPE_CHECKING:
    from etl.cache.folder import CacheSettings
    from etl.pipeline.chunk import RunState


def run_mixture(
    dst: str, config: RunConfig, *, progress: bool = True, timings: Counter[str] | None = None,
    cache: CacheSettings | None = None,
) -> dict[str, Any]:
    """Run a mixture (`config.mixture`) into DST; returns the manifest it wrote (`cache` as `run`'s)."""
    mix = config.mixture
    assert mix is not None
    _check_schemas(mix)
    out, found, holds_inputs = prepare_all([s.path for s in mix.sources], dst, config, cache=cache)
    files = [[dataclasses.replace(f, name=f"{s.name}/{f.name}") for f in fs] for s, fs in zip(mix.sources, found,
                                                                                               strict=True)]
    started = time.perf_counter()
    tune_malloc()
    run_timings = Timings()
    parsing = threading.Event()  # set once: `startup` is the first source's first parse
    kept = open_parsed(cache, config.tokenizer)
    first, res = start_parsing(config, files[0], run_timings, parsing, reads=mix.sources[0].config, cache=cache,
                               kept=kept)
    from etl.pipeline.chunk import RunState  # Polars: imported while the first chunk parses
    from etl.pipeline.mix_write import mix_sources
    from etl.pipeline.resources import run_identity

    inputs = [f for fs in files for f in fs]
    run_id = run_identity(res, inputs)  # every part carries it, the staged ones too
    identity = identity_keys(run_id)
    with res.encoder, OutputWriter(out, kind="run", keep=holds_inputs) as output:
        staged = StagedParts(output, output.staging(), identity=identity)
        state = RunState(res=res, parts=staged, timings=run_timings)
        before = [_tokenize(s, fs, state, parsing, first if i == 0 else None, kept, progress=progress)
                  for i, (s, fs) in enumerate(zip(mix.sources, files, strict=True))]
        with run_timings.timed("mix"):
            summary, counts = mix_sources(mix, staged, before, res.con, PartWriter(output, identity=identity))
        write_empty_rejects(staged)
        # journaled: a crash before this leaves it for the next run to remove
        shutil.rmtree(check_no_symlink(staged.staging, output.root))
        manifest = finish(res, inputs, counts, output, config, kept, run_id=run_id, mixture=summary)
    if timings is not None:
        timings.update(run_timings)
        timings["total"] = time.perf_counter() - started
        timings.update(res.encoder.saving())
    return {**manifest, "files": output.files()}


def _check_schemas(mix: Mixture) -> None:
    """The sources' data parts share one schema: loss_weight on all of them or none."""
    weighted = {bool(s.config.input_options.get("weight_key")) for s in mix.sources}
    if len(weighted) > 1:
        raise EtlError("config: input.weight_key is set on some sources only; set it on every source or "
                       "none (the data files of a run share one schema)")


def _tokenize(source: MixSource, files: list[Source], state: RunState, parsing: threading.Event,
              started: Prefetch[Item] | None, kept: ParsedChunks | None, *, progress: bool) -> Counts:
    """Pass one for one source: its chunks through the pipeline with its own config, staged."""
    from etl.pipeline.resources import resources_for

    res = resources_for(state.res, source.config)
    assert isinstance(state.parts, StagedParts)
    state.parts.source = source.name
    # Dedup (when asked) and the once-per-run warnings span every source of the mixture.
    mine = dataclasses.replace(state, res=res, counts=Counts(), domain=source.domain)
    if started is None:
        started = Prefetch(parsed_chunks(files, source.config, res.builder_query(), res.con.cursor(),
                                         state.timings, parsing, kept))
    with started as parsed:
        process(files, parsed, mine, progress=progress)
    return mine.counts
