"""Files in and out: prediction and evaluation files (CSV/Parquet, streamed) and data validation."""
