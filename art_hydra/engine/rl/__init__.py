"""GRPO-family pieces: logits processing and sampling, group advantages, losses."""
