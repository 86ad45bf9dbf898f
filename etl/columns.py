"""Column names, file names and constants of the output layout, defined once.

Everything that reads or writes `DST/` imports names from here, so a rename is one edit.
"""

from __future__ import annotations

from etl.errors import EtlError

IGNORE_INDEX = -100
DEFAULT_SYSTEM_TEXT = "you are a helpful assistant."
# `--template`'s default: `hf` for a tokenizer with a chat_template, else `ngpt` (etl.tokens.hf_template).
AUTO_TEMPLATE = "auto"
DEFAULT_SEQ_LEN = 2048
# S, the tokens of an example or a pack, is T + 1: T next-token targets need S >= 2. One rule for
# `etl run` (seq_len), `etl pack --seq-len` and the loader's collate functions.
MIN_SEQ_LEN = 2
SEQ_LEN_RULE = f"must be at least {MIN_SEQ_LEN} (S = T + 1 tokens)"


def check_seq_len(seq_len: int, name: str = "seq_len") -> int:
    """`seq_len` if it keeps the rule, else an EtlError naming it as the caller's user spells it."""
    if seq_len < MIN_SEQ_LEN:
        raise EtlError(f"{name} {SEQ_LEN_RULE}, got {seq_len}")
    return seq_len

# `preprocessing.max_record_bytes`: a record whose JSON text is longer is rejected
# (`record_too_large`) before it is parsed or tokenized. 16 MiB, the default chunk: long-context
# SFT at S = 32k-128k tokens is 0.1-0.5 MiB of text at ~4 bytes per token (~1 MiB as JSON with
# escapes), so a longer record is mostly cut away at S anyway, and one record cannot double a
# chunk. Below the limit a record adds ~6x its size to the peak RSS with Qwen2.5, ~8x with the
# byte tokenizer (4 bytes of ids per byte of text); bench/big_record.py.
DEFAULT_MAX_RECORD_BYTES = 16 << 20
DEFAULT_MIN_CHARS = 50  # the config file's preprocessing defaults of text input
DEFAULT_MAX_CHARS = 2_000_000

# Layout of DST/.
MANIFEST_FILE = "_manifest.json"
# 2: the manifest's `files` lists every file written with rows, bytes and sha256 (1: data/turns
# paths only); readers accept 2 and newer. 3: the manifest carries RECORD_SHA256, its own checksum,
# and must (a 2 without one is read with a warning: etl.output.verify).
MANIFEST_FORMAT_VERSION = 3
MANIFEST_FILES_VERSION = 2
# Every record etl writes (_manifest.json, _packs.json, _export.json) holds the sha256 of its own
# canonical JSON (sorted keys, no spaces, ASCII) less this key; readers verify it before trusting it.
RECORD_SHA256 = "record_sha256"
# The run's identity: 16 hex digits the manifest records under RUN_ID and every part
# carries in its Parquet key-value metadata (etl.output.parquet). A pack index part carries its
# `etl pack`'s (`_packs.json`'s RUN_ID) and the run's whose data it indexes (DATA_RUN_ID).
RUN_ID = "run_id"
DATA_RUN_ID = "data_run_id"
DATA_DIR = "data"
TURNS_DIR = "turns"
REJECTS_DIR = "_rejects"
VAL_STORAGE_DIR = "_val"  # bin/h5 export of the val split: DST/_val/<domain>/
# Tokens per bin/h5 shard (`output.max_tokens_per_shard`, `etl export --max-tokens-per-shard`):
# 800 MB of int64 per stream file.
DEFAULT_MAX_TOKENS_PER_SHARD = 100_000_000
# Files of the writer protocol (etl.output.ownership): an export's record of what it wrote, the journal
# of paths a writer is about to create, and the lock one writer at a time holds.
EXPORT_FILE = "_export.json"
JOURNAL_FILE = "_journal.jsonl"
LOCK_FILE = "_lock"
# Where `--engine ray` workers write parts before the driver renames them into place (etl.engine).
STAGING_DIR = "_staging"
# `--ray-timeout`: seconds `--engine ray` waits for the cluster at `--ray-address` to answer
# (etl.engine.ray_connect). Well above the seconds a healthy cluster takes to join, far below
# Ray's own ~14 minutes of retries: with start-up a run fails within 30 s (docs/design.md, Measured costs).
RAY_CONNECT_TIMEOUT_S = 25.0
SPLITS = ("train", "val")
# The dataset card `load_dataset(DST)` reads (YAML `configs`: which parts form which split), and
# the Hugging Face name of each etl split folder.
CARD_FILE = "README.md"
HF_SPLITS = {"train": "train", "val": "validation"}
# `etl pack`: the pack index DST/packs/<split>/part-*.parquet and its writer's record
# `_packs.json`, the record every reader trusts; MANIFEST_PACKS is the manifest key holding a copy of
# its per-split summary, derived from it after it is written (absent after a crash, never stale).
PACKS_DIR = "packs"
PACKS_FILE = "_packs.json"
MANIFEST_PACKS = "packs"
# Names `etl pack --strategy` accepts and `_packs.json` records; etl.packing.registry.PACKERS
# maps each to its function (a test keeps the two equal). Kept here so `etl --help` imports no numpy.
PACK_STRATEGIES = ("bfd", "ffd", "sequential", "stream")
# `input.type` names, the record layouts `etl run` reads; etl.formats.builders.BUILDERS maps each
# to its builder (a test keeps the two equal). Kept here so `etl run --help` imports no DuckDB.
INPUT_TYPES = ("chat", "sharegpt", "instruction", "prompt_completion", "text", "transcript", "preference",
               "unpaired")
