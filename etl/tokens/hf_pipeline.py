"""The tokenizer as transformers builds it, for encoding one piece of a rendered conversation.

Some tokenizer classes do not use tokenizer.json's normalizer and pre-tokenizer when transformers
loads them: transformers 5's `LlamaTokenizer` (Llama 2, Mistral, Phi-3, CodeLlama, ...) drops the
file's `Prepend("▁")` normalizer and rebuilds a `Metaspace` pre-tokenizer that prepends "▁" only
at the very start of the input (`prepend_scheme="first"`, legacy=False), where the file's
normalizer prepends it to every text between added tokens. A trainer gets transformers' ids, so
etl encodes as transformers does: Phi-3's `<|user|>\\nQuestion` is `Question` (16492), not
`▁Question` (894).

etl encodes *pieces* (a turn's content, a template string), each of which sits after a control
token inside the whole text, never at its start (every shipped template opens with a special
token). So the pre-tokenizer etl uses for pieces prepends nothing where transformers prepends
only "first"; "always" (legacy=True) prepends to every piece, as to every text between added
tokens. `PIPELINES` maps `tokenizer_class` (tokenizer_config.json) to the rule; another family
is one entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

METASPACE = "▁"


def _prepend_scheme(config: Mapping[str, Any]) -> str:
    """transformers' `_get_prepend_scheme`: add_prefix_space (default True) and legacy (default False)."""
    if config.get("add_prefix_space") is False:
        return "never"
    return "always" if config.get("legacy", False) else "first"


def _llama(tok: Any, config: Mapping[str, Any], *, whole: bool) -> None:
    """`LlamaTokenizer.__init__` of transformers 5: no normalizer, Metaspace(split=False); `whole`:
    for a whole rendered text (a reference), else for pieces."""
    # tokenizers: only when a tokenizer loads
    from tokenizers import pre_tokenizers

    scheme = _prepend_scheme(config)
    # "first" prepends at offset 0 of the whole input only: a piece never starts there.
    piece_scheme = "never" if scheme == "first" and not whole else scheme
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme=piece_scheme, split=False)


# tokenizer_class (without "Fast") -> rewrites a loaded `tokenizers.Tokenizer` in place; `describe`
# says what (the manifest's `tokenizer.pipeline`, part of the token cache's key).
PIPELINES: dict[str, Callable[..., None]] = {
    "LlamaTokenizer": _llama,
    "CodeLlamaTokenizer": _llama,
}


def pipeline_of(config: Mapping[str, Any]) -> Callable[..., None] | None:
    """The rule for a tokenizer_config.json's `tokenizer_class`, or None (tokenizer.json as it is)."""
    name = str(config.get("tokenizer_class") or "")
    return PIPELINES.get(name.removesuffix("Fast"))


def as_transformers(tok: Any, config: Mapping[str, Any], *, whole: bool = False) -> Any:
    """`tok` (a `tokenizers.Tokenizer`) rebuilt as transformers builds it, for pieces or a `whole` text."""
    if (rebuild := pipeline_of(config)) is not None:
        rebuild(tok, config, whole=whole)
    return tok


def describe(config: Mapping[str, Any]) -> str | None:
    """What `pipeline_of` changes, without loading the tokenizer (None: nothing)."""
    if pipeline_of(config) is None:
        return None
    return (f"as transformers' {config.get('tokenizer_class')}: no normalizer, Metaspace(prepend_scheme="
            f"{_prepend_scheme(config)!r}, split=False)")
