"""The config file, declared once: one frozen, strict pydantic model per section.

Each key's type, default, doc, bounds and flag are declared here; the run's config
(etl.config.run_config), the flags, the JSON Schema and the docs/config.md table derive from them.
`input`'s options are its input type's builder's (etl.config.schema adds them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, WrapValidator

from etl.columns import (
    AUTO_TEMPLATE,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MAX_TOKENS_PER_SHARD,
    DEFAULT_MIN_CHARS,
    DEFAULT_SEQ_LEN,
    DEFAULT_SYSTEM_TEXT,
    INPUT_TYPES,
    MIN_SEQ_LEN,
    SEQ_LEN_RULE,
)
from etl.config.declare import Section, key

# What the run does with a conversation longer than S, turn by turn (the loader and the packers
# cut an example's tokens instead: etl.columns.CUT_SIDES).
# keep_start / keep_end cut preference pairs (etl.pipeline.pair_truncation); the others are SFT's.
TurnPolicy = Literal["drop_oldest_turns", "keep_prefix", "right", "drop", "keep_start", "keep_end"]
PairFit = Literal["separate", "shared"]
Eot = Literal["turn", "last", "all", "none"]
ReasoningTurns = Literal["all", "last", "none"]
DedupMode = Literal["prefix200", "exact"]
Role = Literal["system", "user", "assistant", "tool", "text"]
FieldRole = Literal["prompt", "response"]  # instruction input's mask rules name fields, not roles
MaskKey = Literal[Role, FieldRole]
MaskAction = Literal["mask", "train"]
MixBy = Literal["tokens", "examples"]
MixTotal = Literal["sum", "first_exhausted", "all_exhausted"]
TokenizerBackend = Literal["auto", "hf", "gigatoken"]
StorageFormat = Literal["bin", "h5"]  # etl.export.backends.BACKENDS
ImageMode = Literal["embed", "reference"]  # etl.images
TURN_POLICIES: tuple[str, ...] = get_args(TurnPolicy)
CANONICAL_ROLES: tuple[str, ...] = get_args(Role)
FIELD_ROLES = dict(zip(get_args(FieldRole), ("user", "assistant"), strict=True))
DEFAULT_MASK = {"assistant": "train"}  # `mask` when a file has none: a source's rules extend it
SEQ_LEN: dict[str, Any] = {"ge": MIN_SEQ_LEN, "limit": SEQ_LEN_RULE + ", got {value}"}
NOT_NEGATIVE: dict[str, Any] = {"ge": 0, "limit": "must be an integer >= 0, got {value}"}
POSITIVE_NUMBER: dict[str, Any] = {"gt": 0, "limit": "must be a positive number, got {value}"}


def _as_written(value: Any, check: Any) -> Any:
    check(value)
    return value  # an integer stays one: the manifest and the run's identity keep `0`, not `0.0`


Number = Annotated[float, WrapValidator(_as_written)]


class Input(Section, extra="allow"):
    """`input`: the record layout; its other keys are the options of that type's builder."""

    type: str = key("chat", f"the record layout: {', '.join(INPUT_TYPES)}; options of a type go in the "
                    "config's input", flag="--input-type")


class Preprocessing(Section):
    """`preprocessing`: filters and limits applied while reading."""

    deduplicate: bool = key(False, "drop repeated conversations")
    dedup_mode: DedupMode = key("prefix200", "what repeats: MD5 of the first 200 characters, or the whole "
                                "conversation")
    max_items: int | None = key(None, "stop after this many records; null: all", gt=0,
                                limit="must be positive or null, got {value}")
    add_bos: bool = key(False, "start every example with the bos token")
    add_eos: bool = key(False, "end every example with the eos token")
    max_record_bytes: int = key(
        DEFAULT_MAX_RECORD_BYTES, "reject records whose JSON is larger, as record_too_large, before parsing",
        flag="--max-record-mb", mib=True, gt=0,
        limit="must be a positive number of bytes, got {value}; raise it to keep larger records")
    max_seq_len: int | None = key(None, "the declarative schema's name for seq_len (seq_len wins)", **SEQ_LEN)
    min_chars: int = key(DEFAULT_MIN_CHARS, "text input: drop shorter texts", **NOT_NEGATIVE)
    max_chars: int = key(DEFAULT_MAX_CHARS, "text input: drop longer texts", **NOT_NEGATIVE)