# What one `data` row is (the manifest's `kind`): etl.kinds.KINDS, decided by the input type.
MANIFEST_KIND = "kind"
# The side of an example longer than S that a packer or the loader cuts: right keeps its first S
# tokens, left its last S (`--truncation`, `truncation=`; not the run's turn policies).
CUT_SIDES = ("right", "left")

# `data` columns (contract).
ID = "id"
SOURCE_FILE = "source_file"
SOURCE_LINE = "source_line"
DOMAIN = "domain"
SPLIT = "split"
INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"
# Extension: `loss_mask` again under the name TRL's SFTTrainer reads. TRL 1.16 builds `labels` from
# an `assistant_masks` column of a tokenized dataset and ignores `loss_mask`, so without it
# `load_dataset(DST)["train"]` would train every token. Same alignment (mask[i]: input_ids[i] is a
# target; the model shifts). Bit-packed bools, zstd: +2.1% data bytes on T0 55k with Qwen2.5
# (chatml, 5% val: 12.24 -> 12.51 MB), +3.4% on HH-RLHF's multi-turn harmless-base test; its write
# cost is in docs/design.md, Measured costs.
ASSISTANT_MASKS = "assistant_masks"
LOSS_WEIGHT = "loss_weight"
NUM_TOKENS = "num_tokens"
NUM_TRAINED = "num_trained"
NUM_TURNS = "num_turns"
NUM_TURNS_DROPPED = "num_turns_dropped"
TRUNCATED = "truncated"
# `data` columns of image data (contract; a run whose tokenizer folder has an image processor):
# HF datasets `Image` structs (so `load_dataset(DST)` gives PIL images), the processor's
# [t, h, w] patch grid of each, and the image tokens of the example.
IMAGES = "images"
IMAGE_GRID_THW = "image_grid_thw"
IMAGE_SHA256 = "image_sha256"  # extension: each image's sha256, which `--images reference` checks
IMAGE_SIZES = "image_sizes"  # extension: each image's [width, height] as load_image sees it
NUM_IMAGE_TOKENS = "num_image_tokens"

