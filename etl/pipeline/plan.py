"""What a run resolves once, before any engine starts: its plan.

`etl.config` gives what the flags and the config file ask for (`RunSettings`: each source's
config, `template: auto` and an unset `default_system` still open). `load_plan` checks the
sources against each other, picks the template (a preset's is known from its name, `hf`'s from
the tokenizer's chat_template, so only `hf` loads the tokenizer here) and writes the choice into
every source's config. The engines, Ray's workers and the manifest read the plan; nothing picks
a template again. Keep this module light: it runs before the first chunk's parse starts, which
Polars' import and a preset's tokenizer load then overlap (docs/design.md, Start-up).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from etl.columns import INPUT_TYPES
from etl.config.run_config import Mixture, RunConfig, RunSettings, RunSource
from etl.errors import EtlError
from etl.images.vision import has_vision
from etl.kinds import PAIR_INPUT_TYPES, kind_of
from etl.pipeline.pair_truncation import PAIR_ONLY, pair_policy
from etl.pipeline.startup import preset_template
from etl.tokens.hf_template import load_template_and_tokenizer, own_default_system
from etl.tokens.templates import Template
from etl.tokens.tokenizer import TextTokenizer


@dataclass(frozen=True)
class RunPlan:
    """A run's settings with the template chosen and each config resolved: `config` (the run's
    own; a mixture's top level) and every source's name the template used and, where the user
    gave none, the template's own default system prompt. `kind`: what one `data` row is."""

    config: RunConfig
    sources: tuple[RunSource, ...]
    template: Template
    kind: str
    mixture: Mixture | None = None

    def config_json(self) -> dict[str, Any]:
        """The manifest's `config` (part of the run's identity): a mixture's with its sources."""
        body = self.config.to_json()
        return body if self.mixture is None else {**body, "mixture": self.mixture.to_json(self.sources)}

    def with_changes(self, **changes: Any) -> RunPlan:
        """Every config of the plan with `changes` (Ray's workers: an absolute tokenizer path)."""
        sources = tuple(dataclasses.replace(s, config=s.config.replace(**changes)) for s in self.sources)
        return dataclasses.replace(self, config=self.config.replace(**changes), sources=sources)


IMAGE_CHUNK_BYTES = 1 << 20  # input per chunk of a run whose tokenizer folder has an image processor


def load_plan(settings: RunSettings, *, lazy: bool = False) -> tuple[RunPlan, TextTokenizer | None]:
    """The run's plan, and the tokenizer when choosing the template loaded it (`hf`, or `auto`
    with a chat_template); None: the engine loads it (`lazy`: as the token cache asks).

    Raises:
        EtlError: a source's truncation that its data kind has not, sources of different kinds, or
            the template's own errors; all before any record is read.
    """
    kind = check_sources(settings.sources)
    config, tokenizer = settings.config, None
    if (template := preset_template(config)) is None:  # hf: the template comes from the tokenizer
        template, tokenizer = load_template_and_tokenizer(config.template, tokenizer_spec=config.tokenizer, lazy=lazy,
                                                          backend=config.tokenizer_backend)
    return plan_with(settings, template, kind), tokenizer


def plan_with(settings: RunSettings, template: Template, kind: str) -> RunPlan:
    """`settings` as run with `template`, whose name every config records; a config that names no
    default system prompt gets the template's own (`own_default_system`)."""
    system = own_default_system(template)
    # A vision model's chunks are smaller: a few bytes of image reference stand for up to 16,384
    # tokens, so a 16 MiB chunk of image conversations planned ~10x the tokens of one of text.
    chunk = {"chunk_bytes": IMAGE_CHUNK_BYTES} if has_vision(settings.config.tokenizer) else {}

    def resolved(config: RunConfig) -> RunConfig:
        given = "default_system" in config.model_fields_set
        return config.replace(template=template.name, **({} if given else {"default_system": system}),
                              **({} if "chunk_bytes" in config.model_fields_set else chunk))

    sources = tuple(dataclasses.replace(s, config=resolved(s.config)) for s in settings.sources)
    return RunPlan(resolved(settings.config), sources, template, kind, settings.mixture)


def check_sources(sources: tuple[RunSource, ...]) -> str:
    """The run's kind, once every source's truncation fits its own kind and the kinds agree (one
    row schema per output)."""
    for source in sources:
        _check_truncation(source.config)
    kinds = sorted({kind_of(s.config.input_type).name for s in sources})
    if len(kinds) > 1:
        raise EtlError(f"a mixture's sources give {' and '.join(kinds)} rows; one output holds one kind: "
                       "mix preference sources with preference sources only (separate runs otherwise)")
    return kinds[0]


def _check_truncation(config: RunConfig) -> None:
    if config.input_type not in INPUT_TYPES:  # a RunConfig made in Python: a file's or flag's is checked
        raise EtlError(f"input type {config.input_type!r} is not one of {', '.join(sorted(INPUT_TYPES))}")
    if kind_of(config.input_type).pair:
        pair_policy(config.truncation)  # an SFT-only policy stops the run here, saying which apply
    elif config.truncation in PAIR_ONLY:
        raise EtlError(f"truncation {config.truncation!r} applies to preference data (input types "
                       f"{', '.join(PAIR_INPUT_TYPES)}); for conversations use drop_oldest_turns, keep_prefix, right "
                       "or drop")
