"""What etl writes and may delete: Parquet parts, the manifest, ownership and the lock."""
