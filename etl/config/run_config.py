"""The settings of one `etl run`, finished: the config file's settings (etl.config.file) under
flat names, the flag-only chunk size and a mixture's sources.

A field `at("preprocessing.deduplicate")` is that key's declaration (type, default, doc, bounds,
flag); a bad value is an error naming that key. `config_from_args` (etl.config.build) makes one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import Field

from etl.columns import DEFAULT_DOMAIN
from etl.config.declare import Section, Settings, key, setting
from etl.config.file import (
    ConfigFile,
    DedupMode,
    Eot,
    ImageMode,
    MixBy,
    MixTotal,
    PairFit,
    ReasoningTurns,
    StorageFormat,
    TokenizerBackend,
    TurnPolicy,
)

# 16 MiB of JSON per chunk (~3M Qwen tokens): T0 with Qwen2.5 peaks at ~0.9 GB RSS, as fast as
# with 32 MiB (1.15 GB); 8 MiB saves another 0.2 GB at a little speed (docs/design.md, Memory).
DEFAULT_CHUNK_BYTES = 16 << 20
# A chunk costs ~12x its size while parsed and assembled (docs/design.md "Memory"): 1 GiB is ~12 GiB at
# work. --chunk-mb 100000 made the reader ask for one 100 GB block (MemoryError).
MAX_CHUNK_BYTES = 1 << 30


IMAGE_SETTINGS = ("images", "image_root", "max_pixels", "min_pixels")


def at(path: str) -> Any:
    """The config file's setting at the dotted `path`, as a field here."""
    return setting(ConfigFile, path)


class Mixture(Section):
    """How a mixture's sources are mixed (the sources themselves: `RunSettings.sources`)."""

    seed: int = at("seed")
    mix_by: MixBy = at("mix_by")
    mix_total: MixTotal = at("mix_total")

    def to_json(self, sources: tuple[RunSource, ...]) -> dict[str, Any]:
        """The manifest's `config.mixture`: each source with its whole config (numbers as written)."""
        return {"seed": self.seed, "mix_by": self.mix_by, "mix_total": self.mix_total,
                "sources": [{"name": s.name, "path": s.path, "domain": s.domain, "weight": s.weight,
                             "epochs": s.epochs, "config": s.config.to_json()} for s in sources]}


class MaskOptions(Settings):
    """Which pieces of which turns are trained (by default the assistant's content and end)."""

    train_roles: tuple[str, ...] = ("assistant",)  # from `mask` and `mask_default`
    train_header: bool | None = at("mask_options.train_header")
    eot: Eot = at("mask_options.eot")
    last_assistant_only: bool = at("mask_options.last_assistant_only")
    require_complete_user: bool = at("mask_options.require_complete_user")
    reasoning_turns: ReasoningTurns | None = at("mask_options.reasoning_turns")
    train_reasoning: bool = at("mask_options.train_reasoning")


class RunConfig(Settings):
    """Every setting of a run: written into the manifest so a run can be reproduced.

    Two settings follow the tokenizer until the run starts: `template` (`auto`: `hf` for a
    tokenizer with a chat_template, else `ngpt`) and `default_system` when it was not given
    (not in `model_fields_set`: the template's own). The run's plan resolves both once
    (`etl.pipeline.plan`), so the manifest records what was used, never `auto`.
    """

    tokenizer: str = at("tokenizer")
    template: str = at("template")
    tokenizer_backend: TokenizerBackend = at("tokenizer_backend")
    seq_len: int = at("seq_len")
    input_type: str = at("input.type")
    input_options: dict[str, Any] = Field(default_factory=dict)  # input.*: the builder's keyword arguments
    default_system: str | None = at("default_system")
    mask: MaskOptions = MaskOptions()
    truncation: TurnPolicy = at("truncation.policy")
    pair_fit: PairFit = at("truncation.pair_fit")
    deduplicate: bool = at("preprocessing.deduplicate")
    dedup_mode: DedupMode = at("preprocessing.dedup_mode")
    max_items: int | None = at("preprocessing.max_items")
    add_bos: bool = at("preprocessing.add_bos")
    add_eos: bool = at("preprocessing.add_eos")
    val_fraction: float = at("split.val_fraction")
    split_seed: int = at("split.seed")
    chunk_bytes: int = key(DEFAULT_CHUNK_BYTES, f"input per chunk (bounds memory; at most {MAX_CHUNK_BYTES >> 20} "
                           "MiB)", flag="--chunk-mb", mib=True, gt=0, lt=MAX_CHUNK_BYTES + 1,
                           limit=f"must be positive and at most {MAX_CHUNK_BYTES} bytes, got {{value}}")
    max_record_bytes: int = at("preprocessing.max_record_bytes")
    storage_format: StorageFormat | None = at("output.storage_format")
    max_tokens_per_shard: int = at("output.max_tokens_per_shard")
    images: ImageMode = at("images.mode")
    image_root: str | None = at("images.root")
    max_pixels: int | None = at("images.max_pixels")
    min_pixels: int | None = at("images.min_pixels")

    @property
    def domain_key(self) -> str | None:
        """The record key naming each example's domain: the input's `domain_key` option."""
        return self.input_options.get("domain_key")

    def to_json(self) -> dict[str, Any]:
        """The manifest's `config` (and part of the run's identity): its keys as they have always been.
        `tokenizer_backend` changes no id (the run checks it), so it is left out: the manifest's
        `token_cache.backend` says which encoded the run. So are `storage_format` and
        `max_tokens_per_shard`: the Parquet output is the same with or without token files, which
        the export stage's record (`_export.json`) describes. The image settings are the manifest's
        `images` (a run with a vision processor: etl.pipeline.resources), not here: a text run's
        config and identity stay what they were."""
        body = self.model_dump(exclude={"chunk_bytes", "max_record_bytes", "tokenizer_backend",
                                        "storage_format", "max_tokens_per_shard", *IMAGE_SETTINGS})
        body |= {"domain_key": self.domain_key, "chunk_bytes": self.chunk_bytes,
                 "max_record_bytes": self.max_record_bytes}
        return body


@dataclass(frozen=True)
class RunSource:
    """One input of a run: its SRC and the config its records are read with (a mixture's own
    input type, masks, truncation, max_items...). In a mixture: `name` prefixes its files' names
    and ids, `domain` is its records' when they carry no domain key's value, and `weight` and
    `epochs` (numbers as written) size its share."""

    path: str
    config: RunConfig
    name: str = ""
    domain: str = DEFAULT_DOMAIN
    weight: int | float | None = None
    epochs: int | float | None = None

    def named(self, files: list[Any]) -> list[Any]:
        """Its input files (`etl.ingest.discover.Source`), named `<source>/<file>` in a mixture."""
        return files if not self.name else [dataclasses.replace(f, name=f"{self.name}/{f.name}") for f in files]


class RunSettings(NamedTuple):
    """What `etl run`'s flags and config file ask for, checked, and nothing resolved yet: DST,
    the sources (one for SRC; a mixture's, each with its own config), the run's own config (a
    mixture's top level) and, for a mixture, how its sources are mixed."""

    dst: str
    sources: tuple[RunSource, ...]
    config: RunConfig
    mixture: Mixture | None = None

    @classmethod
    def one(cls, src: str, dst: str, config: RunConfig) -> RunSettings:
        """A plain run: SRC read with `config` into DST."""
        return cls(dst, (RunSource(src, config),), config)
