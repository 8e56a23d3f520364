"""`python -m sanlab.report.analyze_job STUDY_DIR GROUP`: the analysis of one final pair
group (`sanlab.report.data.PairGroup.out_name`), as `sanlab report --analyze` runs it, in a
process of its own.

`sanlab study run --report` starts it on a worker that its runs leave idle (the local
runner's `SideTask`: at the end of a study, one worker trains the last runs while the
other would wait), as soon as every final run of the group has finished, so the report
after the study has less left to analyse. Exit 0: the group's analysis is written (or was
already); 1: it failed, its one-line reason on stderr (the report analyses the group
again, and says why it failed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from sanlab.report.data import analyze_group, load, missing_analyses
from sanlab.study.runner import SideWork
from sanlab.study.warm import die_with_parent

MODULE = "sanlab.report.analyze_job"  # (this module, as `python -m` and the warm processes run it)


def side_work(study_dir: Path) -> Callable[[int], list[SideWork]]:
    """For `Study(side_work=...)`: given the number of arms a group must hold, this
    module's run on each final pair group of the study in `study_dir` that has them all
    (every final run completed) and no analysis yet."""

    def pending(arms: int) -> list[SideWork]:
        out = []
        for g in missing_analyses(load(study_dir)):
            if len(g.arms) < arms:
                continue
            what = f"{', '.join(g.arms)} vs {g.reference}"
            out.append(SideWork(f"analysis-{g.out_name}", MODULE, (str(study_dir), g.out_name),
                                f"analysed {what}", f"analysis of {what} failed; the report tries it again"))
        return out

    return pending


def main(argv: Sequence[str]) -> int:
    study_dir, name = Path(argv[0]), argv[1]
    parent = os.environ.get("SANLAB_PARENT_PID")
    die_with_parent()
    if parent is not None and os.getppid() != int(parent):
        return 1  # the study died before the death signal was armed
    data = load(study_dir)
    group = next((g for g in missing_analyses(data) if g.out_name == name), None)
    if group is None:  # analysed already (or its runs are not all done: nothing to do yet)
        return 0
    err = analyze_group(data, group)
    if err:
        print(f"analysis of {name}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
