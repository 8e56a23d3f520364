"""Everything a report shows, read from a study dir into plain data.

Sources, all files (no tracking server):

    STUDY/study.json                the resolved spec (what makes a dir a study dir)
    STUDY/results.jsonl             the results store, read with `sanlab.study.store`
    the study's tables              the gap, noise-floor and sweep tables as the study
                                    computes them (`sanlab.study.results.table_json`,
                                    what `sanlab study table --json` prints)
    STUDY/runs/RUN_ID/metrics.jsonl training curves; meta.json: versions, git, device
    STUDY/analysis/*/analysis.json  `sanlab analyze` of the final pairs (`--analyze` runs it)
    STUDY/analysis/GROUP/milestones/milestone-NNN/analysis.json
                                    the same pairs' losses at a milestone checkpoint
                                    (`--analyze --milestones`); never read as a final
                                    analysis (the glob above does not reach them):
                                    `sanlab.analysis.output.load_milestone_analyses`

Results flow one way: the study computes, the report renders; nothing here recomputes a
gap or a noise verdict. Anything missing (a run still going, no analysis yet) is simply
absent from the data; the report shows a placeholder for it. A damaged results line is
skipped and counted (`ResultStore.damaged`).

Neither importing this module nor computing the tables imports torch (the arms'
accounting reads the mixers' torch-free specs); `--analyze` does.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sanlab import fileio
from sanlab.analysis import cli as analysis
from sanlab.analysis.output import milestone_analysis_dir, write_outputs
from sanlab.cliargs import ArgumentParser
from sanlab.errors import DataError, SanlabError
from sanlab.paths import check_out_dir, staged_dir
from sanlab.study.orchestrate import load_saved_spec
from sanlab.study.results import run_rows, table_json
from sanlab.study.store import ResultStore

SPEC_FILE = "study.json"  # the name `sanlab.study.orchestrate` writes
ANALYSIS_DIR = "analysis"
MILESTONE_SKIP = "attention,stream,spectra"  # a milestone analysis is the losses only


@dataclass
class Curve:
    """One run's training curve: train loss per logged step, val loss where evaluated."""

    tokens: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    val_tokens: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)


