"""Pack stage: write samples into WebDataset tar or Parquet shards, deterministically."""
