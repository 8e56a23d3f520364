"""Zero-shot evaluation: an lm-evaluation-harness model over sanlab run dirs, and built-in offline tasks."""
