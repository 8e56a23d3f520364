"""`--as FAMILY`: a run written for a stock transformers architecture (no remote code)."""

from __future__ import annotations

FAMILIES = ("llama", "qwen3", "gemma", "gemma2", "gemma3")
