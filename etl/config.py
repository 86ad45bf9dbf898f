"""The resolved settings of one `etl run`: what to read, how to tokenize, mask and truncate."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from etl.columns import DEFAULT_SEQ_LEN, DEFAULT_SYSTEM_TEXT
from etl.errors import EtlError
from etl.reader import DEFAULT_CHUNK_BYTES
from etl.stages import MaskOptions

TRUNCATION_POLICIES = ("drop_oldest_turns",)
EOT_POLICIES = ("turn", "last", "all", "none")


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run; written into the manifest so a run can be reproduced."""

    tokenizer: str = "bytes"
    template: str = "ngpt"
    seq_len: int = DEFAULT_SEQ_LEN
    input_type: str = "chat"
    messages_key: str = "messages"
    default_system: str | None = DEFAULT_SYSTEM_TEXT
    mask: MaskOptions = field(default_factory=MaskOptions)
    truncation: str = "drop_oldest_turns"
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise EtlError(f"--seq-len must be at least 2 (S = T + 1 tokens), got {self.seq_len}")
        if self.truncation not in TRUNCATION_POLICIES:
            raise EtlError(
                f"truncation {self.truncation!r} is not one of {', '.join(TRUNCATION_POLICIES)}"
            )
        if self.mask.eot not in EOT_POLICIES:
            raise EtlError(f"mask eot policy {self.mask.eot!r} is not one of {', '.join(EOT_POLICIES)}")
        if self.chunk_bytes < 1:
            raise EtlError(f"chunk_bytes must be positive, got {self.chunk_bytes}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
