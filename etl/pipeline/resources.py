"""What one `etl run` loads once, before the first chunk, and every chunk only reads: the run's
plan (etl.pipeline.plan: its configs, template chosen), the tokenizer, the template's ids,
BOS/EOS and default-system ids, a DuckDB connection; and the manifest's keys they fix."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from etl import __version__
from etl import columns as c
from etl.cache.encoder import Encoder
from etl.cache.folder import CacheSettings, lazy_tokenizer
from etl.config.run_config import MaskOptions, RunConfig, RunSettings, RunSource
from etl.errors import EtlError
from etl.formats.builders import BuilderQuery, connect
from etl.images.vision import VisionRule, load_vision
from etl.ingest.discover import Source
from etl.ingest.objects import sample
from etl.kinds import KINDS
from etl.output.parquet import identity_of
from etl.pipeline.accounting import Counts
from etl.pipeline.images import ImageSpan, span_of
from etl.pipeline.plan import RunPlan, load_plan
from etl.pipeline.reasoning import ReasoningRender
from etl.pipeline.startup import builder_query_for
from etl.tokens.joins import NO_JOIN, join_fixed
from etl.tokens.loading import load_tokenizer
from etl.tokens.templates import TemplateIds, resolve_template
from etl.tokens.tokenizer import TextTokenizer, encode_template_text
from etl.tokens.tool_format import FORMS

if TYPE_CHECKING:
    from etl.images.workers import ImageWorkers


@dataclass(frozen=True)
class Resources:
    """The run's resolved, read-only inputs. The DuckDB connection is shared: a thread that
    queries in parallel takes its own `con.cursor()`."""

    plan: RunPlan
    config: RunConfig  # the plan's, or one source's (`resources_for`)
    tokenizer: TextTokenizer
    template: TemplateIds
    system_ids: list[int] | None
    con: duckdb.DuckDBPyConnection
    bos: list[int]
    eos: list[int]
    # Every text the chunks tokenize goes through it: repeats once, the token cache (etl.cache).
    encoder: Encoder
    # A tokenizer folder with an image processor (etl.images.vision): its token rule, and the ids
    # of an image's span in the token stream. None: a text model; records with images are rejected.
    vision: VisionRule | None = None
    image_span: ImageSpan | None = None
    # The local engine's image worker processes (etl.images.workers); None: images read on threads.
    image_workers: ImageWorkers | None = None

    @property
    def mask(self) -> MaskOptions:
        """Mask options with the template's default for training the assistant header."""
        if self.config.mask.train_header is not None:
            return self.config.mask
        return self.config.mask.replace(train_header=self.template.template.train_header)

    @property
    def weights(self) -> bool:
        """Per-message weights are written (`loss_weight`) when the input names a weight key."""
        return bool(self.config.input_options.get("weight_key"))

    @property
    def reasoning(self) -> ReasoningRender:
        """How reasoning is rendered: the template's think format, its turn rule unless the config sets one."""
        fmt = self.template.template.reasoning
        return ReasoningRender(keep=self.config.mask.reasoning_turns or fmt.keep, empty_last=fmt.empty_last,
                               pre=fmt.pre, post=fmt.post,
                               prefix=tuple(self.template.reasoning_prefix),
                               suffix=tuple(self.template.reasoning_suffix))

    def builder_query(self) -> BuilderQuery:
        """The parse query of the run's input type over the template's roles."""
        return builder_query_for(self.config, self.template.template)


def _extra_special(tokenizer: TextTokenizer, key: str, template_value: str) -> str:
    """The BOS/EOS string for `add_bos`/`add_eos`: the template's, else tokenizer_config's."""
    if template_value:
        return template_value
    value = getattr(tokenizer, "config", {}).get(f"{key}_token")
    value = value.get("content") if isinstance(value, dict) else value
    if not value:
        raise EtlError(
            f"preprocessing.add_{key} is set but neither the template nor the tokenizer's "
            f"tokenizer_config.json names a {key.upper()} token; unset add_{key} or use a tokenizer that has one"
        )
    return value


def build_resources(
    plan: RunPlan | RunConfig, *, tokenizer: TextTokenizer | None = None, con: duckdb.DuckDBPyConnection | None = None,
    cache: CacheSettings | None = None,
) -> Resources:
    """Load what the plan's chunks read: the tokenizer (unless choosing the template loaded it:
    `tokenizer`), the template's ids, BOS/EOS and the default system ids, once per run (and once
    per Ray worker). A `RunConfig`: its own one-source plan (`etl check-template`, tests).

    `cache`: the token cache to read and fill; None: none (repeats in a batch still tokenize once).
    """
    if isinstance(plan, RunConfig):
        plan, tokenizer = load_plan(RunSettings.one("", "", plan), lazy=lazy_tokenizer(cache))
    config, template = plan.config, plan.template
    if tokenizer is None:
        tokenizer = load_tokenizer(config.tokenizer, special_tokens=template.special_tokens, lazy=lazy_tokenizer(cache),
                                   backend=config.tokenizer_backend)
    encoder = Encoder(tokenizer, cache)  # first: it hands the tokenizer the answers it remembers
    tokenizer.vocab_size  # noqa: B018 - the manifest's, asked now: the answers the cache keeps at close hold it
    ids = resolve_template(template, tokenizer)
    bos, eos = list(ids.bos), list(ids.eos)
    if config.add_bos and not bos:
        token = _extra_special(tokenizer, "bos", template.bos)
        bos = encode_template_text(tokenizer, token, [token])
    if config.add_eos and not eos:
        token = _extra_special(tokenizer, "eos", template.eos)
        eos = encode_template_text(tokenizer, token, [token])
    vision = load_vision_of(config)
    if vision is not None:
        # Image runs allocate image-sized Arrow buffers (tens of MiB) of every size: mimalloc kept
        # them (20,000 LLaMA-Factory conversations: 713 MiB peak against 617 at 2,000); the system
        # allocator, whose big blocks are their own mappings (startup.tune_malloc), gives them back
        # (575 against 567).
        pa.set_memory_pool(pa.system_memory_pool())
    return Resources(plan=plan, config=config, tokenizer=tokenizer, template=ids,
                     system_ids=_system_ids(tokenizer, ids, config), con=connect() if con is None else con,
                     bos=bos, eos=eos, encoder=encoder, vision=vision,
                     image_span=span_of(vision, tokenizer.special_id) if vision else None)


