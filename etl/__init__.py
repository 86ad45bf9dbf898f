"""etl: columnar SFT data preparation (raw chats -> tokenized Parquet -> torch batches)."""

__version__ = "0.1.0"
