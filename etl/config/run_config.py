"""The resolved settings of one `etl run`, and the declarative config file that sets them.

The file follows seed 004's schema exactly (`version`, `input`, `mask`, `mask_default`,
`preprocessing`, `output`) plus etl's own sections (`template`, `tokenizer`, `seq_len`,
`truncation`, `mask_options`, `split`, `default_system`). Unknown keys and bad values are
errors that name the field and the allowed values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from etl.columns import DEFAULT_SEQ_LEN, DEFAULT_SYSTEM_TEXT
from etl.errors import EtlError
from etl.formats.base import DEFAULT_MAX_RECORD_BYTES

# 16 MiB of JSON per chunk (~3M Qwen tokens): T0 with Qwen2.5 peaks at ~0.9 GB RSS and runs
# as fast as with 32 MiB (1.15 GB); 8 MiB saves another 0.2 GB for ~1% of speed.
DEFAULT_CHUNK_BYTES = 16 << 20
TRUNCATION_POLICIES = ("drop_oldest_turns", "keep_prefix", "right", "drop")
EOT_POLICIES = ("turn", "last", "all", "none")
STORAGE_FORMATS = ("parquet", "bin", "h5")
DEDUP_MODES = ("prefix200", "exact")
# Seed 004's instruction mode names its mask keys after fields, not roles.
FIELD_ROLES = {"prompt": "user", "response": "assistant"}


@dataclass(frozen=True)
class MaskOptions:
    """Which pieces of which turns are trained (DESIGN §5 defaults: assistant content + end)."""

    train_roles: tuple[str, ...] = ("assistant",)
    train_header: bool | None = None  # None: the template's default (seed 001's trains the marker)
    eot: str = "turn"  # turn | last | all | none
    last_assistant_only: bool = False
    require_complete_user: bool = (
        False  # seed 001: an assistant turn trains only after a whole user turn
    )


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run; written into the manifest so a run can be reproduced."""

    tokenizer: str = "bytes"
    template: str = "ngpt"
    seq_len: int = DEFAULT_SEQ_LEN
    input_type: str = "chat"
    input_options: dict[str, Any] = field(default_factory=dict)
    default_system: str | None = DEFAULT_SYSTEM_TEXT
    mask: MaskOptions = field(default_factory=MaskOptions)
    truncation: str = "drop_oldest_turns"
    deduplicate: bool = False
    dedup_mode: str = "prefix200"
    max_items: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    val_fraction: float = 0.0
    split_seed: int = 0
    domain_key: str | None = None
    storage_format: str = "parquet"
    max_tokens_per_shard: int = 100_000_000
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES  # longer records: record_too_large, unparsed

    def __post_init__(self) -> None:
        self._check_types()
        _check(self.seq_len >= 2, "seq_len", f"must be at least 2 (S = T + 1 tokens), got {self.seq_len}")
        _choice("truncation.policy", self.truncation, TRUNCATION_POLICIES)
        _choice("mask_options.eot", self.mask.eot, EOT_POLICIES)
        _choice("output.storage_format", self.storage_format, STORAGE_FORMATS)
        _choice("preprocessing.dedup_mode", self.dedup_mode, DEDUP_MODES)
        _check(0.0 <= self.val_fraction < 1.0, "split.val_fraction", f"must be in [0, 1), got {self.val_fraction}")
        _check(self.max_items is None or self.max_items > 0, "preprocessing.max_items", "must be positive or null")
        _check(self.chunk_bytes > 0, "chunk_bytes", "must be positive")
        _check(self.max_record_bytes > 0, "preprocessing.max_record_bytes",
               f"must be a positive number of bytes, got {self.max_record_bytes}; raise it to keep larger records")
        _check(self.max_tokens_per_shard > 0, "output.max_tokens_per_shard", "must be positive")

    def _check_types(self) -> None:
        """Wrong JSON/TOML types fail loudly: "false" as a string would otherwise be true."""
        for name in ("deduplicate", "add_bos", "add_eos"):
            _typed(f"preprocessing.{name}", getattr(self, name), bool)
        for name in ("last_assistant_only", "require_complete_user"):
            _typed(f"mask_options.{name}", getattr(self.mask, name), bool)
        _typed("mask_options.train_header", self.mask.train_header, bool, optional=True)
        _typed("seq_len", self.seq_len, int)
        _typed("preprocessing.max_items", self.max_items, int, optional=True)
        _typed("split.seed", self.split_seed, int)
        _typed("output.max_tokens_per_shard", self.max_tokens_per_shard, int)
        _typed("chunk_bytes", self.chunk_bytes, int)
        _typed("preprocessing.max_record_bytes", self.max_record_bytes, int)
        _typed("split.val_fraction", self.val_fraction, (int, float))
        for name in ("tokenizer", "template", "truncation", "dedup_mode", "storage_format", "input_type"):
            _typed(name, getattr(self, name), str)
        _typed("default_system", self.default_system, str, optional=True)
        _typed("output.domain_key", self.domain_key, str, optional=True)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_TYPE_WORDS = {bool: "true or false", int: "an integer", str: "a string", (int, float): "a number"}


def _typed(name: str, value: object, kind: type | tuple[type, ...], *, optional: bool = False) -> None:
    if value is None and optional:
        return
    # bool is an int in Python; a count or a fraction given as true/false is still a mistake.
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    _check(ok, name, f"must be {_TYPE_WORDS[kind]}{' or null' if optional else ''}, got {value!r}")


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise EtlError(f"config: {name} {message}")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    _check(value in allowed, name, f"is {value!r}; allowed: {', '.join(allowed)}")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a JSON or TOML config file (by extension; JSON otherwise)."""
    p = Path(path)
    if not p.is_file():
        raise EtlError(f"config file {path} not found")
    text = p.read_text(encoding="utf-8")
    try:
        return tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise EtlError(f"config file {path} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from exc
