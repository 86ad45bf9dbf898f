"""Input formats: one module per family of record shapes, each registering builders in `etl.formats.registry`.

`base` holds the registry and the SQL pieces every builder shares; `conversation` (chat,
sharegpt, with its SQL in `conversation_sql`), `instruction` (instruction, prompt_completion),
`text` and `transcript` (one string with role markers, HH-RLHF) hold the builders.
"""
