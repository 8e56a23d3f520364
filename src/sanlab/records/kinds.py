"""The kinds of record, and what each kind decides: how its data is read, which README
blocks (and so which claims) it gets, what `export` copies into it and how the copy is
checked. A record's kind is written in its `record.json`; `export` takes it from the
source: a study dir with matched arms is `matched`, one with explicit variant arms only
`variants`, a probe suite's `--out` dir (suite.json) `probes`.

    matched    SAN vs iso-param / iso-FLOP / iso-depth standard arms   SPEC §1.6   `matched`
    axis       the same, over a data axis (`data.axis`, e.g. the world's size)  §1.6   `axis`
    variants   a standard transformer vs variants of its attention     SPEC §2–3   `variants`
    probes     every probe arm on every probe task                     SPEC §2     `probes`
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from sanlab.probes.layout import RUN_FILES, RUNS, point_run_dirs
from sanlab.records import axis, marker, matched, probes, variants
from sanlab.records.common import RecordError, copy_file, read_json
from sanlab.records.study import load_study
from sanlab.records.studycopy import copy_study, study_entries, verify_study


@dataclass(frozen=True)
class Kind:
    name: str
    what: str
    load: Callable[[Path], Any]
    blocks: Mapping[str, Callable[[Any], str]]
    entries: Callable[[Path], list[str]]  # the top-level entries `copy` writes, from the source
    copy: Callable[[Path, Path, Callable[[str], Any]], list[str]]  # (source, into, log) -> files written
    verify: Callable[[Path, Path], None] | None = None
    verified: str = "`sanlab study table` gives the same tables on the copy"  # what `verify` showed


def _probe_files(src: Path) -> list[str]:
    """suite.json, suite.csv and the ablations' `probe-TASK.json` beside them."""
    files = [n for n in (probes.SUITE, probes.SUITE_CSV) if (src / n).is_file()]
    if probes.SUITE in files:
        files += probes.ablation_files(src, probes.results_file(src / probes.SUITE, "`sanlab probe --suite` writes one"))
    return files


def _probe_run_files(src: Path, files: list[str]) -> list[str]:
    """Every sweep point's `runs/RUN_ID/{config,meta,probe}.json` named by the results files
    (no checkpoints, no metrics): each cell's provenance, and what a rerun of the suite
    into a copy of the record reuses instead of training again."""
    out: dict[str, None] = {}
    for name in files:
        if not name.endswith(".json"):
            continue
        try:
            run_dirs = point_run_dirs(read_json(src / name))
        except ValueError as e:
            raise RecordError(f"{src / name}: {e}") from None
        for run_dir in run_dirs:
            for f in RUN_FILES:
                if (src / run_dir / f).is_file():
                    out[f"{run_dir}/{f}"] = None
    return list(out)


def _probe_entries(src: Path) -> list[str]:
    files = _probe_files(src)
    return files + ([RUNS] if _probe_run_files(src, files) else [])


def _copy_probes(src: Path, out: Path, log: Callable[[str], Any]) -> list[str]:
    files = _probe_files(src)
    files += _probe_run_files(src, files)
    for name in files:
        copy_file(src / name, out / name)
    return files


def _verify_probes(src: Path, out: Path) -> None:
    """The copy reads as a suite, and every README block is the same from it as from the source."""
    a, b = probes.load_probes(src), probes.load_probes(out)
    for name, block in probes.BLOCKS.items():
        if block(a) != block(b):
            raise RecordError(f"{out}: the {name} block differs between {src} and its copy")


KINDS: dict[str, Kind] = {
    "matched": Kind("matched", "a SAN against its matched standard arms (SPEC §1.6)",
                    lambda d: load_study(d, "matched"), matched.BLOCKS, study_entries, copy_study, verify_study),
    "axis": Kind("axis", "a SAN against its matched standard arms over a data axis (SPEC §1.6)",
                 axis.load_axis, axis.BLOCKS, study_entries, copy_study, verify_study),
    "variants": Kind("variants", "a standard transformer against variants of its attention (SPEC §2–3)",
                     lambda d: load_study(d, "variants"), variants.BLOCKS, study_entries, copy_study,
                     verify_study),
    "probes": Kind("probes", "a probe suite: every probe arm on every probe task (SPEC §2)",
                   probes.load_probes, probes.BLOCKS, _probe_entries, _copy_probes, _verify_probes,
                   "every README block reads the same from the copy"),
}


def study_kind(spec: dict[str, Any]) -> str:
    """`axis` when the study has a data axis, else `matched` when it matches arms to its
    reference, `variants` when its arms are all explicit ones."""
    data = spec.get("data") if isinstance(spec.get("data"), dict) else {}
    if data.get("axis"):
        return "axis"
    matching = spec.get("matching") if isinstance(spec.get("matching"), dict) else {}
    arms = matching.get("arms", ["iso_param", "iso_flop", "iso_depth"])  # the spec's default
    return "variants" if not arms and spec.get("arms") else "matched"


def kind_of_source(src: Path) -> Kind:
    """The kind of record an export source makes; `RecordError` when it is neither a
    study dir nor a probe suite."""
    if not src.is_dir():
        raise RecordError(f"{src}: no such directory (a study dir or a probe suite's --out dir)")
    if (src / "study.json").is_file():
        if not (src / "results.jsonl").is_file():
            raise RecordError(f"{src} has no results store (results.jsonl)")
        spec = read_json(src / "study.json")
        if not isinstance(spec, dict):
            raise RecordError(f"{src / 'study.json'}: not a study spec")
        return KINDS[study_kind(spec)]
    if (src / probes.SUITE).is_file():
        probes.load_probes(src)
        return KINDS["probes"]
    raise RecordError(f"{src} is not a study dir (no study.json) nor a probe suite (no {probes.SUITE})")


@dataclass
class Loaded:
    kind: Kind
    data: Any

    @property
    def dir(self) -> Path:
        return Path(self.data.dir)


def load(record_dir: str | Path) -> Loaded:
    """A record dir read as its kind's data; `RecordError` (one line) when it is missing,
    not a record or corrupt."""
    d = Path(record_dir)
    if not d.is_dir():
        raise RecordError(f"{d}: no such record dir")
    m = marker.read(d, KINDS)
    kind = KINDS[m["kind"]]
    return Loaded(kind, kind.load(d))


__all__ = ["KINDS", "Kind", "Loaded", "kind_of_source", "load", "study_kind"]
