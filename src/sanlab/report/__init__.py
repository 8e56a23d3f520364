"""The study report: figures (matplotlib, Agg) and tables as PNGs, report.md and one
self-contained report.html (`sanlab report`). Reads study dirs only; never imports torch."""
