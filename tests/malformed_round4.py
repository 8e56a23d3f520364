"""Round 4 of the malformed-input table (issue 46): odd paths, hand-edited records, damaged
results under a record, probe suites whose suite.json is parseable but not a suite, and
checkpoint / run files of another format. `tests/test_malformed.py` runs these cases with
its own: exit 2, one `sanlab: error: …` line holding the needle, the world's files unchanged.

Each case failed before its fix (a traceback, exit 0, or files changed or lost); the
closing note of issue 46 says at which root each was fixed:

- paths: `sanlab.paths.check_path` (every `type=Path` flag as it is parsed, every output
  dir through `check_out_dir`): empty, a name over NAME_MAX, a path over PATH_MAX, a
  symlink loop, a dangling symlink, the cwd for a dir written whole;
- record files: `sanlab.records.marker` (schema of record.json, content hashes) and
  `sanlab.records.export.check_destination` (only files whose hash is the export's own);
- README markers: `sanlab.records.readme._check_markers`;
- damaged results: `sanlab.records.study.damaged_lines` (read by a record and by export);
- suite.json: `sanlab.probes.layout.check_results` (merge and probes records);
- state.json: `sanlab.train.checkpoint.verify` (format must be the integer 1);
- meta.json: `sanlab.train.rundir.check_history` (a resume never drops the history).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from sanlab.records import marker
from sanlab.records.export import export
from sanlab.records.readme import readme
from sanlab.train.checkpoint import state_digest

LONG = "x" * 300
# name -> (argv template, text the error line must hold); {long}: a 300-byte name in the
# world, {loop}: a symlink to itself, {dangling}: a symlink to nothing, {deep}: a path
# over PATH_MAX
CASES: dict[str, tuple[str, str]] = {}

_OUT_COMMANDS = {  # command -> its argv with {out} for the output dir it writes
    "train": "train {base} --out {out}",
    "prepare": "prepare --tokens 1000 --out {out}",
    "study run": "study run {spec} --out {out}",
    "study plan": "study plan {spec} --out {out}",
    "analyze": "analyze {run} --out {out}",
    "export": "export {run} --hf {out}",
    "import": "import --hf {root}/nowhere --out {out}",
    "record export": "record export {study} {out}",
    "probe": "probe retrieval --out {out}",
    "probe merge": "probe --suite --merge {goodsuite} --out {out}",
    "report": "report {study} --out {out}",
}
for _cmd, _argv in _OUT_COMMANDS.items():
    CASES[f"{_cmd} out name too long"] = (_argv.replace("{out}", "{root}/{long}"), "is 300 bytes, over the")
    CASES[f"{_cmd} out under a name too long"] = (_argv.replace("{out}", "{root}/{long}/o"), "is 300 bytes, over the")
    CASES[f"{_cmd} out a symlink loop"] = (_argv.replace("{out}", "{loop}"), "is a symlink loop")
    CASES[f"{_cmd} out under a symlink loop"] = (_argv.replace("{out}", "{loop}/o"), "is a symlink loop")
    CASES[f"{_cmd} out a dangling symlink"] = (_argv.replace("{out}", "{dangling}"), "is a dangling symlink")
for _cmd, _argv in (("train", "train {base} --out="), ("prepare", "prepare --tokens 1000 --out="),
                    ("study run", "study run {spec} --out="), ("analyze", "analyze {run} --out="),
                    ("export", "export {run} --hf="), ("import", "import --hf {root}/nowhere --out="),
                    ("probe", "probe retrieval --out="), ("report", "report {study} --out="),
                    ("signal", "signal --depths 2 --json=")):
    CASES[f"{_cmd} out empty"] = (_argv, "an empty path")
CASES |= {
    # ---- paths the filesystem cannot hold, and inputs
    "train out over PATH_MAX": ("train {base} --out {deep}", "bytes this filesystem allows"),
    "export out over PATH_MAX": ("export {run} --hf {deep}", "bytes this filesystem allows"),
    "signal json name too long": ("signal --depths 2 --json {root}/{long}", "is 300 bytes"),
    "signal json a symlink loop": ("signal --depths 2 --json {loop}", "is a symlink loop"),
    "signal json a dangling symlink": ("signal --depths 2 --json {dangling}", "is a dangling symlink"),
    "analyze input a symlink loop": ("analyze {loop} --out {root}/x", "RUN_DIR {loop}: {loop} is a symlink loop"),
    "analyze input name too long": ("analyze {root}/{long}", "is 300 bytes"),
    "study status input name too long": ("study status {root}/{long}", "is 300 bytes"),
    "study table input name too long": ("study table {root}/{long}", "is 300 bytes"),
    "study table --json input name too long": ("study table --json {root}/{long}", "is 300 bytes"),
    "study table input a symlink loop": ("study table {loop}", "STUDY_DIR {loop}: {loop} is a symlink loop"),
    "sample input a symlink loop": ("sample {loop} --prompt hi", "is a symlink loop"),
    "eval input a symlink loop": ("eval {loop} --tasks builtin", "is a symlink loop"),
    "export input a symlink loop": ("export {loop} --hf {root}/hf", "is a symlink loop"),
    "import input a symlink loop": ("import --hf {loop} --out {root}/imported", "is a symlink loop"),
    "import input name too long": ("import --hf {root}/{long} --out {root}/imported", "is 300 bytes"),
    "record export source a symlink loop": ("record export {loop} {root}/rec-new", "is a symlink loop"),
    "record readme a symlink loop": ("record readme {loop}", "is a symlink loop"),
    "record check a name too long": ("record check {root}/{long}", "is 300 bytes"),
    "probe merge piece a symlink loop": ("probe --suite --merge {loop} --out {root}/merged", "is a symlink loop"),
    "report input a symlink loop": ("report {loop}", "is a symlink loop"),
    "export into the dir holding the cwd": ("export {run} --hf {root}/..", "is the current directory or holds it"),
    "prepare into the cwd": ("prepare --tokens 1000 --out . --force", "is the current directory"),
    "import into the cwd": ("import --hf {root}/nowhere --out .", "is the current directory"),
    # ---- a record's files: only what its own export wrote, unchanged, is replaced
    "record export README listed by hand": ("record export {study} {rec_readme_listed}",
                                            "README.md has no content hash in record.json"),
    "record export README listed with a forged hash": ("record export {study} {rec_readme_forged}",
                                                       "README.md differs from what the record's export wrote"),
    "record export over an edited file": ("record export {study} {rec_edited}",
                                          "study/study.json differs from what the record's export wrote"),
    "record export over a marker without hashes": ("record export {study} {rec_nohash}", "has no content hash"),
    "record export a dir listed as a file": ("record export {study} {rec_dirlisted}", "study is not a plain file"),
    # ---- record.json's schema, key by key
    "record check files lists '.'": ("record check {rec_dot}", "\"files\"[0] ('.') is not a relative path"),
    "record readme files lists '.'": ("record readme {rec_dot}", "('.') is not a relative path"),
    "record export over files listing '.'": ("record export {study} {rec_dot}", "('.') is not a relative path"),
    "record check files lists ''": ("record check {rec_empty}", "('') is not a relative path"),
    "record check files lists 'a/../..'": ("record check {rec_up}", "is not a relative path"),
    "record check files lists an absolute path": ("record check {rec_abs}", "('/etc/passwd') is not a relative"),
    "record check files lists 'study/./x'": ("record check {rec_dotpart}", "is not a relative path"),
    "record check files lists a file twice": ("record check {rec_twice}", "twice"),
    "record check files not a list": ("record check {rec_filesdict}", "\"files\" must list"),
    "record check kind a list": ("record check {rec_kindlist}", "unknown record kind ['matched']"),
    "record check sha256 a list": ("record check {rec_shalist}", "\"sha256\" must map"),
    "record check sha256 not hex": ("record check {rec_shabad}", "is not a SHA-256 hex digest"),
    "record check sha256 of an unlisted file": ("record check {rec_shaextra}", "which \"files\" does not list"),
    # ---- README markers
    "record check BEGIN without END": ("record check {rec_noend}", "has no `<!-- records:END"),
    "record readme BEGIN without END": ("record readme {rec_noend}", "has no `<!-- records:END"),
    "record check END without BEGIN": ("record check {rec_nobegin}", "has no BEGIN before it"),
    "record check a block twice": ("record check {rec_twiceblock}", "is there twice"),
    "record readme END of another name": ("record readme {rec_crossed}", "has no `<!-- records:END"),
    # ---- a record never read from damaged results
    "record check garbage in results": ("record check {rec_garbage}", "the record's results are damaged (line 3"),
    "record readme garbage in results": ("record readme {rec_garbage}", "the record's results are damaged"),
    "record check a results line [1]": ("record check {rec_listline}", "the record's results are damaged"),
    "record readme a results line null": ("record readme {rec_nullline}", "the record's results are damaged"),
    "record export a torn last line": ("record export {study_torn} {root}/rec-new",
                                       "is damaged (a torn last line: an append cut short by a kill)"),
    "record export a results line 5": ("record export {study_five} {root}/rec-new", "line 2 is damaged"),
    # ---- suite.json parseable but not a suite: merge and probes records
    "merge cells a number": ("probe --suite --merge {suite_cells_num} --out {root}/merged", "cells: an integer, not a list"),
    "merge arms not objects": ("probe --suite --merge {suite_arms_num} --out {root}/merged", "arms[0]: an integer"),
    "merge points not objects": ("probe --suite --merge {suite_points_list} --out {root}/merged",
                                 "cells[0].points[0]: a list, not an object"),
    "merge tasks nested": ("probe --suite --merge {suite_tasks_nested} --out {root}/merged", "tasks: a list, not a list of"),
    "merge tasks a string": ("probe --suite --merge {suite_tasks_str} --out {root}/merged", "tasks: a string"),
    "merge a cell without a key": ("probe --suite --merge {suite_nokey} --out {root}/merged", "cells[0]: no 'key'"),
    "merge a cell a number": ("probe --suite --merge {suite_cell_num} --out {root}/merged", "cells[0]: an integer"),
    "merge an arm name a number": ("probe --suite --merge {suite_armname} --out {root}/merged", "arms[0].name"),
    "merge capacity points a number": ("probe --suite --merge {suite_cappoints} --out {root}/merged",
                                       "capacity['standard'].points: an integer"),
    "merge test_correct text": ("probe --suite --merge {suite_correct_str} --out {root}/merged",
                                "cells[0].test_correct: a string, not an integer"),
    "merge quick a string": ("probe --suite --merge {suite_quick_str} --out {root}/merged", "quick: a string"),
    "probes record cells a number": ("record check {prec_cells_num}", "cells: an integer, not a list"),
    "probes record arms not objects": ("record readme {prec_arms_num}", "arms[0]: an integer"),
    "probes record table row a list": ("record check {prec_table_list}", "table['standard']: a list"),
    "probes record export cells a number": ("record export {suite_cells_num} {root}/rec-new", "cells: an integer"),
    # ---- state.json of another format, or of none
    "sample state.json format 2": ("sample {fmt2} --prompt hi", "not a sanlab checkpoint of format 1 (format 2)"),
    "sample state.json without format": ("sample {fmtnone} --prompt hi", "(no format)"),
    "analyze state.json format true": ("analyze {fmttrue} --skip spectra", "(format true)"),
    "export state.json format 1.0": ("export {fmtfloat} --hf {root}/hf", "(format 1.0)"),
    "eval state.json format \"1\"": ("eval {fmtstr} --tasks builtin", "(format \"1\")"),
    # ---- a resume never rewrites meta.json without the run's history
    "resume over a torn meta.json": ("train --out {metatorn} --resume", "meta.json is damaged (malformed JSON"),
    "resume over a meta.json list": ("train --out {metalist} --resume", "meta.json is damaged (malformed JSON (a list"),
    "resume over resumes as text": ("train --out {metaresumes} --resume", "meta.json is damaged (resumes is \"1\""),
    "resume over init not an object": ("train --out {metainit} --resume", "meta.json is damaged (init is 5"),
}

# Damaged but readable: the command answers (exit 0) and names the damage in one line.
READABLE: dict[str, tuple[str, str]] = {
    "status with results lines [1], 5 and null": ("study status {nonobjstudy}", "3 damaged line(s) skipped"),
    "table with results lines [1], 5 and null": ("study table {nonobjstudy} --json", "3 damaged line(s) skipped"),
}


def _edit_json(path: Path, edit: Callable[[Any], Any]) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _with_state(run: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of `run` whose state.json was edited and re-signed: written so, not damaged."""
    shutil.copytree(run, dst)
    f = dst / "checkpoints" / "latest" / "state.json"
    state = json.loads(f.read_text())
    edit(state)
    state["state_sha256"] = state_digest(state)
    f.write_text(json.dumps(state))
    return dst


