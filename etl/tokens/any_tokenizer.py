"""One text-encoding interface over the tokenizers users already have: `tokenizers.Tokenizer`,
transformers tokenizers, tiktoken `Encoding`s, etl's `ByteTokenizer` and duck-typed objects.

Content is always encoded as text (special-token strings in it never become special ids); token
lookup returns None for a token the tokenizer does not know. Used by `etl.sft` (the per-example reference).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from etl.errors import EtlError

Encode = Callable[[str], list[int]]
TokenId = Callable[[str], int | None]


class _TextEncoder(NamedTuple):
    """`encode(text) -> ids` (content as text), `token_id(token) -> id or None`, and how to add
    missing tokens to this kind of tokenizer (for error messages)."""

    encode: Encode
    token_id: TokenId
    how_to_add: Callable[[Sequence[str]], str]


def _is_kind(obj: Any, package: str, class_name: str) -> bool:
    """Whether `obj`'s class or a base is `package...class_name`: detection by name, so neither
    transformers nor tiktoken has to be importable (or imported) to ask."""
    return any(
        cls.__name__ == class_name and cls.__module__.split(".")[0] == package
        for cls in type(obj).__mro__
    )


@contextmanager
def _kept(obj: Any, name: str) -> Iterator[None]:
    """Restore `obj.name` after the block, so the user's tokenizer is left as it was (not
    thread-safe: another thread sharing the tokenizer object can see the temporary value)."""
    previous = getattr(obj, name)
    try:
        yield
    finally:
        setattr(obj, name, previous)


def _tokenizers_encoder(tok: Any) -> _TextEncoder:
    def encode(text: str) -> list[int]:
        # encode_special_tokens=True: added special tokens are not matched in the text;
        # add_special_tokens=False: no post-processor extras (BOS/EOS of a template processor).
        with _kept(tok, "encode_special_tokens"):
            tok.encode_special_tokens = True
            return list(tok.encode(text, add_special_tokens=False).ids)

    def how_to_add(missing: Sequence[str]) -> str:
        return f"add them with tokenizer.add_special_tokens({list(missing)!r})"

    return _TextEncoder(encode, tok.token_to_id, how_to_add)


def _transformers_encoder(tok: Any) -> _TextEncoder:
    # Fast tokenizers copy split_special_tokens onto their backend and leave it there.
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_special_tokens"):
        backend = None

    def encode(text: str) -> list[int]:
        # split_special_tokens=True: special strings are text; add_special_tokens=False: no BOS/EOS.
        if backend is None:
            return list(tok.encode(text, add_special_tokens=False, split_special_tokens=True))
        with _kept(backend, "encode_special_tokens"):
            return list(tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def token_id(token: str) -> int | None:
        # convert_tokens_to_ids answers the unk id (or None) for a token it does not know.
        tid = tok.convert_tokens_to_ids(token)
        if tid is None or (tid == tok.unk_token_id and token != tok.unk_token):
            return None
        return int(tid)

    def how_to_add(missing: Sequence[str]) -> str:
        return (
            f"add them with tokenizer.add_tokens({list(missing)!r}, special_tokens=True) "
            "and resize the model's embeddings"
        )

    return _TextEncoder(encode, token_id, how_to_add)


def _tiktoken_encoder(enc: Any) -> _TextEncoder:
    def encode(text: str) -> list[int]:
        # Nothing allowed and nothing disallowed: special strings are encoded as ordinary text.
        return list(enc.encode(text, allowed_special=set(), disallowed_special=()))

    def token_id(token: str) -> int | None:
        return int(enc.encode_single_token(token)) if token in enc.special_tokens_set else None

    def how_to_add(missing: Sequence[str]) -> str:
        new = ", ".join(f"{t!r}: <free id>" for t in missing)
        return (
            "build an Encoding that has them in special_tokens=, e.g. tiktoken.Encoding(name=..., "
            "pat_str=enc._pat_str, mergeable_ranks=enc._mergeable_ranks, "
            f"special_tokens={{**enc._special_tokens, {new}}})"
        )

    return _TextEncoder(encode, token_id, how_to_add)


def _lookup_of(tok: Any) -> TokenId:
    """`token_to_id`, else a mapping (`get_vocab()`, `special_tokens` or `vocab`)."""
    if callable(getattr(tok, "token_to_id", None)):

        def token_id(token: str) -> int | None:
            try:
                tid = tok.token_to_id(token)
            except KeyError:  # a dict-backed lookup that raises for unknown tokens
                return None
            return None if tid is None else int(tid)

        return token_id
    for name in ("get_vocab", "special_tokens", "vocab"):
        table = getattr(tok, name, None)
        table = table() if name == "get_vocab" and callable(table) else table
        if isinstance(table, Mapping):
            return lambda token, table=table: None if table.get(token) is None else int(table[token])
    raise EtlError(
        f"tokenizer {type(tok).__name__} has encode() but no way to look up special tokens: give "
        "it token_to_id(token) -> int | None, or a special_tokens / vocab mapping of token -> id"
    )


def _duck_encoder(tok: Any) -> _TextEncoder:
    def encode(text: str) -> list[int]:
        out = tok.encode(text)
        try:
            return [operator.index(t) for t in out]
        except TypeError as exc:
            raise EtlError(
                f"tokenizer {type(tok).__name__}.encode(text) returned {type(out).__name__}, not a "
                "sequence of ints; pass a tokenizers.Tokenizer, a transformers tokenizer, a tiktoken "
                "Encoding, or wrap yours so that encode(text) returns a list of ids"
            ) from exc

    def how_to_add(missing: Sequence[str]) -> str:
        return (
            f"make its token_to_id (or its token -> id mapping) know {list(missing)!r} (etl's "
            "byte tokenizer: ByteTokenizer(special_tokens=[...]))"
        )

    return _TextEncoder(encode, _lookup_of(tok), how_to_add)


def text_encoder(tokenizer: Any) -> _TextEncoder:
    """The encode / token-lookup pair for `tokenizer`, dispatched on its kind once.

    Accepted: a `tokenizers.Tokenizer`; a transformers tokenizer (`PreTrainedTokenizerBase`,
    fast or slow); a tiktoken `Encoding`; etl's `ByteTokenizer` (or `HFTokenizer`); any object
    whose `encode(text)` returns a sequence of ints and that has `token_to_id(token)` or a
    mapping (`get_vocab()`, `special_tokens`, `vocab`). The first three encode content with
    special-token matching off and without added BOS/EOS; a duck-typed `encode` is trusted to.

    Raises:
        EtlError: `tokenizer` is none of these.
    """
    if _is_kind(tokenizer, "tokenizers", "Tokenizer"):
        return _tokenizers_encoder(tokenizer)
    if _is_kind(tokenizer, "transformers", "PreTrainedTokenizerBase"):
        return _transformers_encoder(tokenizer)
    if _is_kind(tokenizer, "tiktoken", "Encoding"):
        return _tiktoken_encoder(tokenizer)
    if callable(getattr(tokenizer, "encode", None)):
        return _duck_encoder(tokenizer)
    raise EtlError(
        f"cannot encode text with a {type(tokenizer).__name__}: pass a tokenizers.Tokenizer, a "
        "transformers tokenizer, a tiktoken Encoding, etl's ByteTokenizer, or an object with "
        "encode(text) -> list[int] and token_to_id(token) -> int | None"
    )


def special_token_ids(encoder: _TextEncoder, tokens: Sequence[str]) -> list[int]:
    """Ids of `tokens`, which must all be known to the tokenizer.

    Raises:
        EtlError: naming every missing token and how to add it to this kind of tokenizer.
    """
    ids = [encoder.token_id(t) for t in tokens]
    missing = [t for t, i in zip(tokens, ids) if i is None]
    if missing:
        raise EtlError(
            f"the tokenizer has no token {', '.join(missing)}; {encoder.how_to_add(missing)}"
        )
    return [i for i in ids if i is not None]
