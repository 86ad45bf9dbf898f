"""`etl run --config mix.toml DST`: several sources, each with its own options, mixed by weight.

Pass one runs each source through the pipeline with its own config (input type and keys,
default system, masks, truncation, max_items, domain) over the run's one tokenizer and template,
writing its examples to the staging folder (`etl.output.part_writer.StagedParts`). A source's
token count is known only once it is tokenized, so the mix comes second: `etl.pipeline.mix_plan`
sizes each source's share and `etl.pipeline.mix_write` rewrites the staged parts into `data`
and `turns` with each record taken 0, 1 or more times. The extra write costs ~5% of a run (the
staged parts are a few MiB of compressed ids per 16 MiB chunk of input).

Accounting per source and in total: read == written + dropped + rejected, where records the
mixture left out are dropped as `not_drawn` and up-sampled copies are counted apart (`repeated`).
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from etl.config.mixture import MixSource, Mixture
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.ingest.discover import Source
from etl.ingest.prefetch import Prefetch
from etl.output.ownership import OutputWriter
from etl.output.part_writer import PartWriter, StagedParts
from etl.pipeline.accounting import Counts, Timings
from etl.pipeline.chunk import RunState
from etl.pipeline.mix_plan import copies, source_targets
from etl.pipeline.mix_write import Staged, draws, read_staged, write_mixed
from etl.pipeline.resources import Resources, build_resources, resources_for
from etl.pipeline.run import finish, parsed_chunks, prepare_all, process, write_empty_rejects
from etl.pipeline.startup import tune_malloc

NOT_DRAWN = "not_drawn"  # drop reason of the records a mixture's down-sampling left out
SHARE_TOLERANCE = 0.01  # realised share within 1% (absolute) of the requested one: "share_met"


def run_mixture(
    dst: str, config: RunConfig, *, progress: bool = True, timings: Counter[str] | None = None
) -> dict[str, Any]:
    """Run a mixture (`config.mixture`) into DST; returns the manifest it wrote."""
    mix = config.mixture
    assert mix is not None
    _check_schemas(mix)
    out, found, holds_inputs = prepare_all([s.path for s in mix.sources], dst, config)
    files = [[dataclasses.replace(f, name=f"{s.name}/{f.name}") for f in fs] for s, fs in zip(mix.sources, found,
                                                                                               strict=True)]
    started = time.perf_counter()
    tune_malloc()
    run_timings = Timings()
    res = build_resources(config)
    with OutputWriter(out, kind="run", keep=holds_inputs) as output:
        staged = StagedParts(output, output.staging())
        state = RunState(res=res, parts=staged, timings=run_timings)
        parsing = threading.Event()  # set once: `startup` is the first source's first parse
        before = [_tokenize(s, fs, state, parsing, progress=progress) for s, fs in zip(mix.sources, files,
                                                                                        strict=True)]
        with run_timings.timed("mix"):
            summary, counts = _mix(mix, staged, before, res, PartWriter(output))
        write_empty_rejects(staged)
        shutil.rmtree(staged.staging)  # journaled: a crash before this leaves it for the next run to remove
        manifest = finish(res, [f for fs in files for f in fs], counts, output, config, mixture=summary)
    if timings is not None:
        timings.update(run_timings)
        timings["total"] = time.perf_counter() - started
    return {**manifest, "files": output.files()}


def _check_schemas(mix: Mixture) -> None:
    """The sources' data parts share one schema: loss_weight on all of them or none."""
    weighted = {bool(s.config.input_options.get("weight_key")) for s in mix.sources}
    if len(weighted) > 1:
        raise EtlError("config: input.weight_key is set on some sources only; set it on every source or "
                       "none (the data files of a run share one schema)")


def _tokenize(source: MixSource, files: list[Source], state: RunState, parsing: threading.Event, *,
              progress: bool) -> Counts:
    """Pass one for one source: its chunks through the pipeline with its own config, staged."""
    res = resources_for(state.res, source.config)
    assert isinstance(state.parts, StagedParts)
    state.parts.source = source.name
    # Dedup (when asked) and the once-per-run warnings span every source of the mixture.
    mine = dataclasses.replace(state, res=res, counts=Counts(), domain=source.domain)
    query = res.builder_query()
    with Prefetch(parsed_chunks(files, source.config, query, res.con.cursor(), state.timings, parsing)) as parsed:
        process(files, parsed, mine, progress=progress)
    return mine.counts


