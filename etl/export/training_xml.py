"""The episode loader's ``<training>`` XML block: dataset_mode, sampling, epoch flags, pad id, min tokens.

Unknown tags are ignored (the block belongs to a larger training config); a known tag with a bad
value is an `EtlError` that names the tag.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from etl.errors import EtlError

DATASET_MODES = ("token_stream", "sft_episode")
SAMPLING_MODES = ("random", "epoch")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


@dataclass(frozen=True)
class TrainingConfig:
    """The episode loader's flags (defaults as its specification states) plus the loader sizes a
    config may carry.

    Attributes:
        dataset_mode: ``token_stream`` (default, random windows) or ``sft_episode``.
        batch_sampling_mode: ``random`` or ``epoch``; None resolves to ``random`` for
            token_stream and ``epoch`` for sft_episode (the specification's recommendation).
        epoch_shuffle: shuffle episode order each epoch.
        epoch_drop_last: drop the last incomplete batch of an epoch.
        epoch_seed: epoch e is shuffled with ``epoch_seed + e``.
        pad_token_id: None falls back to the tokenizer's EOS id, then the export's meta.json.
        episode_min_tokens: episodes shorter than this are skipped (at least 2 gives y a token).
        batch_size: optional here; the loader's argument wins.
        block_size: optional here (T); the loader's argument wins.
        use_loss_mask: return (x, y, mask) when mask.bin exists.
    """

    dataset_mode: Literal["token_stream", "sft_episode"] = "token_stream"
    batch_sampling_mode: Literal["random", "epoch"] | None = None
    epoch_shuffle: bool = True
    epoch_drop_last: bool = True
    epoch_seed: int = 1337
    pad_token_id: int | None = None
    episode_min_tokens: int = 2
    batch_size: int | None = None
    block_size: int | None = None
    use_loss_mask: bool = True

    def __post_init__(self) -> None:
        if self.dataset_mode not in DATASET_MODES:
            raise EtlError(
                f"<dataset_mode> must be one of {DATASET_MODES}, got {self.dataset_mode!r}"
            )
        if self.batch_sampling_mode not in (None, *SAMPLING_MODES):
            raise EtlError(
                f"<batch_sampling_mode> must be one of {SAMPLING_MODES}, "
                f"got {self.batch_sampling_mode!r}"
            )
        if self.episode_min_tokens < 0:
            raise EtlError(f"<episode_min_tokens> must be >= 0, got {self.episode_min_tokens}")

    @property
    def sampling(self) -> str:
        """The batch sampling mode after applying the per-dataset_mode default."""
        if self.batch_sampling_mode is not None:
            return self.batch_sampling_mode
        return "epoch" if self.dataset_mode == "sft_episode" else "random"

    @classmethod
    def from_xml(cls, source: str | os.PathLike[str]) -> TrainingConfig:
        """Parse the ``<training>`` element of an XML file or string.

        Args:
            source: a path, or XML text starting with ``<``; ``<training>`` may be the root or
                nested anywhere below it.

        Raises:
            EtlError: unreadable XML, no ``<training>`` element, or a bad value.
        """
        text = str(source)
        try:
            if text.lstrip().startswith("<"):
                root = ET.fromstring(text)
            else:
                root = ET.parse(Path(source)).getroot()
        except (ET.ParseError, OSError) as exc:
            raise EtlError(f"cannot read the XML config {text[:80]!r}: {exc}") from None
        training = root if root.tag == "training" else root.find(".//training")
        if training is None:
            raise EtlError("the XML config has no <training> element; add one (see `TrainingConfig`)")
        values: dict[str, Any] = {}
        for f in fields(cls):
            node = training.find(f.name)
            if node is not None and (node.text or "").strip():
                values[f.name] = _parse(f.name, node.text.strip(), cls.__annotations__[f.name])
        return cls(**values)


def _parse(tag: str, text: str, annotation: str) -> Any:
    """One XML value by the field's annotation (annotations are strings under `from __future__`)."""
    if annotation.startswith("bool"):
        low = text.lower()
        if low not in _TRUE | _FALSE:
            raise EtlError(f"<{tag}> must be true or false, got {text!r}")
        return low in _TRUE
    if annotation.startswith("int"):
        try:
            return int(text)
        except ValueError:
            raise EtlError(f"<{tag}> must be an integer, got {text!r}") from None
    return text