def _unfinished(run: Path, dst: Path, meta: str) -> Path:
    shutil.copytree(run, dst)
    (dst / "meta.json").write_text(meta)
    return dst


def suite_piece() -> dict[str, Any]:
    """A suite.json as `probe --suite` writes it (test_records_kinds' numbers), each cell
    with the fields a merge recomputes the grid from."""
    from test_records_kinds import suite

    s = suite()
    for c in s["cells"]:
        c.update(points=[{"run_dir": None, "status": "completed", "test_correct": c["test_correct"],
                          "test_total": c["test_total"]}], lr=0.01, multiplier=1.0, trainable_params=8000,
                 label=c["arm"], val_accuracy=c["test_accuracy"])
    return s


def world(root: Path, run: Path, study: Path) -> dict[str, str]:
    """Round 4's files, beside the rest of the table's world."""
    w: dict[str, Path] = {}
    os.symlink("loop", root / "loop")
    os.symlink(root / "no-such-target", root / "dangling")
    rec = root / "rec"
    export(study, rec, log=lambda s: None)
    readme(rec, log=lambda s: None)

    def rec_copy(name: str, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
        d = root / name
        shutil.copytree(rec, d)
        if edit is not None:
            _edit_json(d / "record.json", lambda m: (edit(m), m)[1])
        w[name] = d
        return d

    def listing(*extra: str) -> Callable[[dict[str, Any]], None]:
        return lambda m: m.update(files=[*extra, *m["files"]])

    rec_copy("rec_readme_listed", listing("README.md"))
    rec_copy("rec_readme_forged", lambda m: (m["files"].append("README.md"), m["sha256"].update({"README.md": "0" * 64})))
    d = rec_copy("rec_edited")
    _edit_json(d / "study" / "study.json", lambda s: {**s, "note": "edited by hand"})
    rec_copy("rec_nohash", lambda m: m.pop("sha256"))
    rec_copy("rec_dirlisted", listing("study"))
    rec_copy("rec_dot", listing("."))
    rec_copy("rec_empty", listing(""))
    rec_copy("rec_up", listing("a/../.."))
    rec_copy("rec_abs", listing("/etc/passwd"))
    rec_copy("rec_dotpart", listing("study/./study.json"))
    rec_copy("rec_twice", lambda m: m["files"].append(m["files"][0]))
    rec_copy("rec_filesdict", lambda m: m.update(files={"study": 1}))
    rec_copy("rec_kindlist", lambda m: m.update(kind=["matched"]))
    rec_copy("rec_shalist", lambda m: m.update(sha256=[]))
    rec_copy("rec_shabad", lambda m: m["sha256"].update({m["files"][0]: "xyz"}))
    rec_copy("rec_shaextra", lambda m: m["sha256"].update({"README.md": "0" * 64}))
    text = (rec / "README.md").read_text()
    first = text.index("<!-- records:END ")
    name = text[first:].split()[2]  # "<!--", "records:END", NAME
    (rec_copy("rec_noend") / "README.md").write_text(text.replace(f"<!-- records:END {name} -->", "", 1))
    begin = f"<!-- records:BEGIN {name} -->\n"
    (rec_copy("rec_nobegin") / "README.md").write_text(text.replace(begin, "", 1))
    block = text[text.index(begin):first + len(f"<!-- records:END {name} -->")]
    (rec_copy("rec_twiceblock") / "README.md").write_text(text + "\n" + block + "\n")
    (rec_copy("rec_crossed") / "README.md").write_text(text.replace(f"<!-- records:END {name} -->",
                                                                    f"<!-- records:END {name}x -->", 1))
    for name, bad in (("rec_garbage", b"\x00\xff garbage \xfe"), ("rec_listline", b"[1]"), ("rec_nullline", b"null")):
        store = rec_copy(name) / "study" / "results.jsonl"
        lines = store.read_bytes().split(b"\n")
        store.write_bytes(b"\n".join([*lines[:2], bad, *lines[2:]]))
    torn = root / "study_torn"
    shutil.copytree(study, torn)
    with open(torn / "results.jsonl", "ab") as f:
        f.write(b'{"type": "run", "run_id": "lost", "sta')
    five = root / "study_five"
    shutil.copytree(study, five)
    lines = (five / "results.jsonl").read_bytes().split(b"\n")
    (five / "results.jsonl").write_bytes(b"\n".join([lines[0], b"5", *lines[1:]]))
    nonobj = root / "nonobjstudy"
    shutil.copytree(study, nonobj)
    lines = (nonobj / "results.jsonl").read_bytes().split(b"\n")
    (nonobj / "results.jsonl").write_bytes(b"\n".join([lines[0], b"[1]", b"5", b"null", *lines[1:]]))
    w |= {"study_torn": torn, "study_five": five, "nonobjstudy": nonobj}

    good = suite_piece()

    def piece(name: str, edit: Callable[[dict[str, Any]], None] | None = None, *, record: bool = False) -> None:
        s = json.loads(json.dumps(good))
        if edit is not None:
            edit(s)
        d = root / name
        d.mkdir()
        (d / "suite.json").write_text(json.dumps(s))
        if record:
            (d / "record.json").write_text(marker.text("probes", ["suite.json"]))
        w[name] = d

    piece("goodsuite")
    piece("suite_cells_num", lambda s: s.update(cells=5))
    piece("suite_arms_num", lambda s: s.update(arms=[1, 2]))
    piece("suite_points_list", lambda s: s["cells"][0].update(points=[[1]]))
    piece("suite_tasks_nested", lambda s: s.update(tasks=[["dyck"]]))
    piece("suite_tasks_str", lambda s: s.update(tasks="dyck"))
    piece("suite_nokey", lambda s: s["cells"][0].pop("key"))
    piece("suite_cell_num", lambda s: s["cells"].insert(0, 7))
    piece("suite_armname", lambda s: s["arms"][0].update(name=5))
    piece("suite_cappoints", lambda s: s["capacity"]["standard"].update(points=3))
    piece("suite_correct_str", lambda s: s["cells"][0].update(test_correct="469"))
    piece("suite_quick_str", lambda s: s.update(quick="yes"))
    piece("prec_cells_num", lambda s: s.update(cells=5), record=True)
    piece("prec_arms_num", lambda s: s.update(arms=[1]), record=True)
    piece("prec_table_list", lambda s: s["table"].update(standard=[1]), record=True)

    w["fmt2"] = _with_state(run, root / "fmt2", lambda s: s.update(format=2))
    w["fmtnone"] = _with_state(run, root / "fmtnone", lambda s: s.pop("format"))
    w["fmttrue"] = _with_state(run, root / "fmttrue", lambda s: s.update(format=True))
    w["fmtfloat"] = _with_state(run, root / "fmtfloat", lambda s: s.update(format=1.0))
    w["fmtstr"] = _with_state(run, root / "fmtstr", lambda s: s.update(format="1"))
    meta = json.loads((run / "meta.json").read_text())
    interrupted = {**meta, "status": "interrupted", "resumes": 1}
    w["metatorn"] = _unfinished(run, root / "metatorn", json.dumps(interrupted)[:-40])
    w["metalist"] = _unfinished(run, root / "metalist", json.dumps([interrupted]))
    w["metaresumes"] = _unfinished(run, root / "metaresumes", json.dumps({**interrupted, "resumes": "1"}))
    w["metainit"] = _unfinished(run, root / "metainit", json.dumps({**interrupted, "init": 5}))
    deep = root
    while len(str(deep)) < 4200:
        deep = deep / ("d" * 200)
    return {**{k: str(v) for k, v in w.items()}, "long": LONG, "loop": str(root / "loop"),
            "dangling": str(root / "dangling"), "deep": str(deep)}