# `data` columns of preference pairs and unpaired completions (contract; TRL's names). `prompt_ids +
# chosen_ids` is the whole chosen conversation as the template renders it; a mask is True where a
# completion token is trained (False on a tool result inside a multi-turn completion).
PROMPT_IDS = "prompt_ids"
CHOSEN_IDS = "chosen_ids"
REJECTED_IDS = "rejected_ids"
COMPLETION_IDS = "completion_ids"
CHOSEN_MASK = "chosen_mask"
REJECTED_MASK = "rejected_mask"
COMPLETION_MASK = "completion_mask"
NUM_PROMPT_TOKENS = "num_prompt_tokens"
NUM_CHOSEN_TOKENS = "num_chosen_tokens"
NUM_REJECTED_TOKENS = "num_rejected_tokens"
NUM_COMPLETION_TOKENS = "num_completion_tokens"
SCORE_CHOSEN = "score_chosen"
SCORE_REJECTED = "score_rejected"
LABEL = "label"

# `turns` columns (contract) beyond ID / NUM_TOKENS.
TURN_INDEX = "turn_index"
ROLE = "role"
START = "start"
END = "end"
TRAINED = "trained"
KEPT = "kept"
INJECTED = "injected"  # extension: the turn is the default system message etl inserted

# Per-turn plan columns (etl.pipeline: stages -> truncation -> assemble); internal, only a
# few reach `turns` under the contract names above.
CONV = "conv"  # the conversation's row number in its chunk
CONTENT = "content"
MSG_TRAIN, MSG_WEIGHT = "train", "weight"  # per-message overrides from the record
DROP_REASON = "drop_reason"  # a conversation-level reason not to write the example
REASONING = "reasoning"  # a message's reasoning text; rendered before its content (think format)
CONTENT_IDS = "content_ids"
REASONING_IDS, REASONING_LEN, TRAIN_REASONING = "reasoning_ids", "reasoning_len", "train_reasoning"
HEADER_IDS, END_IDS, SEP_IDS = "header_ids", "end_ids", "sep_ids"
HEADER_LEN, CONTENT_LEN, END_LEN, SEP_LEN = "header_len", "content_len", "end_len", "sep_len"
TURN_LEN = "turn_len"
# Tools rendered by the template (etl.pipeline.tools): a record's tool list (JSON text, from the
# builder), its rendered text on the system turn, a message's calls (JSON texts) and their ids,
# and each turn's form (which header/end variant of its role: a tool result's place in a run).
TOOLS, TOOLS_TEXT = "tools", "tools_text"
CALLS, CALLS_IDS, CALLS_LEN = "calls", "calls_ids", "calls_len"
FORM = "form"
# Images (etl.pipeline.images): a message's image offsets into its content (from the builder),
# each turn's image tokens per image and the index of its first image in its record's list.
IMAGE_AT, IMAGE_TOKENS, IMAGE_FIRST = "image_at", "image_tokens", "image_first"
TRAIN_HEADER, TRAIN_CONTENT, TRAIN_END = "train_header", "train_content", "train_end"
UNIT = "unit"  # truncation unit: -1 for the leading system turn, then one per user turn
KEEP_WHOLE = "keep_whole"  # the turn survives whole-turn dropping
POS = "pos"  # start of the turn in the conversation before the hard cut
CUT = "cut"  # start of the kept window in the conversation
WINDOW = "window"  # length of the kept window (<= seq_len)
TOTAL = "total"  # conversation length after whole-turn dropping, before the hard cut

# Pack index columns (contract, docs/packing.md): one row per pack, one list item per piece (a token
# range of one example), plus NUM_TOKENS of the pack.
PACK_ID = "pack_id"
PIECE_IDS = "ids"  # example id of each piece
PIECE_ROWS = "rows"  # the example's global row in its split's data parts (manifest order)
PIECE_OFFSETS = "offsets"  # first token of the piece inside its example
PIECE_LENGTHS = "lengths"
PIECE_TRAINED = "trained"  # False where the packer masks the piece (boundary injection)

# `_rejects` columns.
REASON = "reason"
DETAIL = "detail"
RAW = "raw"

DEFAULT_DOMAIN = "__default__"

# Prefix the reader puts before an undecodable line, which the parser recognises (reason `invalid_utf8`).
INVALID_UTF8 = "\x00invalid utf-8: "