def load_vision_of(config: RunConfig) -> VisionRule | None:
    """The image processor's token rule of the tokenizer's folder, with the run's pixel bounds."""
    if config.tokenizer == "bytes":
        return None
    path = Path(config.tokenizer)
    return load_vision(path if path.is_dir() else path.parent, min_pixels=config.min_pixels,
                       max_pixels=config.max_pixels)


def _system_ids(tokenizer: TextTokenizer, template: TemplateIds, config: RunConfig) -> list[int] | None:
    """The default system prompt's ids as content of a system turn (after its header's lead)."""
    if config.default_system is None or config.input_type == "text":
        return None
    row = sorted(template.header).index("system") * FORMS if "system" in template.header else len(template.joins)
    lead = template.joins[row][0] if row < len(template.joins) else NO_JOIN
    return join_fixed(tokenizer, lead, config.default_system)


def resources_for(res: Resources, source: RunSource) -> Resources:
    """The run's resources for one of its sources (a mixture's): its own resolved config (input
    type, default system, masks, truncation) over the same tokenizer, template, BOS/EOS and connection."""
    if source.config == res.config:  # a plain run's one source: the run's own resources
        return res
    return dataclasses.replace(res, config=source.config,
                               system_ids=_system_ids(res.tokenizer, res.template, source.config))


def run_identity(res: Resources, sources: list[Source]) -> str:
    """The run's identity, known before its first part is written: 16 hex digits of a
    sha256 over what fixes its output (etl's version, the config, the tokenizer's sha256, the
    template and ids, each input's name, size and a sha256 of its two ends: `Source.sample`). A rerun
    of the same input and config gets the same one, so its parts stay byte-identical; the counts
    and the token cache are left out (a cached rerun writes the same bytes). Costs a stat and two
    64 KiB reads per input (docs/design.md, Measured costs).
    """
    body = {**_settings(res, sources), "input_bytes": [s.size() for s in sources],
            "input_samples": [sample(s) for s in sources]}
    return identity_of(body)


def _settings(res: Resources, sources: list[Source]) -> dict[str, Any]:
    """The manifest's keys that the run's inputs and config fix before it reads a record."""
    tok = res.tokenizer
    return {
        "format_version": c.MANIFEST_FORMAT_VERSION,
        "etl_version": __version__,
        "config": res.plan.config_json(),
        "inputs": [s.name for s in sources],
        "seq_len": res.config.seq_len,
        "tokenizer": {
            "name": tok.name,
            "path": tok.path,
            "sha256": tok.sha256,
            "vocab_size": tok.vocab_size,
            # how transformers rebuilds its pipeline, which etl encodes with (etl.tokens.hf_pipeline)
            **({"pipeline": pipeline} if (pipeline := getattr(tok, "pipeline", None)) else {}),
        },
        "template": res.template.to_json(),
        "special_ids": res.template.special_ids,
        "pad_id": res.template.eot_id,
        "eot_id": res.template.eot_id,
        "bos_ids": res.bos,
        "eos_ids": res.eos,
        "default_system_ids": res.system_ids,
        # A run with an image processor: its rule and how images are written (etl.pipeline.images).
        **({"images": _images_block(res)} if res.vision else {}),
    }


def _images_block(res: Resources) -> dict[str, Any]:
    """The manifest's `images`: the token rule, the span's ids, the processor's pixel settings (the
    loader's workers compute pixel values from them) and how images were written."""
    from etl.images.pixels import PixelRule, load_pixel_rule  # Pillow: only for a run with images

    assert res.vision is not None
    path = Path(res.config.tokenizer)
    pixels = load_pixel_rule(path if path.is_dir() else path.parent) or PixelRule()
    return {**res.vision._asdict(), **pixels._asdict(), "span_ids": list(res.image_span or ()),
            "mode": res.config.images, "root": res.config.image_root}


def manifest_for(res: Resources, sources: list[Source], counts: Counts, *, run_id: str) -> dict[str, Any]:
    """The run's manifest, less `files` (the output writer adds them when it commits); `run_id`:
    `run_identity`, as the run computed it before writing its first part."""
    return {
        **_settings(res, sources),
        c.RUN_ID: run_id,
        "counts": counts.to_json(),
        c.MANIFEST_KIND: (kind := res.plan.kind),
        **({"preference": {"fit": res.config.pair_fit, "over_shared_seq_len": counts.over_shared}}
           if KINDS[kind].paired else {}),
        "incomplete_inputs": counts.incomplete,
        # Where the run's ids came from (the cache, or the tokenizer backend that encoded the rest:
        # the same ids either way): the one entry that differs between a run and its rerun.
        **({"token_cache": cached} if (cached := res.encoder.summary()) is not None else {}),
    }
