"""Per-example reference: serialize, mask, truncate+pad and collate, with contract signatures.

Plain Python over lists: the readable statement of the semantics that the vectorized pipeline
(`etl.pipeline.stages`) and the loader's collate are tested against, never on a hot path.
`serialize_chat_to_ids` takes the tokenizer a user has (`etl.tokens.any_tokenizer`).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from etl.columns import DEFAULT_SYSTEM_TEXT, IGNORE_INDEX
from etl.errors import EtlError
from etl.tokens.any_tokenizer import special_token_ids, text_encoder
from etl.tokens.templates import NGPT_ASST, NGPT_EOT, NGPT_SYS, NGPT_USR

ChatMsg = TypedDict("ChatMsg", {"role": Literal["system", "user", "assistant"], "content": str})
ChatExample = TypedDict("ChatExample", {"messages": list[ChatMsg]})

ROLE_TOKENS = {"system": NGPT_SYS, "user": NGPT_USR, "assistant": NGPT_ASST}

__all__ = [
    "DEFAULT_SYSTEM_TEXT",
    "IGNORE_INDEX",
    "collate_sft_batch",
    "pack_sft_ids_and_mask",
    "serialize_chat_to_ids",
    "sft_loss_mask_for_ids",
]


def serialize_chat_to_ids(
    ex: ChatExample,
    *,
    tokenizer: Any,
    default_system_text: str,
) -> list[int]:
    """Returns token ids for the whole chat using the token-native (ngpt) template.

    Starts with `<|ngpt_sys|> ... <|ngpt_eot|>`: the example's own system message when its
    first message is a system message, else `default_system_text`. Every message becomes
    `[ROLE] content [EOT]`. The format's "SYS once" describes canonical input (an optional
    system message first); a system message elsewhere is kept as a system turn where it is,
    as Hugging Face chat templates render it, rather than dropped or merged.

    Args:
        ex: `{"messages": [{"role": ..., "content": ...}, ...]}`.
        tokenizer: a `tokenizers.Tokenizer`, a transformers tokenizer (fast or slow), a
            tiktoken `Encoding`, etl's `ByteTokenizer`, or any object whose `encode(text)`
            returns a sequence of ints and that has `token_to_id(token)` (or a token -> id
            mapping). It must know the four ngpt role tokens. Content is always encoded as
            text, without BOS/EOS: a special-token string in a message (an ngpt marker,
            `<|im_end|>`, `<|endoftext|>`) never becomes a special id. A `tokenizers.Tokenizer`
            gets `encode_special_tokens` set for each call and restored after.
        default_system_text: the system content used when the chat has none first.

    Raises:
        EtlError: the tokenizer lacks an ngpt role token (the message says how to add it), is
            of no accepted kind, or encodes some content text as a role token id.
    """
    encoder = text_encoder(tokenizer)
    role_tokens = (NGPT_SYS, NGPT_USR, NGPT_ASST, NGPT_EOT)
    role_ids = dict(zip(role_tokens, special_token_ids(encoder, role_tokens)))
    eot = role_ids[NGPT_EOT]
    messages = list(ex["messages"])
    if not messages or messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": default_system_text})
    ids: list[int] = []
    for msg in messages:
        content = encoder.encode(msg["content"])
        _check_no_role_ids(content, role_ids, role=msg["role"])
        ids.append(role_ids[ROLE_TOKENS[msg["role"]]])
        ids.extend(content)
        ids.append(eot)
    return ids


def _check_no_role_ids(content: list[int], role_ids: dict[str, int], *, role: str) -> None:
    """Raise when plain text encoded to a role id: the mask scan and the truncation would take
    it for a turn boundary. A tokenizer does this when a marker is an ordinary (non-special)
    token, or sits in the base vocabulary where its pre-tokenizer keeps it whole."""
    clash = [tok for tok, tid in role_ids.items() if tid in content]
    if clash:
        raise EtlError(
            f"the tokenizer encodes text of a {role} message as the role token {clash[0]} "
            f"(id {role_ids[clash[0]]}); register the ngpt markers as special tokens that text "
            "never produces (e.g. tokenizer.add_special_tokens([...]) on a tokenizer whose "
            "vocabulary does not already hold them), not as ordinary tokens"
        )


def sft_loss_mask_for_ids(
    ids: list[int],
    *,
    sys_id: int,
    usr_id: int,
    asst_id: int,
    eot_id: int,
) -> list[bool]:
    """Returns the mask per token position in ids (same length).

    Scanning rule of the token-native chat format: `asst_id` enters assistant mode (the marker
    itself is False); following tokens are True up to and including the next `eot_id`, which
    leaves the mode. A system or user marker also leaves it. Everything else is False.
    """
    mask: list[bool] = []
    in_assistant = False
    for tok in ids:
        if tok == asst_id:
            in_assistant = True
            mask.append(False)
        elif tok in (sys_id, usr_id):
            in_assistant = False
            mask.append(False)
        elif in_assistant:
            mask.append(True)
            if tok == eot_id:
                in_assistant = False
        else:
            mask.append(False)
    return mask


def _segments(ids: list[int], role_ids: dict[int, str], eot_id: int) -> list[tuple[int, int, str]]:
    """Turns as (start, end_exclusive, role): a role token up to and including the next EOT."""
    segs: list[tuple[int, int, str]] = []
    start: int | None = None
    for i, tok in enumerate(ids):
        if tok in role_ids:
            if start is not None:  # an unterminated turn ends where the next one starts
                segs.append((start, i, role_ids[ids[start]]))
            start = i
        elif tok == eot_id and start is not None:
            segs.append((start, i + 1, role_ids[ids[start]]))
            start = None
    if start is not None:
        segs.append((start, len(ids), role_ids[ids[start]]))
    return segs


def _drop_oldest_units(
    ids: list[int], mask: list[bool], segs: list[tuple[int, int, str]], S: int
) -> tuple[list[int], list[bool]]:
    """Rule 1+2: drop whole oldest user+assistant units after the system turn until it fits.

    A unit starts at each user turn (turns before the first user turn form a unit of their
    own, which keeps imperfect alternation robust). The unit holding the final assistant turn,
    and everything after it, is never dropped; the fit test counts up to that turn's end.
    """
    body = segs[1:] if segs and segs[0][2] == "system" else segs
    if not body:
        return ids, mask
    head_end = body[0][0]
    units: list[list[tuple[int, int, str]]] = []
    for seg in body:
        if not units or seg[2] == "user":
            units.append([])
        units[-1].append(seg)
    asst_units = [k for k, unit in enumerate(units) if any(s[2] == "assistant" for s in unit)]
    protected = asst_units[-1] if asst_units else len(units) - 1
    # What must fit: the head plus everything up to the final assistant end-of-turn. Turns
    # after it carry no loss and the hard cut removes them when they do not fit, so counting
    # them here would drop older trained pairs for nothing.
    asst_ends = [e for _, e, role in body if role == "assistant"]
    end = asst_ends[-1] if asst_ends else len(ids)
    drop = 0
    while drop < protected and head_end + (end - units[drop][0][0]) > S:
        drop += 1
    keep_from = units[drop][0][0]
    return ids[:head_end] + ids[keep_from:], mask[:head_end] + mask[keep_from:]


def pack_sft_ids_and_mask(
    ids: list[int],
    mask: list[bool],
    *,
    S: int,
    sys_id: int,
    usr_id: int,
    asst_id: int,
    eot_id: int,
    pad_id: int,
) -> tuple[list[int], list[bool]]:
    """Enforces length exactly S (S = T + 1).

    - left-truncate by whole turns where possible (drop oldest user+assistant pairs, never the
      final assistant turn);
    - if still too long, hard left-truncate: keep the S tokens that end with the final
      assistant EOT (turns after it carry no loss; ending there keeps that EOT a target, so the
      model learns to stop), or the last S tokens when there is no assistant turn;
    - right-pad with pad_id (mask False) if too short.

    Returns (ids_packed, mask_packed).
    """
    role_ids = {sys_id: "system", usr_id: "user", asst_id: "assistant"}
    if len(ids) > S:
        ids, mask = _drop_oldest_units(ids, mask, _segments(ids, role_ids, eot_id), S)
    if len(ids) > S:
        asst_ends = [e for _, e, role in _segments(ids, role_ids, eot_id) if role == "assistant" and ids[e - 1] == eot_id]
        stop = asst_ends[-1] if asst_ends else len(ids)
        start = max(0, stop - S)
        ids, mask = ids[start:stop], mask[start:stop]
    pad = S - len(ids)
    return ids + [pad_id] * pad, mask + [False] * pad


def collate_sft_batch(
    packed: list[tuple[list[int], list[bool]]],
    *,
    T: int,
    device: str,
    ignore_index: int = IGNORE_INDEX,
) -> tuple[Any, Any, Any]:
    """Packed items have length S = T + 1.

    Returns:
        x: (B, T) int64 = ids[:-1]; y: (B, T) int64 = ids[1:] with ignore_index where the
        mask is False; loss_mask: (B, T) bool = mask[1:] (aligned to y).
    """
    # torch (a slow import: docs/design.md, Measured costs): only when a batch is collated
    import torch

    for ids, mask in packed:
        if len(ids) != T + 1 or len(mask) != T + 1:
            raise ValueError(f"packed items must have length T + 1 = {T + 1}, got {len(ids)}/{len(mask)}")
    ids_t = torch.tensor([ids for ids, _ in packed], dtype=torch.long).reshape(len(packed), T + 1)
    mask_t = torch.tensor([mask for _, mask in packed], dtype=torch.bool).reshape(len(packed), T + 1)
    x = ids_t[:, :-1]
    loss_mask = mask_t[:, 1:]
    y = ids_t[:, 1:].masked_fill(~loss_mask, ignore_index)
    return x.to(device), y.to(device), loss_mask.to(device)