def _mix(mix: Mixture, staged: StagedParts, before: list[Counts], res: Resources,
         parts: PartWriter) -> tuple[dict[str, Any], Counts]:
    """Pass two: size each source's share, draw its records, write the mixed parts; the
    manifest's `mixture` section and the run's counts."""
    sources = [read_staged(staged, s.name) for s in mix.sources]
    units = [s.units(mix.mix_by) for s in sources]
    weighted = mix.sources[0].weight is not None
    weights = np.array([s.weight or 0.0 for s in mix.sources]) if weighted else None
    default_epochs = np.inf if weighted else 1.0
    epochs = np.array([default_epochs if s.epochs is None else s.epochs for s in mix.sources])
    targets, shares = source_targets(np.array([u.sum() for u in units]), weights=weights, epochs=epochs,
                                     total=mix.mix_total)
    taken = []
    with parts.background():
        for source, rows, target in zip(sources, units, targets, strict=True):
            cp = copies(rows, draws(res.con, source.sizes, mix.seed), float(target))
            write_mixed(source, cp, parts)
            taken.append(cp)
    entries = [_entry(s, src, cp, n, mix.mix_by) for s, src, cp, n in zip(mix.sources, sources, taken, before,
                                                                            strict=True)]
    _shares_realised(entries, shares, mix)
    total = Counts(repeated=0)
    for entry in entries:
        total.add(entry.pop("_counts"))
    summary = {"mix_by": mix.mix_by, "mix_total": mix.mix_total if weighted else None, "seed": mix.seed,
               "sources": entries}
    return summary, total


def _entry(source: MixSource, staged: Staged, cp: np.ndarray, counts: Counts, mix_by: str) -> dict[str, Any]:
    """A source's line of the manifest's mixture: what it had, what the mix kept, its counts."""
    kept = cp > 0
    truncated = staged.sizes.column("truncated").to_numpy(zero_copy_only=False)
    after = dataclasses.replace(counts, dropped=Counter(counts.dropped), written=int(kept.sum()),
                                truncated=int((truncated & kept).sum()), repeated=int((cp - kept).sum()))
    if (~kept).any():
        after.dropped[NOT_DRAWN] += int((~kept).sum())
    mixed = staged.totals(cp)
    after.tokens, after.trained_tokens = mixed["tokens"], mixed["trained_tokens"]
    assert after.add_up(), after
    units_before = staged.units(mix_by).sum()
    units_after = staged.units(mix_by) @ cp
    return {"name": source.name, "domain": source.domain, "path": source.path, "weight": source.weight,
            "epochs": source.epochs, "before": staged.totals(np.ones(len(cp), dtype=np.int64)),
            "counts": after.to_json(), "repeat": round(float(units_after / units_before), 4) if units_before else None,
            "_units": int(units_after), "_counts": after}


def _shares_realised(entries: list[dict[str, Any]], shares: np.ndarray, mix: Mixture) -> None:
    """Requested and realised shares of each source, and a one-line note where they differ."""
    units = np.array([e.pop("_units") for e in entries], dtype=np.float64)
    realised = units / units.sum() if units.sum() else np.zeros_like(units)
    for entry, want, got in zip(entries, shares, realised, strict=True):
        entry["requested_share"], entry["realised_share"] = round(float(want), 4), round(float(got), 4)
        entry["share_met"] = bool(abs(got - want) <= SHARE_TOLERANCE)
        entry["note"] = _note(entry, float(want), mix)


def _note(entry: dict[str, Any], share: float, mix: Mixture) -> str | None:
    """What to tell the user about a source whose share needed repeating, or was not met."""
    repeat, name, realised = entry["repeat"], entry["name"], entry["realised_share"]
    if repeat is None:
        return f"source {name} has no examples to mix; the other sources keep their proportions"
    if mix.sources[0].weight is None:
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
