"""Fitting a preference pair (or an unpaired completion) into S tokens: pure numpy over lengths.

A pair is one prompt shared by two completions, so it is cut as one: the same prompt tokens go
from both sides. Its length is `prompt + max(chosen, rejected)` (fit `separate`: the two rows
TRL trains on, each at most S) or `prompt + chosen + rejected` (fit `shared`: the prefix-shared
packed layout, prompt once). An unpaired completion has rejected = 0, so both fits agree.

Policies (`PAIR_TRUNCATION_FNS`), each with its trade-off:

- `drop_oldest_turns` (default): drop whole oldest prompt turns (a user turn and what follows
  it up to the next user turn), never the leading system turn nor the last user turn; a pair
  that still does not fit is dropped. No turn is ever cut inside, at the cost of some pairs.
- `keep_start`: keep the prompt, cut each completion's end (TRL's collator's default); a pair
  whose prompt alone fills S is dropped (TRL drops it too). Cut completions lose their end of
  turn: the model learns a response that stops nowhere.
- `keep_end`: keep the completions, cut the prompt's start; dropped when that is not enough.
  Keeps what is trained whole but cuts through the template's first turn.
- `drop`: drop every pair that does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from etl.errors import EtlError
from etl.ragged import range_gather

PAIR_FITS = ("separate", "shared")
TOO_LONG = "pair_too_long"


@dataclass(frozen=True)
class PairLengths:
    """Per pair: prompt, chosen and rejected tokens (rejected 0 when unpaired); `prompt_offsets`
    (n + 1) places each prompt in the flat prompt tokens."""

    prompt: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray

    @property
    def prompt_offsets(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.prompt))).astype(np.int64)

    def fit(self, how: str) -> np.ndarray:
        """The length the pair must fit into S by, as `how` (a name of PAIR_FITS) measures it."""
        if how == "shared":
            return self.prompt + self.chosen + self.rejected
        return self.prompt + np.maximum(self.chosen, self.rejected)


@dataclass(frozen=True)
class PromptUnits:
    """The droppable prompt turns: per turn its pair, unit (ascending within a pair), start in
    the prompt and token count. The system head and each prompt's last unit are not listed."""

    pair: np.ndarray
    unit: np.ndarray
    start: np.ndarray
    length: np.ndarray


@dataclass(frozen=True)
class PairCut:
    """What a policy keeps: per pair `keep` (else dropped as `pair_too_long`), the completion
    lengths kept, turns dropped; per flat prompt token whether it is kept."""

    keep: np.ndarray
    prompt_keep: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray
    turns_dropped: np.ndarray


def _uncut(lengths: PairLengths, keep: np.ndarray) -> PairCut:
    n = len(lengths.prompt)
    return PairCut(keep, np.ones(int(lengths.prompt.sum()), bool), lengths.chosen, lengths.rejected,
                   np.zeros(n, np.int32))


def drop(lengths: PairLengths, units: PromptUnits, *, seq_len: int, fit: str) -> PairCut:
    """Drop every pair that does not fit."""
    return _uncut(lengths, lengths.fit(fit) <= seq_len)


def drop_oldest_turns(lengths: PairLengths, units: PromptUnits, *, seq_len: int, fit: str) -> PairCut:
    """Drop the oldest whole prompt units until the pair fits; drop the pair when they are not enough."""
    excess = lengths.fit(fit) - seq_len
    order = np.lexsort((units.unit, units.pair))
    pair, unit, start, length = units.pair[order], units.unit[order], units.start[order], units.length[order]
    # One row per unit: its tokens, and the tokens of the units before it in its pair.
    new_unit = np.ones(len(pair), bool)
    new_unit[1:] = (pair[1:] != pair[:-1]) | (unit[1:] != unit[:-1])
    unit_id = np.cumsum(new_unit) - 1
    size = np.bincount(unit_id, weights=length).astype(np.int64)
    upair = pair[new_unit]
    before = np.cumsum(size) - size
    first = np.ones(len(upair), bool)
    first[1:] = upair[1:] != upair[:-1]
    before -= np.repeat(before[first], np.diff(np.flatnonzero(np.append(first, True))))
    dropped_unit = (excess[upair] > 0) & (before < excess[upair])
    freed = np.bincount(upair, weights=size * dropped_unit, minlength=len(excess)).astype(np.int64)
    keep = freed >= excess
    gone = dropped_unit[unit_id]
    prompt_keep = np.ones(int(lengths.prompt.sum()), bool)
    prompt_keep[range_gather(lengths.prompt_offsets[pair[gone]] + start[gone], length[gone])] = False
    turns = np.bincount(pair[gone], minlength=len(excess)).astype(np.int32)
    return PairCut(keep, prompt_keep, lengths.chosen, lengths.rejected, turns)


def keep_start(lengths: PairLengths, units: PromptUnits, *, seq_len: int, fit: str) -> PairCut:
    """Keep the prompt whole and cut each completion's end; under `shared`, the longer one first."""
    budget = seq_len - lengths.prompt
    chosen, rejected = np.minimum(lengths.chosen, budget), np.minimum(lengths.rejected, budget)
    if fit == "shared":
        small = np.minimum(lengths.chosen, lengths.rejected)
        cap = np.where(2 * small <= budget, budget - small, budget // 2)
        over = lengths.chosen + lengths.rejected > budget
        chosen = np.where(over, np.minimum(lengths.chosen, cap), lengths.chosen)
        rejected = np.where(over, np.minimum(lengths.rejected, cap), lengths.rejected)
    keep = (budget > 0) & (chosen > 0) & ((rejected > 0) | (lengths.rejected == 0))
    return PairCut(keep, np.ones(int(lengths.prompt.sum()), bool), np.maximum(chosen, 0), np.maximum(rejected, 0),
                   np.zeros(len(keep), np.int32))


def keep_end(lengths: PairLengths, units: PromptUnits, *, seq_len: int, fit: str) -> PairCut:
    """Keep the completions whole and cut the prompt's start; drop the pair when no prompt token would stay."""
    excess = np.maximum(lengths.fit(fit) - seq_len, 0)
    keep = excess < lengths.prompt
    offsets = lengths.prompt_offsets
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths.prompt)
    prompt_keep = position >= np.repeat(excess, lengths.prompt)
    return PairCut(keep, prompt_keep, lengths.chosen, lengths.rejected, np.zeros(len(keep), np.int32))


PairPolicy = Callable[..., PairCut]
PAIR_TRUNCATION_FNS: dict[str, PairPolicy] = {
    "drop_oldest_turns": drop_oldest_turns,
    "keep_start": keep_start,
    "keep_end": keep_end,
    "drop": drop,
}
# The run's turn policies that mean one of these for pairs (`right` cuts an example's end), and
# the policies only pairs have.
ALIASES = {"right": "keep_start"}
PAIR_ONLY = ("keep_start", "keep_end")


def pair_policy(name: str) -> PairPolicy:
    """The pair policy of a run's `truncation` setting."""
    name = ALIASES.get(name, name)
    if name not in PAIR_TRUNCATION_FNS:
        raise EtlError(f"truncation {name!r} does not apply to preference data; use one of "
                       f"{', '.join(PAIR_TRUNCATION_FNS)} (--truncation, or truncation in the config)")
    return PAIR_TRUNCATION_FNS[name]
