"""Kind `probes`: a probe suite (`sanlab probe --suite --out DIR`: suite.json, suite.csv)
with the claims of SPEC §2 ("Attention Retrieves, MLP Memorizes").

A suite cell is one run (one seed, no noise pair), so the study's noise rule has nothing
to read here. The noise of a probe number is that of a finite sample: an accuracy is k
correct of n test examples, a capacity k memorised of N pairs. A difference between two
arms counts when it exceeds twice its standard error, with each proportion taken as
(k + 1) / (n + 2) (so that 100% or 0% still has an error: Agresti–Caffo):

    se(p̂₁ − p̂₂) = sqrt(p₁(1 − p₁)/(n₁ + 2) + p₂(1 − p₂)/(n₂ + 2)),   |p̂₁ − p̂₂| > 2·se

The claims compare arms with each other in the paper's order, not the numbers with the
paper's: the suite's tasks are smaller than the paper's (fewer keys and values, shorter
sums, another p), so their absolute accuracies are not the paper's, while the ordering
of the arms is what the paper claims. Each claim is a unit of `CLAIMS`
(rule, inputs, verdict), which docs/records.md renders.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sanlab.config import bare_words
from sanlab.data.probes import columns
from sanlab.probes.capacity import capacity
from sanlab.probes.layout import CAPACITY, SUITE, SUITE_CSV, check_results, task_of
from sanlab.records.common import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    ClaimSet,
    RecordError,
    fmt,
    md_table,
    ordering_verdict,
    read_json,
)

# Single-task results (`sanlab probe TASK --out DIR` into the suite's dir): an ablation
# when it holds an arm the suite does not have (e.g. MixiT with the old σ on addition).
ABLATION_PREFIX, ABLATION_SUFFIX = "probe-", ".json"
COLUMNS = {c.name: c.label for c in columns()}  # each task file's heading (sanlab.data.probes)
LABELS = {"standard": "Standard", "san": "SAN", "frozen_qk": "Frozen-QK", "frozen_mlp": "Frozen-MLP",
          "mixit": "MixiT"}

# SPEC §2 anchors, as the task files declare them: retrieval accuracy (%), memorization
# capacity (bits per parameter), each in the paper's order; the tasks on which MixiT ≈ standard.
_PAPER = {c.name: dict(c.paper) for c in columns()}
PAPER_RETRIEVAL = _PAPER["retrieval"]
PAPER_CAPACITY = _PAPER[CAPACITY]
MIXIT_MATCHES = tuple(name for name, p in _PAPER.items() if p.get("mixit") == "≈ standard")
# "≈" read as: MixiT's accuracy at most this many points below the standard arm's.
EQUIVALENCE_PTS = 5.0
Z = 2.0  # standard errors a difference must exceed

RULES_PREAMBLE = ("Noise (one run per cell, no seeds): a difference of two proportions k₁/n₁ − k₂/n₂ counts when "
                  "it exceeds 2 standard errors, sqrt(p₁(1 − p₁)/(n₁ + 2) + p₂(1 − p₂)/(n₂ + 2)) with "
                  "p = (k + 1)/(n + 2).")


@dataclass
class ProbeRecord:
    """A probe-suite record: its suite.json as plain data."""

    dir: Path
    suite: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    ablations: dict[str, dict[str, Any]] = field(default_factory=dict)  # file name -> its results
    kind: str = "probes"

    @property
    def arms(self) -> list[dict[str, Any]]:
        return list(self.suite.get("arms") or [])

    @property
    def tasks(self) -> list[str]:
        return [str(t) for t in self.suite.get("tasks") or []]

    def label(self, arm: str) -> str:
        return next((str(a["label"]) for a in self.arms if a["name"] == arm), LABELS.get(arm, arm))

    def cell(self, task: str, arm: str) -> dict[str, Any] | None:
        return next((c for c in self.suite.get("cells") or [] if c.get("key") == f"{task}/{arm}"), None)

    def value(self, task: str, arm: str) -> float | None:
        v = (self.suite.get("table") or {}).get(arm, {}).get(task)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None

    def at_edge(self, task: str, arm: str) -> bool:
        return any(c.get("arm") == arm and task_of(c) == task and c.get("at_edge")
                   for c in self.suite.get("cells") or [])


def load_probes(record_dir: Path) -> ProbeRecord:
    path = record_dir / SUITE
    if not path.is_file():
        raise RecordError(f"{record_dir}: a probes record without {SUITE}")
    suite = results_file(path, "`sanlab probe --suite` writes one")
    if not isinstance(suite.get("table"), dict) or not suite.get("arms"):
        raise RecordError(f"{path}: not a probe suite (`sanlab probe --suite` writes one)")
    ablations = {}
    for name in ablation_files(record_dir, suite):
        ablations[name] = results_file(record_dir / name, "`sanlab probe TASK` writes one")
    return ProbeRecord(record_dir, suite, ablations=ablations)


def results_file(path: Path, writer: str) -> dict[str, Any]:
    """A probe's results file, read and checked against what its writer gives
    (`sanlab.probes.layout.check_results`); `RecordError` naming the key otherwise."""
    try:
        return check_results(read_json(path))
    except ValueError as e:
        raise RecordError(f"{path}: not a probe's results as {writer} ({e})") from None


def ablation_files(src: Path, suite: dict[str, Any]) -> list[str]:
    """The `probe-TASK.json` files in `src` that hold an arm the suite does not (sorted)."""
    names = {a.get("name") for a in suite.get("arms") or []}
    out = []
    for path in sorted(src.glob(f"{ABLATION_PREFIX}*{ABLATION_SUFFIX}")):
        data = results_file(path, "`sanlab probe TASK` writes one")
        if any(a.get("name") not in names for a in data.get("arms") or []):
            out.append(path.name)
    return out


# --------------------------------------------------------------------------- the noise of a proportion


def _p(k: int, n: int) -> float:
    return (k + 1) / (n + 2)


def proportion_se(k: int, n: int) -> float:
    """Standard error of k/n, with p = (k + 1)/(n + 2)."""
    p = _p(k, n)
    return math.sqrt(p * (1 - p) / (n + 2))


def difference_sign(diff: float, se: float, margin: float = 0.0) -> int:
    """+1 when `diff` − `margin` > Z·se, −1 when < −Z·se, 0 within noise."""
    d = diff - margin
    return 1 if d > Z * se else (-1 if d < -Z * se else 0)


def accuracy(rec: ProbeRecord, task: str, arm: str) -> tuple[int, int] | None:
    c = rec.cell(task, arm)
    if c is None or not isinstance(c.get("test_correct"), int) or not c.get("test_total"):
        return None
    return int(c["test_correct"]), int(c["test_total"])


def accuracy_step(rec: ProbeRecord, task: str, hi: str, lo: str) -> tuple[int, float | None]:
    """(sign of acc(hi) − acc(lo) by the noise rule, the difference in points)."""
    a, b = accuracy(rec, task, hi), accuracy(rec, task, lo)
    if a is None or b is None:
        return 0, None
    diff = a[0] / a[1] - b[0] / b[1]
    se = math.hypot(proportion_se(*a), proportion_se(*b))
    return difference_sign(diff, se), 100 * diff


def arm_capacity(rec: ProbeRecord, arm: str, measure: str = "count") -> dict[str, Any]:
    """The arm's capacity by `measure` ("count": suite.json's number, memorised · log2 A;
    "fano": the chance-free bound), recomputed from the points suite.json keeps, so a
    record written before the Fano reading existed has it too. {} when the arm has none."""
    cap = (rec.suite.get("capacity") or {}).get(arm) or {}
    pts = [p for p in cap.get("points") or [] if isinstance(p.get("memorised"), int)]
    if cap.get("bits_per_param") is None or not pts or not cap.get("params") or not cap.get("alphabet"):
        return {}
    if measure == "count":
        return cap
    return {**capacity(pts, int(cap["alphabet"]), int(cap["params"]), measure=measure), "points": pts}


def capacity_point(rec: ProbeRecord, arm: str, measure: str = "count") -> dict[str, Any] | None:
    """The arm's capacity with its standard error, or None when its maximum over N is not
    bracketed (one N, the best N fully memorised, or the best N the largest)."""
    cap = arm_capacity(rec, arm, measure)
    if not cap:
        return None
    pts = [p for p in cap.get("points") or [] if isinstance(p.get("memorised"), int)]
    best_n, k, alphabet = int(cap["n"]), int(cap["memorised"]), int((rec.suite["capacity"][arm])["alphabet"])
    bracketed = k < best_n and any(int(p["n"]) > best_n for p in pts)
    se_acc = proportion_se(k, best_n)
    if measure == "count":
        # se of bits/param from the binomial count of memorised pairs at the best N
        dbits = best_n * math.log2(alphabet)
    else:
        # delta method: d/da of n·(log2 A − H₂(a) − (1 − a)·log2(A − 1)) = n·log2(a(A − 1)/(1 − a)),
        # at a = (k + 1)/(n + 2) as for the proportion's se (finite at k = n)
        a = _p(k, best_n)
        dbits = best_n * abs(math.log2(a * (alphabet - 1) / (1 - a)))
    se = dbits * se_acc / int(cap["params"])
    return {"value": float(cap["bits_per_param"]), "se": se, "bracketed": bracketed, "n": best_n,
            "points": len(pts)}


# --------------------------------------------------------------------------- claims


CAPACITY_CLAIM = "memorization capacity: standard > Frozen-QK > MixiT > Frozen-MLP (the MLP memorizes)"
CAPACITY_READING = {"count": "memorised labels × log2 A, chance included (the paper's count)",
                    "fano": "chance removed (Fano's bound on the labels' information)"}


def capacity_claim(rec: ProbeRecord, measure: str) -> Claim:
    """The capacity ordering by one reading of the bits (`capacity.MEASURES`)."""
    caps = {a: capacity_point(rec, a, measure) for a in PAPER_CAPACITY}
    raw = {a: arm_capacity(rec, a, measure).get("bits_per_param") for a in PAPER_CAPACITY}
    measured = ", ".join(f"{rec.label(a)} {fmt(raw[a], '{:.2f}')}" for a in PAPER_CAPACITY if raw[a] is not None)
    present = [a for a in PAPER_CAPACITY if raw[a] is not None]
    if len(present) < len(PAPER_CAPACITY):
        verdict = INCONCLUSIVE
        measured += f" (missing: {', '.join(LABELS[a] for a in PAPER_CAPACITY if a not in present)})"
    elif not all(c is not None and c["bracketed"] for c in caps.values()):
        verdict = INCONCLUSIVE
        loose = [LABELS[a] for a, c in caps.items() if c is None or not c["bracketed"]]
        ns = {c["points"] for c in caps.values() if c is not None}
        measured += (f"; the maximum over N is not bracketed for {', '.join(loose)}"
                     + (" (one N in the sweep)" if ns == {1} else ""))
    else:
        signs = []
        for hi, lo in zip(PAPER_CAPACITY, list(PAPER_CAPACITY)[1:]):
            a, b = caps[hi], caps[lo]
            assert a is not None and b is not None
            signs.append(difference_sign(a["value"] - b["value"], math.hypot(a["se"], b["se"])))
        verdict = ordering_verdict(signs)
    return Claim(f"{CAPACITY_CLAIM}; {CAPACITY_READING[measure]}", "2.98 / 2.25 / 2.18 / 1.13 bits per parameter",
                 measured or "–", verdict)



CLAIMS = ClaimSet(__name__, RULES_PREAMBLE)


@CLAIMS.claim(
    "retrieval", "Retrieval (standard 100 > Frozen-QK 97.0 > MixiT 11.2)",
    "retrieval: the arms in the paper's order (standard > Frozen-QK > MixiT), each step an accuracy difference; "
    "reproduced when every step is above 0 beyond noise, not reproduced when a step is reversed beyond noise, else "
    "inconclusive (also with an arm missing).")
def claim_retrieval(rec: ProbeRecord) -> Claim:
    order = [a for a in PAPER_RETRIEVAL if rec.cell("retrieval", a) is not None]
    steps = [accuracy_step(rec, "retrieval", hi, lo) for hi, lo in zip(order, order[1:])]
    measured = ", ".join(f"{rec.label(a)} {fmt(rec.value('retrieval', a), '{:.1f}')}" for a in order)
    if len(order) < len(PAPER_RETRIEVAL):
        verdict = INCONCLUSIVE
        measured += f" (missing: {', '.join(LABELS[a] for a in PAPER_RETRIEVAL if a not in order)})"
    else:
        verdict = ordering_verdict(s for s, _ in steps)
        measured += "; steps " + ", ".join(fmt(d, "{:+.1f}") for _, d in steps) + " points"
    return Claim("retrieval: standard > Frozen-QK > MixiT (attention retrieves, even with frozen Q/K)",
                 "test accuracy 100 / 97.0 / 11.2 %", measured or "–", verdict)


@CLAIMS.claim(
    "capacity", "Capacity (standard 2.98 > Frozen-QK 2.25 > MixiT 2.18 > Frozen-MLP 1.13 bits per trainable "
    "parameter)",
    "capacity: the same, in bits per trainable parameter (standard > Frozen-QK > MixiT > Frozen-MLP); decided only "
    "when every arm's maximum over N is bracketed: its best N memorised fewer than all N pairs and a larger N gave "
    "no more bits (else a larger N could give more, and the claim is inconclusive). Bits = memorised labels × log2 "
    "A, the paper's count: a label right by chance (1 in A) counts too, N·log2(A)/A bits that grow with N.",
    note="A sweep with one N is inconclusive.")
def claim_capacity(rec: ProbeRecord) -> Claim:
    return capacity_claim(rec, "count")


@CLAIMS.claim(
    "capacity_fano", "Capacity, chance removed",
    "capacity, chance removed: the same rule on Fano's lower bound on the labels' information, "
    "N·(log2 A − H₂(a) − (1 − a)·log2(A − 1)) bits at accuracy a (0 at chance), its se by the delta method.")
def claim_capacity_fano(rec: ProbeRecord) -> Claim:
    return capacity_claim(rec, "fano")


@CLAIMS.claim(
    "mixit", "MixiT ≈ standard on addition, modular addition, Dyck and sentiment",
    f"MixiT ≈ standard: per task, the standard arm's accuracy minus MixiT's; reproduced when on every task it is "
    f"below {EQUIVALENCE_PTS:g} points beyond noise (≤ {EQUIVALENCE_PTS:g} − 2·se), not reproduced when on some "
    f"task it is above {EQUIVALENCE_PTS:g} points beyond noise, else inconclusive.",
    note="A small test split cannot show it: with 24 test examples 2 standard errors are about 11 points.")
def claim_mixit(rec: ProbeRecord) -> Claim:
    per, signs, missing = [], [], []
    for task in MIXIT_MATCHES:
        a, b = accuracy(rec, task, "standard"), accuracy(rec, task, "mixit")
        if a is None or b is None:
            missing.append(task)
            continue
        short = a[0] / a[1] - b[0] / b[1]
        se = math.hypot(proportion_se(*a), proportion_se(*b))
        margin = EQUIVALENCE_PTS / 100
        within = difference_sign(short, se, margin) == -1  # surely below the margin
        beyond = difference_sign(short, se, margin) == 1
        signs.append(1 if within else (-1 if beyond else 0))
        per.append(f"{COLUMNS.get(task, task)} {fmt(rec.value(task, 'mixit'), '{:.1f}')} vs "
                   f"{fmt(rec.value(task, 'standard'), '{:.1f}')}")
    if missing:
        verdict = INCONCLUSIVE
    elif all(s == 1 for s in signs):
        verdict = REPRODUCED
    elif any(s == -1 for s in signs):
        verdict = NOT_REPRODUCED
    else:
        verdict = INCONCLUSIVE
    measured = "MixiT vs standard: " + "; ".join(per) + (f" (missing: {', '.join(missing)})" if missing else "")
    return Claim("MixiT ≈ standard on addition, modular addition, Dyck and sentiment",
                 "≈ standard (random fixed mixing suffices for these tasks)", measured, verdict)


RULES = CLAIMS.rules


def claims(rec: ProbeRecord) -> list[Claim]:
    return CLAIMS.rows(rec)




# --------------------------------------------------------------------------- blocks


def _task_header(rec: ProbeRecord, task: str) -> str:
    head = COLUMNS.get(task, task)
    if task == CAPACITY:
        return head + ", count"
    if task == "modadd":
        p = next((c["task_config"].get("p") for c in rec.suite.get("cells") or []
                  if c.get("task") == "modadd" and isinstance(c.get("task_config"), dict)), None)
        return f"{head} (p={p})" if p is not None else head
    return head


FANO_COLUMN = "Memorization bits/param, chance removed"


def _cell_text(rec: ProbeRecord, task: str, arm: str) -> str:
    if task in (CAPACITY, FANO_COLUMN):
        measure = "count" if task == CAPACITY else "fano"
        cap, point = arm_capacity(rec, arm, measure), capacity_point(rec, arm, measure)
        v = cap.get("bits_per_param")
        if v is None:
            return "–"
        text = f"{v:.2f}"
        if measure == "count" and ((rec.suite.get("capacity") or {}).get(arm) or {}).get("lower_bound"):
            text = "≥" + text
        text += f" (N={cap['n']})" + ("" if point is None or point["bracketed"] else "†")
        best = rec.cell(f"{CAPACITY}-n{cap['n']}", arm)  # the edge of the sweep at this reading's N
        return text + ("*" if (best or {}).get("at_edge") else "")
    v = rec.value(task, arm)
    if v is None:
        return "–"
    return f"{v:.1f}" + ("*" if rec.at_edge(task, arm) else "")


def _grid_columns(rec: ProbeRecord) -> list[str]:
    """The suite's tasks, with the chance-free capacity beside the count."""
    return [c for t in rec.tasks for c in ((t, FANO_COLUMN) if t == CAPACITY else (t,))]


