"""The token cache: per-turn content ids kept across runs, keyed by the tokenizer and the text.

Ids of a content string depend only on the string and the tokenizer, not on seq_len, masks,
templates or mixtures, so a rerun with other options looks them up instead of tokenizing
(docs/token-cache.md). `keys` says which texts are the same, `segments` stores ids on disk,
`index` finds them, `store` is the cache a run uses, `folder` its place, size limit and `etl cache`.
"""