class Truncation(Section):
    """`truncation`: a policy name, or {policy = ...}."""

    policy: TurnPolicy = key("drop_oldest_turns", "what to do with conversations longer than S (text "
                             "input: right; preference data: drop_oldest_turns, keep_start, keep_end or drop)",
                             flag="--truncation")
    pair_fit: PairFit = key("separate", "preference pairs fit S as prompt + the longer completion (separate "
                            "rows, TRL's layout) or as prompt + chosen + rejected (shared: the prefix-shared "
                            "packed layout)", flag="--pair-fit")


class MaskTokens(Section):
    """`mask_options`: which tokens of a trained turn carry loss."""

    train_header: bool | None = key(None, "train the role header tokens of trained turns; null: the "
                                    "template's default (post_training's trains the marker)")
    eot: Eot = key("turn", "end-of-turn tokens trained: those of trained turns, of the last assistant "
                   "turn, of every turn, or none")
    last_assistant_only: bool = key(False, "train only the final assistant turn of a conversation")
    require_complete_user: bool = key(False, "an assistant turn trains only after a whole user turn")
    reasoning_turns: ReasoningTurns | None = key(
        None, "assistant turns whose reasoning is rendered: all, last (after the last user turn, Qwen3's "
        "rule) or none; null: the template's rule (presets: all)")
    train_reasoning: bool = key(True, "train the reasoning block (<think> ... </think>) of trained turns")


class Split(Section):
    """`split`: the train/val split."""

    val_fraction: Number = key(0.0, "share of examples in the val split (an MD5 draw per id)", ge=0, lt=1,
                              limit="must be in [0, 1), got {value}")
    seed: int = key(0, "seed of the val draw")


class Output(Section):
    """`output`: token files written next to the Parquet output, by the bin/h5 export stage."""

    domain_key: str | None = key(None, "the record key naming each example's domain: input.domain_key "
                                 "under the declarative schema's name; null: input.domain_key's")
    storage_format: StorageFormat | None = key(
        None, "after the run, also write the token files into DST (as `etl export DST DST --format F`): "
        "the train split as `DST/<domain>/`, the val split as `DST/_val/<domain>/`; bin: raw int64, mmap-able; "
        "h5: HDF5, needs h5py; null: Parquet only")
    max_tokens_per_shard: int = key(DEFAULT_MAX_TOKENS_PER_SHARD, "tokens per bin/h5 shard file (a sequence is "
                                    "never split); needs storage_format", gt=0,
                                    limit="must be a positive integer, got {value}")


class Images(Section):
    """`images`: images of vision-language data (a tokenizer folder with a preprocessor_config.json)."""

    mode: ImageMode = key("embed", "embed: DST holds each image's bytes (self-contained; it cannot change "
                          "under the loader); reference: its path and sha256, checked when read", flag="--images")
    root: str | None = key(None, "the folder relative image paths are read from; null: the data file's folder "
                           "(LLaMA-Factory's rule)", flag="--image-root")
    max_pixels: int | None = key(None, "the most pixels an image is resized to (fewer image tokens, less "
                                 "memory); null: the processor config's", flag="--max-pixels", gt=0,
                                 limit="must be a positive number of pixels or null, got {value}")
    min_pixels: int | None = key(None, "the fewest pixels an image is resized to; null: the processor "
                                 "config's", flag="--min-pixels", gt=0,
                                 limit="must be a positive number of pixels or null, got {value}")