def block_grid(rec: ProbeRecord) -> str:
    """The arms × tasks grid of suite.json: test exact-match accuracy (%); capacity in
    bits/param under both readings, each with the N of its maximum."""
    cols = _grid_columns(rec)
    rows = [[rec.label(a["name"])] + [_cell_text(rec, t, a["name"]) for t in cols] for a in rec.arms]
    notes = ["`*`: the cell's best LR is at an edge of its sweep."]
    if CAPACITY in rec.tasks:
        notes.append("Memorization: the maximum over N of the bits memorised per trainable parameter, and the N "
                     "it was at; the count credits the labels right by chance (1 in A, N·log2(A)/A bits), the "
                     "chance-removed reading is Fano's bound. `†`: that maximum is not bracketed (the best N is "
                     "the largest, or the only one, or every pair of it was memorised), so a larger N could give "
                     "more.")
    if any(((rec.suite.get("capacity") or {}).get(a["name"]) or {}).get("lower_bound") for a in rec.arms):
        notes.append("`≥`: every pair of the largest N was memorised, a lower bound.")
    return "\n\n".join([md_table(["arm"] + [_task_header(rec, t) for t in cols], rows), " ".join(notes)])


def block_paper(rec: ProbeRecord) -> str:
    """SPEC §2's numbers for the arms of the suite."""
    rows = []
    for a in rec.arms:
        name = a["name"]
        ret, cap = PAPER_RETRIEVAL.get(name), PAPER_CAPACITY.get(name)
        other = "≈ standard on addition, mod. add., Dyck, sentiment" if name == "mixit" else "—"
        if ret is None and cap is None and name != "mixit":
            continue
        rows.append([rec.label(name), "—" if ret is None else (f"{ret:.1f}" if ret < 100 else f"{ret:g}"),
                     "—" if cap is None else f"{cap:g}", other])
    return md_table(["arm", "Retrieval", "Memorization bits/param", "other tasks"], rows)


