"""Model: embed -> blocks (sequence mixer + optional state mixer) -> final norm -> tied head."""
