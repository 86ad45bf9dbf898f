"""Input formats: one module per family of record shapes; `builders` names them by input type.

`builders` holds `BUILDERS` (input type -> builder) and runs a builder over a chunk; `base` the
SQL pieces every builder shares; `conversation` (one builder, shaped as chat and sharegpt, with
its SQL in `conversation_sql`), `instruction` (instruction, prompt_completion), `text` and
`transcript` (one string with role markers, HH-RLHF) hold the builders; `layout_hint` the input
type a record's keys suggest; `prepared` plans a builder's query once per DuckDB connection.
"""
