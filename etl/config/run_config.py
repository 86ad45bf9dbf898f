"""The settings of one `etl run`, each declared once: type, default, file key, doc, flag, bounds.

The file follows seed 004's schema exactly (`version`, `input`, `mask`, `mask_default`,
`preprocessing`, `output`) plus etl's own sections (`template`, `tokenizer`, `seq_len`,
`truncation`, `mask_options`, `split`, `default_system`). A field's `setting(...)` names its
key there (etl.config.fields); the pydantic models that check a file or a RunConfig, the
flags, the JSON Schema (`etl config --schema`) and the README table are derived from them.
Unknown keys and bad values are errors that name the field and the allowed values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from etl.columns import (
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MIN_CHARS,
    DEFAULT_SEQ_LEN,
    DEFAULT_SYSTEM_TEXT,
)
from etl.config.fields import Declared, Limit, declared, setting
from etl.config.mixture import DEFAULT_MASK, MixOptions, Mixture, SourceOptions
from etl.errors import EtlError

# 16 MiB of JSON per chunk (~3M Qwen tokens): T0 with Qwen2.5 peaks at ~0.9 GB RSS and runs
# as fast as with 32 MiB (1.15 GB); 8 MiB saves another 0.2 GB for ~1% of speed.
DEFAULT_CHUNK_BYTES = 16 << 20
# A chunk costs ~12x its size while parsed and assembled (README "Memory"): 1 GiB is ~12 GiB at
# work. --chunk-mb 100000 made the reader ask for one 100 GB block (MemoryError).
MAX_CHUNK_BYTES = 1 << 30
Truncation = Literal["drop_oldest_turns", "keep_prefix", "right", "drop"]
Eot = Literal["turn", "last", "all", "none"]
ReasoningTurns = Literal["all", "last", "none"]
StorageFormat = Literal["parquet", "bin", "h5"]
DedupMode = Literal["prefix200", "exact"]
Role = Literal["system", "user", "assistant", "tool", "text"]
FieldRole = Literal["prompt", "response"]  # seed 004's instruction mode names fields, not roles
MaskKey = Literal[Role, FieldRole]
MaskAction = Literal["mask", "train"]
TRUNCATION_POLICIES: tuple[str, ...] = get_args(Truncation)
EOT_POLICIES: tuple[str, ...] = get_args(Eot)
STORAGE_FORMATS: tuple[str, ...] = get_args(StorageFormat)
DEDUP_MODES: tuple[str, ...] = get_args(DedupMode)
CANONICAL_ROLES: tuple[str, ...] = get_args(Role)
FIELD_ROLES = dict(zip(get_args(FieldRole), ("user", "assistant"), strict=True))
INPUT_TYPES = ("chat", "sharegpt", "instruction", "prompt_completion", "text", "transcript")  # = BUILDERS (tested)

SEQ_LEN_LIMIT = Limit("must be at least 2 (S = T + 1 tokens), got {value}", ge=2)
POSITIVE = Limit("must be positive, got {value}", gt=0)

# The file's top-level keys in the order the schema and the README show them, with the doc of
# each section (a key that is one setting takes the setting's doc).
SECTIONS = {
    "version": "", "input": "the input type and its options (`etl config` lists them per type)",
    "mask": "", "mask_default": "", "preprocessing": "filters and limits applied while reading",
    "output": "storage of the tokenized examples", "template": "", "tokenizer": "", "seq_len": "",
    "truncation": "a policy name, or {policy = ...}", "mask_options": "which tokens of a trained turn carry loss",
    "split": "the train/val split", "default_system": "",
    "sources": "a mixture: one table per source, each with its path and its own options (README \"Mixtures\")",
    "seed": "", "mix_by": "", "mix_total": "",
}


@dataclass(frozen=True)
class MaskOptions:
    """Which pieces of which turns are trained (DESIGN §5 defaults: assistant content + end)."""

    train_roles: tuple[str, ...] = ("assistant",)  # from `mask` and `mask_default`
    train_header: bool | None = setting(
        None, "mask_options.train_header", "train the role header tokens of trained turns; null: the "
        "template's default (seed 001's trains the marker)")
    eot: Eot = setting("turn", "mask_options.eot", "end-of-turn tokens trained: those of trained turns, "
                       "of the last assistant turn, of every turn, or none")
    last_assistant_only: bool = setting(False, "mask_options.last_assistant_only",
                                        "train only the final assistant turn of a conversation")
    require_complete_user: bool = setting(False, "mask_options.require_complete_user",
                                          "an assistant turn trains only after a whole user turn (seed 001)")
    reasoning_turns: ReasoningTurns | None = setting(
        None, "mask_options.reasoning_turns", "assistant turns whose reasoning is rendered: all, last (after "
        "the last user turn, Qwen3's rule) or none; null: the template's rule (presets: all)")
    train_reasoning: bool = setting(True, "mask_options.train_reasoning",
                                    "train the reasoning block (<think> ... </think>) of trained turns")


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run; written into the manifest so a run can be reproduced."""

    tokenizer: str = setting("bytes", "tokenizer", "`bytes` (built-in), a tokenizer.json, or a Hugging Face "
                             "model directory", flag="--tokenizer", null_is_default=True)
    template: str = setting("ngpt", "template", "ngpt, post_training, chatml, llama3, phi3, or hf (derived "
                            "from the tokenizer's chat_template)", flag="--template", null_is_default=True)
    seq_len: int = setting(DEFAULT_SEQ_LEN, "seq_len", "S, the longest input_ids an example keeps",
                           flag="--seq-len", limit=SEQ_LEN_LIMIT, null_is_default=True)
    input_type: str = setting("chat", "input.type", f"the record layout: {', '.join(INPUT_TYPES)}; options "
                              "of a type go in the config's input", flag="--input-type")
    input_options: dict[str, Any] = field(default_factory=dict)  # input.*: declared by each builder
    default_system: str | None = setting(DEFAULT_SYSTEM_TEXT, "default_system", "system message inserted "
                                         "where a conversation has none; null: none")
    mask: MaskOptions = field(default_factory=MaskOptions)
    truncation: Truncation = setting("drop_oldest_turns", "truncation.policy", "what to do with "
                                     "conversations longer than S (text input: right)", flag="--truncation")
    deduplicate: bool = setting(False, "preprocessing.deduplicate", "drop repeated conversations")
    dedup_mode: DedupMode = setting("prefix200", "preprocessing.dedup_mode", "what repeats: MD5 of the first "
                                    "200 characters (seed 004), or the whole conversation")
    max_items: int | None = setting(None, "preprocessing.max_items", "stop after this many records; null: all",
                                    limit=Limit("must be positive or null, got {value}", gt=0))
    add_bos: bool = setting(False, "preprocessing.add_bos", "start every example with the bos token")
    add_eos: bool = setting(False, "preprocessing.add_eos", "end every example with the eos token")
    val_fraction: float = setting(0.0, "split.val_fraction", "share of examples in the val split (an MD5 "
                                  "draw per id)", limit=Limit("must be in [0, 1), got {value}", ge=0, lt=1))
    split_seed: int = setting(0, "split.seed", "seed of the val draw")
    domain_key: str | None = setting(None, "output.domain_key", "record key naming each example's domain "
                                     "(one bin/h5 folder per domain)")
    storage_format: StorageFormat = setting("parquet", "output.storage_format", "parquet only, or also seed "
                                            "004's bin or h5 token files")
    max_tokens_per_shard: int = setting(100_000_000, "output.max_tokens_per_shard", "tokens per bin/h5 shard",
                                        limit=POSITIVE)
    chunk_bytes: int = setting(DEFAULT_CHUNK_BYTES, None, "input per chunk (bounds memory; at most "
                               f"{MAX_CHUNK_BYTES >> 20} MiB)", flag="--chunk-mb", mib=True,
                               limit=Limit(f"must be positive and at most {MAX_CHUNK_BYTES} bytes, got {{value}}",
                                           gt=0, lt=MAX_CHUNK_BYTES + 1))
    max_record_bytes: int = setting(
        DEFAULT_MAX_RECORD_BYTES, "preprocessing.max_record_bytes", "reject records whose JSON is larger, as "
        "record_too_large, before parsing", flag="--max-record-mb", mib=True,
        limit=Limit("must be a positive number of bytes, got {value}; raise it to keep larger records", gt=0))

    # A mixture's sources, each with its own RunConfig (etl.config.mixture); None: one SRC.
    mixture: Mixture | None = None

    def __post_init__(self) -> None:
        # pydantic (~40 ms to import) only once a config is built: `etl run --help` stays light.
        from etl.config.check import check

        check(self)
        check(self.mask)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        if self.mixture is None:  # an ordinary run's manifest stays as it was
            del body["mixture"]
        else:
            body["mixture"] = self.mixture.to_json()
        return body


