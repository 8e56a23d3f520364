"""Committed records: a finished study (or probe suite) copied into the repository, with a
README whose tables and claims are generated from the committed results.

A record is a directory `records/NAME/`:

    record.json    written by `export`: the record's kind and its own files (`marker`)
    README.md      hand-written prose around generated blocks, each between
                   `<!-- records:BEGIN NAME -->` and `<!-- records:END NAME -->`
    record.toml    optional, hand-written: `compare_with = "OTHER-RECORD"` (a sibling
                   record whose iso-param gap this one's is compared with) and
                   `prediction = "…"` (written before the run, shown beside the comparison)
    study/         kinds matched, variants: the study dir without checkpoints or shards
    report/        kinds matched, variants: `sanlab report study --out report`
    suite.json     kind probes: `sanlab probe --suite --out DIR`'s results (and suite.csv)

    sanlab record export SOURCE RECORD_DIR   # a study dir or a probe suite's --out dir
    sanlab record readme RECORD_DIR          # rewrite the README's blocks
    sanlab record check [DIR ...]            # exit 1 naming stale blocks (default: records/*)

The kind decides which blocks, and so which claims, a record gets (`kinds`): `matched`
(SPEC §1.6, `matched`), `variants` (SPEC §2–3, `variants`), `probes` (SPEC §2,
`probes`). Every claim is reproduced, not reproduced or inconclusive, set beside the
paper's number, by one machinery (`common.Claim`, `common.ordering_verdict`,
`common.claims_table`); the study kinds read every difference against the study's noise
rule (`sanlab.study.noise`), the probe kind against the sampling noise of its test sets.

Results flow one way: the study computes its tables (`sanlab.study.results`), the records
render them; nothing here recomputes a gap, a lock or a verdict of the study table.

Modules: `common`, `marker`, `study` (a study record as data, its gaps and floor blocks),
`matched`, `variants`, `probes`, `kinds`, `readme`, `export`, `cli` (`sanlab record`).
"""

from __future__ import annotations

from sanlab.records.common import Claim, RecordError
from sanlab.records.kinds import KINDS, Kind, Loaded, load
from sanlab.records.readme import check, readme

# `sanlab.records.export.export(SOURCE, RECORD_DIR)` copies a study into a record.
__all__ = ["KINDS", "Claim", "Kind", "Loaded", "RecordError", "check", "load", "readme"]