def block_claims(rec: ProbeRecord) -> str:
    note = ("Accuracy in %, capacity in bits per trainable parameter. The suite's tasks are smaller than the "
            "paper's: the claims compare the arms in the paper's order, not the numbers with the paper's.")
    return CLAIMS.table(claims(rec), note, paper="paper")


def _override_key(item: str) -> tuple[str, str]:
    """An override as (key, value) with the value in one spelling, so that the forms a
    shell may leave (`train.freeze=[qk]`, `train.freeze=["qk"]`, `train.freeze=[ "qk" ]`)
    compare equal."""
    key, _, raw = item.partition("=")
    raw = raw.strip()
    try:
        value: Any = json.loads(raw)
    except ValueError:
        words = bare_words(raw)
        value = raw if words is None else words
    return key.strip(), json.dumps(value, sort_keys=True)


def reference_arm(arm: dict[str, Any], suite_arms: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The suite arm an ablation arm changes: the one whose overrides are a proper subset of
    the ablation's, with the most of them (None when no suite arm is)."""
    mine = {_override_key(o) for o in arm.get("overrides") or []}
    subsets = [a for a in suite_arms if {_override_key(o) for o in a.get("overrides") or []} < mine]
    return max(subsets, key=lambda a: len(a.get("overrides") or []), default=None)


def _count(cell: dict[str, Any] | None) -> tuple[int, int] | None:
    if cell is None or not isinstance(cell.get("test_correct"), int) or not cell.get("test_total"):
        return None
    return int(cell["test_correct"]), int(cell["test_total"])


def ablations(rec: ProbeRecord) -> list[dict[str, Any]]:
    """One row per ablation arm: its task, what it changes against its reference arm, both
    test accuracies (the reference's from the same file's cell, i.e. the same run the suite
    reuses) and the difference with its noise."""
    suite_names = {a["name"] for a in rec.arms}
    rows = []
    for name, data in rec.ablations.items():
        cells = data.get("cells") or []
        for arm in data.get("arms") or []:
            if arm.get("name") in suite_names:
                continue
            ref = reference_arm(arm, rec.arms)
            for cell in (c for c in cells if c.get("arm") == arm["name"]):
                task = str(cell.get("key", "")).split("/")[0]
                ref_cell = None if ref is None else next(
                    (c for c in cells if c.get("key") == f"{task}/{ref['name']}"), rec.cell(task, ref["name"]))
                a, b = _count(cell), _count(ref_cell)
                diff = se = None
                if a is not None and b is not None:
                    diff = a[0] / a[1] - b[0] / b[1]
                    se = math.hypot(proportion_se(*a), proportion_se(*b))
                theirs = {_override_key(o) for o in (ref or {}).get("overrides") or []}
                changes = sorted(o for o in arm.get("overrides") or [] if _override_key(o) not in theirs)
                rows.append({"file": name, "task": task, "arm": arm["name"], "reference": ref and ref["name"],
                             "changes": changes, "correct": a, "reference_correct": b,
                             "lr": cell.get("lr"), "reference_lr": (ref_cell or {}).get("lr"),
                             "diff": diff, "se": se,
                             "sign": None if diff is None or se is None else difference_sign(diff, se)})
    return rows


def _ablation_task(task: str) -> str:
    """A cell's task as the ablations table names it (a capacity cell: its N)."""
    if task.startswith(CAPACITY + "-n"):
        return f"Memorization, N={task[len(CAPACITY) + 2:]} (memorised)"
    return COLUMNS.get(task, task)


def _acc_text(k_n: tuple[int, int] | None, lr: Any) -> str:
    if k_n is None:
        return "–"
    text = f"{100 * k_n[0] / k_n[1]:.1f} ({k_n[0]}/{k_n[1]})"
    return text + (f", lr {lr:g}" if isinstance(lr, (int, float)) else "")


def block_ablations(rec: ProbeRecord) -> str:
    """The ablation arms of the record's `probe-TASK.json` files against the suite arm each changes."""
    rows = ablations(rec)
    if not rows:
        return "No ablation runs in this record (no `probe-TASK.json` with an arm the suite lacks)."
    table = []
    for r in rows:
        verdict = {None: "–", 0: "within noise", 1: "higher beyond noise", -1: "lower beyond noise"}[r["sign"]]
        table.append([_ablation_task(r["task"]), f"`{r['arm']}`",
                      " ".join(f"`{c}`" for c in r["changes"]) or "–",
                      _acc_text(r["correct"], r["lr"]),
                      f"{rec.label(r['reference'])}: " + _acc_text(r["reference_correct"], r["reference_lr"])
                      if r["reference"] else "– (no suite arm it changes)",
                      "–" if r["diff"] is None else f"{100 * r['diff']:+.1f} ± {100 * Z * r['se']:.1f}",
                      verdict])
    note = ("Test exact-match accuracy in % (correct/total) at each arm's selected LR (a memorization cell: "
            "the training pairs memorised, its test set). The reference is the "
            "suite arm whose overrides the ablation extends; its number is the same run the suite reports. "
            f"A difference counts beyond noise when it exceeds {Z:g} standard errors (± shows {Z:g} se).")
    return md_table(["task", "ablation arm", "changes", "its accuracy", "reference arm", "difference (points)", "verdict"],
                    table) + "\n\n" + note


BLOCKS: dict[str, Callable[[ProbeRecord], str]] = {
    "grid": block_grid,
    "paper": block_paper,
    "claims": block_claims,
    "ablations": block_ablations,
}