@dataclass(frozen=True)
class FileKeys:
    """Keys of the config file that feed other settings rather than being one (seed 004's)."""

    version: Literal[1] = setting(1, "version", "schema version (seed 004)")
    mask: dict[MaskKey, MaskAction] = setting(
        DEFAULT_MASK, "mask", "train or mask each role's content (instruction input: prompt, response)")
    mask_default: MaskAction = setting("mask", "mask_default", "the rule of roles that mask does not list")
    max_seq_len: int | None = setting(None, "preprocessing.max_seq_len", "seed 004's name for seq_len "
                                      "(seq_len wins)", limit=SEQ_LEN_LIMIT)
    min_chars: int = setting(DEFAULT_MIN_CHARS, "preprocessing.min_chars", "text input: drop shorter texts",
                             limit=Limit("must be an integer >= 0, got {value}", ge=0))
    max_chars: int = setting(DEFAULT_MAX_CHARS, "preprocessing.max_chars", "text input: drop longer texts",
                             limit=Limit("must be an integer >= 0, got {value}", ge=0))


def file_settings() -> dict[str, dict[str, Declared]]:
    """The settings a config file can hold, by section ("" for top-level keys): key -> declaration."""
    groups: dict[str, dict[str, Declared]] = {}
    for d in declared(RunConfig) + declared(MaskOptions) + declared(FileKeys) + declared(MixOptions) + declared(
            SourceOptions):
        if d.setting.path:
            section, _, key = d.setting.path.rpartition(".")
            groups.setdefault(section, {})[key] = d
    return groups


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a JSON or TOML config file (by extension; JSON otherwise)."""
    import tomllib  # only when a file is read

    p = Path(path)
    if not p.is_file():
        raise EtlError(f"config file {path} not found")
    text = p.read_text(encoding="utf-8")
    try:
        return tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise EtlError(f"config file {path} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from exc