class SourceKeys(Section):
    """The keys of one `sources` entry that are its own; it may set `SOURCE_OPTIONS` too."""

    path: str = key(..., "the source's file, folder or glob (relative to the working folder, as SRC)")
    name: str | None = key(None, "names its records (`source_file` = name/file); default: the path's stem")
    domain: str | None = key(None, "the `domain` of its records; default: its name (a record's "
                             "input.domain_key value wins)")
    weight: float | None = key(None, "its share of the output, relative to the other sources' weights (in "
                               "mix_by units)", **POSITIVE_NUMBER)
    epochs: float | None = key(None, "repeat factor, fractional allowed (default 1); with weight: the most a "
                               "share may repeat the source", **POSITIVE_NUMBER)


# Keys a source may set besides its own: its options, over the top level's key by key.
SOURCE_OPTIONS = ("input", "default_system", "mask", "mask_default", "mask_options", "truncation", "max_items")


def _policy(value: Any) -> Any:
    return value if isinstance(value, dict) else {"policy": value}  # a bare name: {policy = name}


class ConfigFile(Section):
    """An `etl run --config` file: the declarative pipeline schema plus etl's own sections."""

    schema_: str | None = Field(None, alias="$schema", description="the JSON Schema of this file, for editors "
                                "(`etl config --schema`); etl ignores it")
    version: Literal[1] = key(1, "the declarative pipeline schema's version")
    input: Input = Field(default_factory=Input, description="the input type and its options (`etl config` "
                         "lists them per type)")
    mask: dict[MaskKey, MaskAction] = key(DEFAULT_MASK, "train or mask each role's content (instruction "
                                          "input: prompt, response)")
    mask_default: MaskAction = key("mask", "the rule of roles that mask does not list")
    preprocessing: Preprocessing = Field(default_factory=Preprocessing, description=Preprocessing.__doc__)
    template: str | None = key(AUTO_TEMPLATE, "auto (hf when the tokenizer has a chat_template and lacks the ngpt "
                               "markers, else ngpt), ngpt, post_training, chatml, llama3, phi3, or hf (derived "
                               "from the tokenizer's chat_template); the manifest records the one used",
                               flag="--template", null_is_default=True)
    tokenizer: str | None = key("bytes", "`bytes` (built-in), a tokenizer.json, or a Hugging Face model "
                                "directory", flag="--tokenizer", null_is_default=True)
    tokenizer_backend: TokenizerBackend = key(
        "auto", "what encodes content for a Hugging Face tokenizer: hf (the `tokenizers` library), gigatoken "
        "(a faster encoder of the same byte-level or SentencePiece BPE files), or auto (gigatoken when it loads "
        "the tokenizer and gives tokenizers' ids on a sample of the run's first texts, else hf); the ids are "
        "the same, the manifest records the one used", flag="--tokenizer-backend")
    seq_len: int | None = key(DEFAULT_SEQ_LEN, "S, the longest input_ids an example keeps", flag="--seq-len",
                              null_is_default=True, **SEQ_LEN)
    truncation: Annotated[Truncation, BeforeValidator(_policy, json_schema_input_type=TurnPolicy | Truncation)] \
        = Field(default_factory=Truncation, description=Truncation.__doc__)
    mask_options: MaskTokens = Field(default_factory=MaskTokens, description=MaskTokens.__doc__)
    split: Split = Field(default_factory=Split, description=Split.__doc__)
    output: Output = Field(default_factory=Output, description=Output.__doc__)
    images: Images = Field(default_factory=Images, description=Images.__doc__)
    default_system: str | None = key(DEFAULT_SYSTEM_TEXT, "system message inserted where a conversation has "
                                     "none; null: none; not given: the template's own (presets: this default; "
                                     "hf: the one its chat_template writes, or none)")
    sources: list[SourceKeys] | None = Field(None, description="a mixture: one table per source, each with "
                                             "its path and its own options (docs/mixtures.md)")
    seed: int = key(0, "seed of a mixture's draws (which records are kept or repeated)")
    mix_by: MixBy = key("tokens", "unit of a mixture's shares: tokens or examples")
    mix_total: MixTotal = key("sum", "a weighted mixture's size: the sources' sum (Mosaic's default), the "
                              "largest no source repeats in (HF interleave first_exhausted), or the smallest "
                              "that uses every record (all_exhausted)")