@dataclass
class StudyData:
    """A study dir as plain data."""

    dir: Path
    spec: dict[str, Any]
    records: dict[str, dict[str, Any]]  # run id -> latest run record
    corrupt_lines: list[int]  # 1-based line numbers of results.jsonl that the store skips (damaged)
    tables: dict[str, Any] | None  # `sanlab study table --json`; None when it could not be computed
    tables_error: str | None
    curves: dict[str, Curve]
    metas: dict[str, dict[str, Any]]
    analyses: list[dict[str, Any]]  # each analysis.json, with "_path" added
    live: set[str] = field(default_factory=set)  # run ids with curves but no store record yet
    statuses: list[dict[str, Any]] | None = None  # `study status`'s rows (None: the plan cannot be built)
    analysis_errors: list[str] = field(default_factory=list)  # `--analyze` groups that failed

    def arm_of(self, run_id: str) -> str:
        """The run's arm: from its record, else from its id (`ARM-L…-d…-…`)."""
        rec = self.records.get(run_id)
        return str(rec["arm"]) if rec and rec.get("arm") else run_id.split("-L", 1)[0]

    @property
    def name(self) -> str:
        return str(self.spec.get("name", self.dir.name))

    def run_dir(self, run_id: str) -> Path:
        """The run's dir inside the study dir; else where the store says it was written (the
        stored path is as the study saw it, so a copied or moved study dir uses its own)."""
        own = self.dir / "runs" / run_id
        stored = (self.records.get(run_id) or {}).get("run_dir")
        if own.is_dir() or not isinstance(stored, str):
            return own
        path = Path(stored) if Path(stored).is_absolute() else self.dir / stored  # relative: to the study dir
        return path if path.is_dir() else own

    def analysis_runs(self) -> dict[str, dict[str, Any]]:
        """Run id -> its per-run analysis (the newest analysis file that covers it)."""
        out: dict[str, dict[str, Any]] = {}
        for a in sorted(self.analyses, key=lambda a: a.get("_mtime", 0)):
            out.update(a.get("runs") or {})
        return out

    def comparisons(self) -> list[dict[str, Any]]:
        """Every paired comparison (run vs baseline), the newest per pair."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for a in sorted(self.analyses, key=lambda a: a.get("_mtime", 0)):
            for c in a.get("comparisons") or []:
                out[(c["run"], c["vs"])] = c
        return list(out.values())


def check_study_dir(study_dir: Path) -> dict[str, Any]:
    """The saved spec of a study dir; `DataError` (one line) when it is not one."""
    if not study_dir.is_dir():
        raise DataError(f"{study_dir} is not a directory")
    path = study_dir / SPEC_FILE
    if not path.is_file():
        raise DataError(f"{study_dir} is not a study dir (no {SPEC_FILE}); run `sanlab study run` first")
    spec = fileio.read_json(path, DataError)
    if not isinstance(spec, dict):
        raise DataError(f"{path} does not hold a study spec")
    return spec


def study_tables(study_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The study's own tables (`sanlab.study.results.table_json`): (tables, None), or (None,
    the one-line error) when they cannot be computed (e.g. a spec the matching refuses)."""
    try:
        return json.loads(json.dumps(table_json(study_dir))), None  # the printed JSON's types
    except SanlabError as e:
        return None, " ".join(str(e).splitlines())


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_curve(run_dir: Path) -> Curve | None:
    """Train / val loss against tokens from metrics.jsonl; a torn last line is skipped."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    c = Curve()
    for _, _, row in fileio.read_jsonl(path):
        if row is None or not _finite(row.get("tokens")):
            continue
        if _finite(row.get("loss")):
            c.tokens.append(int(row["tokens"]))
            c.loss.append(float(row["loss"]))
        if _finite(row.get("val_loss")):
            c.val_tokens.append(int(row["tokens"]))
            c.val_loss.append(float(row["val_loss"]))
    return c if c.tokens or c.val_tokens else None


def read_json(path: Path) -> dict[str, Any] | None:
    return fileio.try_read_json_object(path)


def load(study_dir: str | Path) -> StudyData:
    """Read a study dir; raises `DataError` only when it is not a study dir at all."""
    d = Path(study_dir)
    spec = check_study_dir(d)
    store = ResultStore(d)
    records = store.runs()
    tables, err = study_tables(d)
    data = StudyData(d, spec, records, store.damaged(), tables, err, {}, {}, [])
    for rid in records:
        run_dir = data.run_dir(rid)
        curve = read_curve(run_dir)
        if curve is not None:
            data.curves[rid] = curve
        meta = read_json(run_dir / "meta.json")
        if meta is not None:
            data.metas[rid] = meta
    # Runs still going (not in the store yet) draw their curves too.
    runs_dir = d / "runs"
    for run_dir in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        if run_dir.name in records or not run_dir.is_dir():
            continue
        curve = read_curve(run_dir)
        if curve is not None:
            data.curves[run_dir.name] = curve
            data.live.add(run_dir.name)
    data.analyses = load_analyses(d)
    if err is None:  # the tables were computed, so the spec and its plan are sound
        data.statuses = run_rows(load_saved_spec(d), d, records)
    return data


def load_analyses(study_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((study_dir / ANALYSIS_DIR).glob("*/analysis.json")):
        a = read_json(path)
        if a is not None and isinstance(a.get("runs"), dict):
            a["_path"], a["_mtime"] = str(path), path.stat().st_mtime
            out.append(a)
    return out


# --------------------------------------------------------------------------- final pairs


@dataclass(frozen=True)
class PairGroup:
    """The final runs of one optimizer × budget × seed (× data point, on a data axis):
    every arm against the reference."""

    optimizer: str
    tokens: int
    seed: int
    reference: str
    arms: tuple[str, ...]
    data: str = ""  # the data point's slug ("" without a data axis)

    @property
    def out_name(self) -> str:
        at = f"{self.data}-" if self.data else ""
        return f"final-{at}{self.optimizer}-{self.tokens}-s{self.seed}"


def final_pair_groups(data: StudyData) -> list[PairGroup]:
    """Final pairs where both runs completed, grouped so one `sanlab analyze` call covers a group."""
    groups: dict[tuple[str, int, int, str, str], list[str]] = {}
    for g in (data.tables or {}).get("gaps", []):
        for seed, ids in (g.get("runs") or {}).items():
            ref, arm = ids["reference"], ids["arm"]
            if all((data.records.get(r) or {}).get("status") == "completed" for r in (ref, arm)):
                arms = groups.setdefault((g["optimizer"], int(g["tokens"]), int(seed), ref, g.get("data") or ""), [])
                if arm not in arms:
                    arms.append(arm)
    return [PairGroup(o, t, s, ref, tuple(arms), d) for (o, t, s, ref, d), arms in groups.items()]


def missing_analyses(data: StudyData) -> list[PairGroup]:
    """Pair groups with a run or comparison that no analysis file covers yet."""
    runs = data.analysis_runs()
    have = {(c["run"], c["vs"]) for c in data.comparisons()}
    return [g for g in final_pair_groups(data)
            if any((a, g.reference) not in have or a not in runs for a in g.arms) or g.reference not in runs]


def data_dir(data: StudyData, point: str = "") -> Path | None:
    """The study's prepared data dir (of the data point `point`, its slug, on a data axis),
    if it can be found from here: the store's `data` record's dir (relative to the study
    dir), its `data.dir` as the study was run with it, that path inside the study dir (a
    record's spec names its own `data`), or the study dir's `data/`."""
    explicit = (data.spec.get("data") or {}).get("dir")
    if point:
        rec = ResultStore(data.dir).data().get(point) or {}
        stored = rec.get("dir")
        cands = [data.dir / stored] if isinstance(stored, str) and not Path(stored).is_absolute() else []
        cands += [Path(stored)] if isinstance(stored, str) else []
        cands += [Path(explicit) / point, data.dir / explicit / point] if explicit else []
        cands.append(data.dir / "data" / point)
    else:
        cands = [Path(explicit), data.dir / explicit] if explicit else []
        cands.append(data.dir / "data")
    for cand in cands:
        if (cand / "manifest.json").is_file():
            return cand
    return None


def analyze_group(data: StudyData, group: PairGroup, *, eval_rows: int | str = "auto",
                  milestone: int | None = None) -> str | None:
    """`sanlab analyze ARMS… --vs REFERENCE --out STUDY/analysis/GROUP` for one group, in
    this process; None, or the one-line error of a run that cannot be analysed. With
    `milestone` (a percent): the losses only at that milestone checkpoint (`--checkpoint
    milestone-NNN --skip attention,stream,spectra`), into the group's `milestone_dir`,
    written whole or not at all."""
    out = data.dir / ANALYSIS_DIR / group.out_name if milestone is None else milestone_dir(data.dir, group, milestone)
    runs = [data.run_dir(r) for r in (*group.arms, group.reference)]
    argv = [*map(str, runs[:-1]), "--vs", str(runs[-1]), "--out", str(out), "--eval-rows", str(eval_rows)]
    if milestone is not None:
        argv += ["--checkpoint", f"milestone-{milestone:03d}", "--skip", MILESTONE_SKIP]
    elif not all(any((r / "checkpoints").glob("milestone-*")) for r in runs):
        argv += ["--skip", "spectra"]
    ddir = data_dir(data, group.data)
    if ddir is not None:
        argv += ["--data", str(ddir)]
    parser = ArgumentParser(prog="sanlab analyze")
    analysis.configure(parser)
    t0 = time.perf_counter()
    try:
        check_out_dir(out)
        result = analysis.analyze(parser.parse_args(argv))
        result["seconds"] = time.perf_counter() - t0
        if milestone is None:
            write_outputs(result, out)
        else:  # a kill mid-write leaves no analysis.json that the resume would keep
            with staged_dir(out) as tmp:
                write_outputs(result, tmp)
    except SanlabError as e:
        return " ".join(str(e).splitlines())
    return None


def analyze_groups(data: StudyData, groups: list[PairGroup], *, eval_rows: int | str = "auto",
                   log: Callable[[str], Any] = print) -> list[str]:
    """Analyse the groups one after another (each uses every core); the error lines of the
    ones that failed."""
    errors: list[str] = []
    for i, g in enumerate(groups, 1):
        err = analyze_group(data, g, eval_rows=eval_rows)
        log(f"analysed [{i}/{len(groups)}] {', '.join(g.arms)} vs {g.reference}"
            + (f": failed: {err}" if err else ""))
        if err:
            errors.append(f"{g.out_name}: {err}")
    return errors


# --------------------------------------------------------------------------- milestones


def milestone_dir(study_dir: Path, group: PairGroup, pct: int) -> Path:
    """Where the group's analysis at milestone `pct` goes: STUDY/analysis/GROUP/milestones/
    milestone-NNN/ (`sanlab.analysis.output.milestone_analysis_dir`)."""
    return milestone_analysis_dir(study_dir / ANALYSIS_DIR / group.out_name, pct)


def group_milestones(data: StudyData, group: PairGroup) -> list[int]:
    """The percents of the milestone checkpoints every run of the group has, but 0 (the
    untrained model) and 100 (the final analysis has it)."""
    from sanlab.analysis.rundir import RunDir  # lazy: torch; only `--milestones` reads checkpoints

    have: set[int] | None = None
    for rid in (*group.arms, group.reference):
        ms = {round(100 * f) for f, _ in RunDir.open(data.run_dir(rid)).milestones()}
        have = ms if have is None else have & ms
    return sorted(p for p in have or () if 0 < p < 100)


def _covers(a: dict[str, Any] | None, group: PairGroup, pct: int) -> bool:
    """The analysis file is of that milestone and holds every run and pair of the group."""
    if a is None or a.get("checkpoint") != f"milestone-{pct:03d}" or not isinstance(a.get("runs"), dict):
        return False
    pairs = {(c.get("run"), c.get("vs")) for c in a.get("comparisons") or [] if isinstance(c, dict)}
    return all(r in a["runs"] for r in (*group.arms, group.reference)) and all(
        (arm, group.reference) in pairs for arm in group.arms)


def missing_milestone_analyses(data: StudyData) -> list[tuple[PairGroup, int]]:
    """(group, percent) of every final pair group's milestone with no analysis file that
    covers it yet; one that does is kept (the resume of `--analyze --milestones`)."""
    return [(g, pct) for g in final_pair_groups(data) for pct in group_milestones(data, g)
            if not _covers(read_json(milestone_dir(data.dir, g, pct) / "analysis.json"), g, pct)]


def analyze_milestones(data: StudyData, todo: list[tuple[PairGroup, int]], *, eval_rows: int | str = "auto",
                       log: Callable[[str], Any] = print) -> list[str]:
    """`analyze_group` at each (group, milestone), one after another; the error lines."""
    errors: list[str] = []
    for i, (g, pct) in enumerate(todo, 1):
        err = analyze_group(data, g, eval_rows=eval_rows, milestone=pct)
        log(f"analysed milestone {pct}% [{i}/{len(todo)}] {', '.join(g.arms)} vs {g.reference}"
            + (f": failed: {err}" if err else ""))
        if err:
            errors.append(f"{g.out_name} milestone-{pct:03d}: {err}")
    return errors
