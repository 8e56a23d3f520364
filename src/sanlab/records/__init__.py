"""Committed record studies: export a finished study dir, and keep the record's README
tables equal to its committed results.

A record is a directory `records/NAME/`:

    README.md      hand-written prose around generated blocks, each between
                   `<!-- records:BEGIN NAME -->` and `<!-- records:END NAME -->`
    record.toml    optional: `compare_with = "OTHER-RECORD"` (a sibling record whose
                   iso-param gap this one's is compared with) and `prediction = "…"`
                   (written before the run, shown beside the comparison)
    study/         the study dir without checkpoints or data shards (`export`)
    report/        `sanlab report study --out report`

    sanlab record export STUDY_DIR RECORD_DIR   # copy what the tables need
    sanlab record readme RECORD_DIR             # rewrite the README's blocks
    sanlab record check [RECORD_DIR ...]        # exit 1 naming stale blocks (default: records/*)

Modules: `load` (a record dir as data), `claims` (the verdict rules), `blocks` (the
generated README blocks: gaps, floor, regions, exercises, identity, crystallisation,
claims; `BLOCKS`), `readme` (rewrite and check), `export`, `cli` (`sanlab record`).

Sign convention: Δ = arm − reference validation loss in nats, the reference being the
SAN; Δ < 0 means the standard arm is ahead. The paper (SPEC §1.6) writes SAN − FFN, so
its numbers are shown here negated: its iso-param +0.0055 "in FFN's favour" is −0.0055.

Verdict rules of the `claims` block (each claim is reproduced, not reproduced or
inconclusive; `T` is the noise threshold at the budget concerned: 2 × the largest |Δ|
of the noise-floor pair's seeds, from the pair at that budget or, when it ran at one
budget only, the nearest one; no noise pair means every aggregate comparison is
inconclusive). A per-seed-pair quantity x_s (a region or exercise Δ, or a difference of
two) "is below 0" when there are ≥ 2 seed pairs and mean(x) < −2·sd(x), "above 0" when
mean(x) > 2·sd(x), else undetermined:

- ordering: at the largest budget, reproduced when Δ(iso-depth) < Δ(iso-FLOP) − T and
  Δ(iso-FLOP) < Δ(iso-param) − T; not reproduced when either step is reversed by more
  than T; else inconclusive (also when an arm is missing).
- iso-param gap shrinking: reproduced when |Δ| at the smallest final budget exceeds |Δ|
  at the largest by more than T and no step to a larger budget grows |Δ| by more than T;
  not reproduced when |Δ| at the largest exceeds the smallest's by more than T; else
  inconclusive (also with one budget).
- deficit on query tokens (iso-param arm, largest budget): with per seed pair
  q − t (query Δ − trace Δ) and q − a (query Δ − aggregate Δ): reproduced when both are
  below 0; not reproduced when either is above 0; else inconclusive.
- recall vs context-grounded types: R_s, C_s the token-weighted mean Δ over the recall
  types (`sanlab.data.synth.RECALL_TYPES`) and over the other (context-grounded) types;
  reproduced when R is below 0 and C above 0; not reproduced when R is above 0 or C
  below 0; else inconclusive (also without exercise types).
- region identity: reproduced when every analysed pair's token-weighted sum of region
  Δs is within 2% (relative) of its aggregate Δ; not reproduced when any is not;
  inconclusive without analysed pairs.
- Q/K before V/O/FFN-down: per analysed run at the largest budget, "before" when the
  later of Q and K settles at an earlier milestone than the earliest of V, O and down
  (never settling counts as after the last milestone; neither side settling decides
  nothing); reproduced when every deciding run says before, not reproduced when none
  does, else inconclusive (also when no run decides).
- real text vs the embedded corpus (only with `compare_with`): reproduced when
  |Δ iso-param| here exceeds the compared record's (each at its largest budget) by more
  than T = the larger of the two records' thresholds; not reproduced when it is smaller
  by more than T; else inconclusive.
"""

from __future__ import annotations

from sanlab.records.blocks import (
    BLOCKS,
    block_claims,
    block_crystallisation,
    block_exercises,
    block_floor,
    block_gaps,
    block_identity,
    block_regions,
)
from sanlab.records.claims import RULES, RULES_PREAMBLE, Claim, claims, load_compare
from sanlab.records.common import RecordError
from sanlab.records.export import export
from sanlab.records.load import Record, load
from sanlab.records.readme import check, readme

__all__ = ["BLOCKS", "RULES", "RULES_PREAMBLE", "Claim", "Record", "RecordError", "block_claims",
           "block_crystallisation", "block_exercises", "block_floor", "block_gaps", "block_identity",
           "block_regions", "check", "claims", "export", "load", "load_compare", "readme"]
