"""A member's loss curve beside its solo run's: one SAN sweep and one standard sweep.

    .venv/bin/python scripts/members_curves.py [--out runs/members-curves] [--tokens 500K]
                                               [--figure members-vs-solo.png] [--precision auto]

At the demo's shape (`examples/quick.toml`: the SAN 5L d64, T128, rows of 16, Muon, on the
embedded synth corpus) and with its iso-param standard partner (matched by
`sanlab.matching`), each arm's three sweep points (LR 0.04, 0.08, 0.16, seed 1) train
twice: as the members of one batched model (`sanlab.train.members.train_members`) and as
solo runs (`sanlab.train.trainer.train`), each into its ordinary run dir under --out. The
figure draws each run's training loss (every step) and validation loss, member and solo,
and below them member − solo; the table gives, per run, the largest relative difference
over every logged loss against the stated tolerance (`sanlab.train.members.TOLERANCE`).
Exit 1 when a run exceeds it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from sanlab.config import Config, ModelConfig, apply_overrides
from sanlab.data.prepare import PrepareConfig, prepare
from sanlab.errors import DataError, SanlabError
from sanlab.matching import match
from sanlab.paths import check_out_dir
from sanlab.report.data import Curve, read_curve
from sanlab.train.members import TOLERANCE, train_members
from sanlab.train.trainer import train

LRS = (0.04, 0.08, 0.16)


def arms() -> dict[str, ModelConfig]:
    """The demo's SAN and its iso-param standard partner."""
    san = ModelConfig(d_model=64, n_layers=5, n_heads=4, n_kv_heads=2, vocab_size=1024, ffn=False)
    partner = match(san, 128, targets=("params",), policy="nearest")[1].config
    d_ff = partner.d_ff or 4 * partner.d_model
    return {"SAN (5L d64, no FFN)": san,
            f"standard, iso-param ({partner.n_layers}L d{partner.d_model}, d_ff {d_ff})": partner}


def curve(run: Path) -> Curve:
    """A run's training and validation losses by tokens (the report's reader)."""
    c = read_curve(run)
    if c is None:
        raise DataError(f"{run}: no logged step in metrics.jsonl")
    return c


def largest_relative_difference(a: Curve, b: Curve) -> float:
    """max |a − b| / |b| over every training and validation loss; inf where the two runs did
    not log the same points."""
    if a.tokens != b.tokens or a.val_tokens != b.val_tokens:
        return float("inf")
    pairs = list(zip(a.loss, b.loss)) + list(zip(a.val_loss, b.val_loss))
    return max(abs(u - v) / abs(v) for u, v in pairs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/members-curves"))
    p.add_argument("--tokens", default="500K", help="training tokens per run (the demo's final budget)")
    p.add_argument("--data-tokens", default="1M", help="the synth corpus's training tokens (the demo's)")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    p.add_argument("--figure", type=Path, default=None, help="the PNG (default: OUT/members-vs-solo.png)")
    a = p.parse_args(argv)
    try:
        return run(a)
    except SanlabError as e:
        print(f"members_curves: error: {' '.join(str(e).splitlines())}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"members_curves: error: {e.filename or a.out}: {e.strerror or e}", file=sys.stderr)
        return 2


def run(a: argparse.Namespace) -> int:
    out = check_out_dir(a.out)
    figure = a.figure or out / "members-vs-solo.png"
    if figure.is_dir():
        raise DataError(f"--figure {figure}: is a directory")
    check_out_dir(figure.parent, "--figure's directory")
    data = out / "data"
    common = [f"data.dir={data.resolve()}", "data.seq_len=128", f"train.tokens={a.tokens}", "train.batch_rows=16",
              "train.eval_every=10", "train.eval_rows=32", "train.log_every=1", "train.threads=1",
              f"train.precision={a.precision}", "optim.name=muon", "optim.weight_decay=0.01", "train.seed=1"]
    sweeps = {name: [apply_overrides(Config, {"model": model.model_dump()}, [*common, f"optim.lr={lr}"]) for lr in LRS]
              for name, model in arms().items()}  # (a bad --tokens is refused before anything is written)
    prep = apply_overrides(PrepareConfig, {}, [f"tokens={a.data_tokens}", "seq_len=128", "vocab_size=1024"])
    out.mkdir(parents=True, exist_ok=True)
    if not (data / "manifest.json").exists():
        prepare(prep, data)
    curves: dict[str, list[tuple[str, Curve, Curve]]] = {}
    worst = 0.0
    print(f"{'run':<22} {'largest |member - solo| / |solo|':>34}")
    with (out / "train.log").open("w") as log:  # the runs' step lines, kept out of the table
        for name, cfgs in sweeps.items():
            tag = "san" if name.startswith("SAN") else "standard"
            members = [out / f"{tag}-lr{lr}-member" for lr in LRS]
            with contextlib.redirect_stdout(log):
                metas = train_members(cfgs, members, force=True)
            curves[name] = []
            for lr, cfg, member in zip(LRS, cfgs, members):
                solo = out / f"{tag}-lr{lr}-solo"
                with contextlib.redirect_stdout(log):
                    train(cfg, solo, force=True)
                m, s = curve(member), curve(solo)
                d = largest_relative_difference(m, s)
                worst = max(worst, d)
                curves[name].append((f"LR {lr}", m, s))
                print(f"{tag + ' LR ' + str(lr):<22} {d:>34.3g}")
    precision = metas[0]["device"]["precision"]  # (every run's: one config but for the LR)
    tol = TOLERANCE[precision]
    print(f"stated tolerance ({precision}): {tol:g} relative")
    draw(curves, figure, tol)
    print(figure)
    return 0 if worst <= tol else 1


def draw(curves: dict[str, list[tuple[str, Curve, Curve]]], path: Path, tol: float) -> None:
    import matplotlib  # lazy: only the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend is chosen

    fig, ax = plt.subplots(2, len(curves), figsize=(5.2 * len(curves), 6.2), sharex="col",
                           gridspec_kw={"height_ratios": [3, 1.4]}, squeeze=False)
    for j, (name, runs) in enumerate(curves.items()):
        top, bottom = ax[0][j], ax[1][j]
        for k, (label, m, s) in enumerate(runs):
            c = f"C{k}"
            top.plot(s.tokens, s.loss, color=c, lw=3.5, alpha=0.3, label=f"{label} solo")
            top.plot(m.tokens, m.loss, color=c, lw=0.9, label=f"{label} member")
            top.plot(s.val_tokens, s.val_loss, "o", color=c, ms=7, mfc="none")
            top.plot(m.val_tokens, m.val_loss, ".", color=c, ms=4)
            bottom.plot(m.tokens, [u - v for u, v in zip(m.loss, s.loss)], color=c, lw=0.9)
        top.set_title(name, fontsize=10)
        top.set_ylabel("loss")
        top.legend(fontsize=7, ncol=2)
        top.grid(alpha=0.3)
        bottom.set_ylabel("member − solo (train loss)", fontsize=8)
        bottom.set_xlabel("training tokens")
        bottom.grid(alpha=0.3)
        top_loss = max(max(s.loss) for _, _, s in runs)
        bottom.axhspan(-tol * top_loss, tol * top_loss, color="0.85", zorder=0,
                       label=f"stated tolerance ({tol:g} × the largest loss)")
        bottom.set_ylim(-1.5 * tol * top_loss, 1.5 * tol * top_loss)
        bottom.legend(fontsize=7, loc="upper right")
    fig.suptitle("members (thin lines, • validation) over their solo runs (wide lines, ○ validation)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)  # (checked writable before the training)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
