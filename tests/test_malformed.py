"""Malformed input across every command, end to end through `sanlab.cli.main`.

Each case must end with its documented exit code (2: a user error), exactly one
`sanlab: error: …` line on stderr naming the problem, no traceback, and no file
created, changed or removed anywhere in the test's world (data, runs, specs).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.errors import EXIT_USAGE
from sanlab.train.trainer import train
from test_train_loop import TINY, tiny_config

TINY_ARGS = " ".join(TINY)
MODEL = "d_model = 32\nn_layers = 4\nn_heads = 2\nn_kv_heads = 1\nvocab_size = 320\n"
SPEC = f"""name = "m"
seeds = [1]
[data]
dir = "{{data}}"
seq_len = 32
[model]
{MODEL}[matching]
arms = ["iso_depth"]
[sweep]
tokens = 512
[final]
tokens = [512]
"""

# name -> (argv template, text the error line must hold). Templates are split on spaces
# after filling {root} (the world), {data} (a prepared dir), {run} (a completed run), …
CASES: dict[str, tuple[str, str]] = {
    # ---- train: numbers that are not numbers, and out-of-range values
    "lr nan": ("train {base} optim.lr=nan --out {root}/new", "optim.lr=nan: Input should be a finite number"),
    "lr inf": ("train {base} optim.lr=inf --out {root}/new", "finite number"),
    "lr -inf": ("train {base} optim.lr=-inf --out {root}/new", "finite number"),
    "lr Infinity (JSON)": ("train {base} optim.lr=Infinity --out {root}/new", "finite number"),
    "lr 1e999": ("train {base} optim.lr=1e999 --out {root}/new", "finite number"),
    "lr negative": ("train {base} optim.lr=-0.1 --out {root}/new", "learning rates must be positive"),
    "adam_lr zero": ("train {base} optim.adam_lr=0 --out {root}/new", "learning rates must be positive"),
    "ns_precision unknown": ("train {base} optim.ns_precision=fp16 --out {root}/new",
                             "optim.ns_precision=fp16: Input should be 'auto', 'bf16' or 'fp32'"),
    "weight decay negative": ("train {base} optim.weight_decay=-1 --out {root}/new", "weight_decay must be >= 0"),
    "beta2 above 1": ("train {base} optim.beta2=1.5 --out {root}/new", "beta2 must lie in [0, 1]"),
    "beta1 equal 1": ("train {base} optim.beta1=1 --out {root}/new", "below 1"),
    "eps zero": ("train {base} optim.eps=0 --out {root}/new", "eps must be positive"),
    "grad_clip nan": ("train {base} optim.grad_clip=nan --out {root}/new", "finite number"),
    "ns_coefficients nan": ("train {base} optim.ns_coefficients=[1,2,nan] --out {root}/new", "finite number"),
    "warmup_frac inf": ("train {base} optim.warmup_frac=inf --out {root}/new", "finite number"),
    "z_loss nan": ("train {base} train.z_loss=nan --out {root}/new", "finite number"),
    "z_loss negative": ("train {base} train.z_loss=-1 --out {root}/new", "z_loss must be >= 0"),
    "milestone nan": ("train {base} train.milestones=[0.5,nan] --out {root}/new", "train.milestones.1"),
    "milestone out of range": ("train {base} train.milestones=[2] --out {root}/new", "fractions of training"),
    "spike_factor inf": ("train {base} train.spike_factor=inf --out {root}/new", "finite number"),
    "rope_theta nan": ("train {base} model.rope_theta=nan --out {root}/new", "finite number"),
    "init_std zero": ("train {base} model.init_std=0 --out {root}/new", "init_std must be positive"),
    "norm_eps negative": ("train {base} model.norm_eps=-1 --out {root}/new", "norm_eps must be positive"),
    "tokens overflow": ("train {base} train.tokens=1e999 --out {root}/new", "train.tokens=1e999"),
    "tokens bad suffix": ("train {base} train.tokens=5Q --out {root}/new", "not a token count"),
    "steps zero": ("train {base} train.steps=0 --out {root}/new", "steps must be positive"),
    "tokens and steps": ("train {base} train.tokens=1000 --out {root}/new", "not both"),
    "d_model text": ("train {base} model.d_model=abc --out {root}/new", "model.d_model=abc"),
    "unknown key": ("train {base} model.nope=1 --out {root}/new", "unknown key model.nope"),
    "unknown section": ("train {base} nosuch.key=1 --out {root}/new", "unknown key nosuch"),
    "section as a value": ("train {base} model=3 --out {root}/new", "override model=3"),
    "sub-key of a value": ("train {base} model.d_model.x=1 --out {root}/new", "has no sub-keys"),
    "empty key": ("train {base} =5 --out {root}/new", "empty key"),
    # ---- train: config files
    "toml syntax": ("train {root}/syntax.toml --out {root}/new", "malformed TOML"),
    "toml nan": ("train {root}/nan.toml --out {root}/new", "optim.lr: Input should be a finite number"),
    "toml inf in a list": ("train {root}/inflist.toml --out {root}/new", "train.milestones.1"),
    "toml date for a number": ("train {root}/date.toml --out {root}/new", "model.d_model: Input should be a valid integer"),
    "toml unknown section": ("train {root}/unknown.toml --out {root}/new", "bogus: unknown key"),
    "toml missing": ("train {root}/missing.toml --out {root}/new", "config file not found"),
    "two config files": ("train {root}/nan.toml {root}/syntax.toml --out {root}/new", "at most one config file"),
    # ---- train: flags
    "nproc zero": ("train {base} --nproc 0 --out {root}/new", "--nproc: must be >= 1"),
    "nproc nan": ("train {base} --nproc nan --out {root}/new", "--nproc: expected a number"),
    "batch not divisible by nproc": ("train {base} train.batch_rows=3 --nproc 2 --out {root}/new",
                                     "not divisible by 2 processes"),
    "unknown flag": ("train {base} --bogus --out {root}/new", "unrecognized arguments: --bogus"),
    "--out without a value": ("train {base} --out", "argument --out: expected one argument"),
    "no --out": ("train {base}", "the following arguments are required: --out"),
    # ---- train: output locations
    "out is a file": ("train {base} --out {root}/file.txt", "exists and is not a directory"),
    "out under a file": ("train {base} --out {root}/file.txt/run", "is a file, not a directory"),
    "out unwritable": ("train {base} --out {root}/readonly/run", "no permission to write"),
    "out not a run dir": ("train {base} --out {root}/other", "is not a sanlab run dir"),
    # ---- train: resume
    "resume nonexistent": ("train --out {root}/nowhere --resume", "does not exist, so there is no run to resume"),
    "resume without config": ("train --out {root}/started --resume", "has no config.json"),
    "resume another model": ("train model.d_model=64 model.n_heads=4 --out {run} --resume --force",
                             "embed.weight has shape [320, 32] in the checkpoint, [320, 64] in the model"),
    "resume incomplete state": ("train --out {incomplete} --resume", "incomplete checkpoint state (no 'rng')"),
    "resume corrupt finished": ("train --out {corrupt} --resume", "is a finished run, but"),
    "finished run, other config": ("train {base} train.milestones=[0.0,1.0] train.steps=3 --out {run}",
                                   "different config: train.steps"),
    # ---- train: data
    "data dir missing": ("train {nodata} data.dir={root}/nowhere --out {root}/new", "no such directory"),
    "data dir is a file": ("train {nodata} data.dir={root}/file.txt --out {root}/new", "no such directory"),
    "data dir not prepared": ("train {nodata} data.dir={root}/other --out {root}/new", "not a prepared data dir"),
    "manifest rows lie": ("train {nodata} data.dir={root}/lie-rows --out {root}/new", "splits.train.rows is"),
    "manifest bytes lie": ("train {nodata} data.dir={root}/lie-bytes --out {root}/new", "bytes, but"),
    "manifest malformed": ("train {nodata} data.dir={root}/lie-json --out {root}/new", "malformed manifest"),
    "shard truncated": ("train {nodata} data.dir={root}/truncated --out {root}/new", "truncated or corrupt shard"),
    "seq_len mismatch": ("train {base} data.seq_len=16 --out {root}/new", "holds rows of 32 tokens"),
    "vocab too small": ("train {base} model.vocab_size=64 --out {root}/new", "smaller than the vocabulary"),
    # ---- prepare
    "prepare out is a file": ("prepare --tokens 1000 --out {root}/file.txt", "exists and is not a directory"),
    "prepare out under a file": ("prepare --tokens 1000 --out {root}/file.txt/d", "is a file, not a directory"),
    "prepare out unwritable": ("prepare --tokens 1000 --out {root}/readonly/d", "no permission to write"),
    "prepare out not empty": ("prepare --tokens 1000 --out {root}/other", "not empty"),
    "prepare tokens nan": ("prepare --tokens nan --out {root}/new", "expected a count"),
    "prepare tokens overflow": ("prepare --tokens 1e999 --out {root}/new", "expected a count"),
    "prepare val_frac nan": ("prepare --tokens 1000 val_frac=nan --out {root}/new", "finite number"),
    "prepare mix weight nan": ("prepare --tokens 1000 synth.mix.math=nan --out {root}/new", "finite number"),
    "prepare seq_len 1": ("prepare --tokens 1000 seq_len=1 --out {root}/new", "seq_len must lie in"),
    "prepare corpus bogus": ("prepare --corpus bogus --out {root}/new", "invalid choice: 'bogus'"),
    "prepare unknown key": ("prepare --tokens 1000 nope=1 --out {root}/new", "unknown key nope"),
    "prepare config missing": ("prepare --config {root}/missing.toml --out {root}/new", "config file not found"),
    # ---- study
    "study multiplier nan": ("study plan {spec} sweep.multipliers=[1,nan]", "sweep.multipliers.1"),
    "study tolerance nan": ("study plan {spec} matching.tolerance=nan", "finite number"),
    "study tokens_per_s inf": ("study plan {spec} runner.tokens_per_s=inf", "finite number"),
    "study base lr nan": ("study plan {spec} sweep.base_lr.san_muon=nan", "finite number"),
    "study partner nan": ("study plan {spec} matching.partner.init_std=nan", "partner: init_std: Input should be a finite number"),
    "study arm model inf": ("study plan {root}/arm_inf.toml", "model.init_std must be a finite number"),
    "study only an unknown section": ("study plan {root}/unknown.toml", "bogus: unknown key"),
    "study plan data missing": ("study plan {root}/nodata_spec.toml", "is not a prepared data dir"),
    "study run data missing": ("study run {root}/nodata_spec.toml --out {root}/study", "is not a prepared data dir"),
    "study run out is a file": ("study run {spec} --out {root}/file.txt", "exists and is not a directory"),
    "study plan out is a file": ("study plan {spec} --out {root}/file.txt", "exists and is not a directory"),
    "study run out is a run dir": ("study run {spec} --out {run}", "is a training run dir"),
    "study run out unwritable": ("study run {spec} --out {root}/readonly/s", "no permission to write"),
    "study run override after --out": ("study run {spec} --out {root}/study runner.workers=0",
                                       "runner.workers must be positive"),
    "study run without --out": ("study run {spec}", "required: --out"),
    "study status corrupt study.json": ("study status {root}/badstudy", "study.json: malformed JSON"),
    "study table corrupt study.json": ("study table {root}/badstudy", "study.json: malformed JSON"),
    "study status not a study": ("study status {root}/other", "is not a study dir"),
    "study table nonexistent": ("study table {root}/nowhere", "is not a study dir"),
    "study spec missing": ("study plan {root}/missing.toml", "config file not found"),
    "study bad action": ("study frobnicate", "invalid choice: 'frobnicate'"),
    # ---- match
    "match tolerance nan": ("match --preset base --tolerance nan", "--tolerance: must be a finite number"),
    "match tolerance negative": ("match --preset base --tolerance -1", "--tolerance: must be >= 0"),
    "match seq-len zero": ("match --preset base --seq-len 0", "--seq-len: must be >= 1"),
    "match init_std inf": ("match --preset base model.init_std=inf", "finite number"),
    # ---- signal
    "signal json is a dir": ("signal --depths 2 --json {root}/other", "is a directory, not a file"),
    "signal json under a file": ("signal --depths 2 --json {root}/file.txt/out.json", "is a file, not a directory"),
    "signal json unwritable": ("signal --depths 2 --json {root}/readonly/out.json", "no permission to write"),
    "signal rows nan": ("signal --rows nan", "--rows: expected a number"),
    "signal rows zero": ("signal --rows 0", "--rows: must be >= 1"),
    "signal rope_theta inf": ("signal model.rope_theta=inf", "finite number"),
    "signal depths zero": ("signal --depths 0", "depths must be positive"),
    # ---- analyze
    "analyze crystal-tol nan": ("analyze {run} --crystal-tol nan", "--crystal-tol: must be a finite number"),
    "analyze crystal-tol zero": ("analyze {run} --crystal-tol 0", "--crystal-tol: must be > 0"),
    "analyze eval-rows zero": ("analyze {run} --eval-rows 0", "--eval-rows: must be >= 1"),
    "analyze out is a file": ("analyze {run} --out {root}/file.txt", "exists and is not a directory"),
    "analyze out under a file": ("analyze {run} --out {root}/file.txt/a", "is a file, not a directory"),
    "analyze out unwritable": ("analyze {run} --out {root}/readonly/a", "no permission to write"),
    "analyze no run dir": ("analyze {root}/nowhere", "run dir not found"),
    "analyze not a run dir": ("analyze {root}/other", "not a run dir"),
    "analyze bad checkpoint": ("analyze {run} --checkpoint milestone-033 --skip spectra", "milestone-033"),
    # ---- the dispatcher
    "unknown command": ("frobnicate", "unknown command 'frobnicate'"),
    # ---- probe: every task.* error, and run-config errors, refused before anything is
    # written: no --out dir, no ./runs/probe (the test runs in {root}), no data set
    "probe n_train zero": ("probe retrieval task.n_train=0", "n_train must be at least 1"),
    "probe n_val zero": ("probe retrieval task.n_val=0 --out {root}/probe-new", "n_val must be at least 1"),
    "probe n_test zero": ("probe dyck task.n_test=0", "n_test must be at least 1"),
    "probe modadd p 1": ("probe modadd task.p=1 --out {root}/probe-new", "p must be at least 2"),
    "probe modadd p too large": ("probe modadd task.p=70000", "p must be at most 65000"),
    "probe modadd train_frac 1": ("probe modadd task.train_frac=1", "train_frac must lie in (0, 1)"),
    "probe modadd nothing held out": ("probe modadd task.p=3 task.train_frac=0.9", "leaves 1 of 9 pairs held out"),
    "probe memorize alphabet 1": ("probe memorize task.alphabet=1 --out {root}/probe-new",
                                  "alphabet must be at least 2 labels"),
    "probe memorize key_symbols 1": ("probe memorize task.key_symbols=1", "key_symbols at least 2"),
    "probe memorize key space": ("probe memorize task.key_len=1 task.n_train=100", "exceeds the 16 distinct keys"),
    "probe capacity alphabet 1": ("probe capacity task.alphabet=1", "alphabet must be at least 2 labels"),
    "probe induction hops 0": ("probe induction task.hops=0", "hops must be at least 1"),
    "probe induction chain": ("probe induction task.pairs=1 task.hops=2", "cannot hold a chain of hops=2"),
    "probe induction nodes": ("probe induction task.pairs=20 task.nodes=8", "need more than nodes=8"),
    "probe dyck odd length": ("probe dyck task.min_len=3", "need even 2 <= min_len <= max_len"),
    "probe sentiment cues": ("probe sentiment task.max_cues=5 task.min_words=4", "max_cues <= min_words"),
    "probe sentiment negation": ("probe sentiment task.negation=1.5", "negation must lie in [0, 1]"),
    "probe addition digits": ("probe addition task.digits=0", "digits must lie in [1, 18]"),
    "probe addition space": ("probe addition task.digits=1 task.n_train=200", "exceeds the 100 pairs"),
    "probe retrieval m_min": ("probe retrieval task.m_min=0", "need 1 <= m_min <= m_max"),
    "probe retrieval key space": ("probe retrieval task.m_max=30 --out {root}/probe-new",
                                  "the key space has only 24"),
    "probe retrieval values": ("probe retrieval task.values=1", "values must be at least 2"),
    "probe retrieval too few examples": ("probe retrieval task.keys=2 task.values=2 task.m_max=1 task.n_train=100",
                                         "cannot draw 868 distinct retrieval examples"),
    "probe dyck too few examples": ("probe dyck task.max_len=2 --out {root}/probe-new",
                                    "cannot draw 10768 distinct dyck examples"),
    "probe task unknown key": ("probe retrieval task.nope=1", "unknown key task.nope"),
    "probe task key text": ("probe retrieval task.n_train=abc", "override task.n_train=abc"),
    "probe task nan": ("probe sentiment task.negation=nan", "override task.negation=nan: Input should be a finite"),
    "probe suite task error": ("probe --suite --quick task.n_train=0", "n_train must be at least 1"),
    "probe steps -1": ("probe retrieval train.steps=-1", "steps must be positive, got -1"),
    "probe steps -1 with --out": ("probe retrieval train.steps=-1 --out {root}/probe-new", "steps must be positive"),
    "probe lr inf": ("probe retrieval optim.lr=inf", "optim.lr=inf: Input should be a finite number"),
    "probe lr inf with --out": ("probe retrieval optim.lr=inf --out {root}/probe-new", "finite number"),
    "probe suite steps -1": ("probe --suite --quick train.steps=-1", "steps must be positive"),
    "probe out is a file": ("probe retrieval --out {root}/file.txt", "exists and is not a directory"),
    "probe out under a file": ("probe retrieval --out {root}/file.txt/p", "is a file, not a directory"),
    "probe out unwritable": ("probe retrieval --out {root}/readonly/p", "no permission to write"),
}


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` with a hash of its content (directories as 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _manifest_edit(src: Path, dst: Path, edit) -> None:  # type: ignore[no-untyped-def]
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    edit(m)
    (dst / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def world(train_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("malformed")
    data = root / "data"
    shutil.copytree(train_data_dir, data)
    run = root / "run"
    cfg = tiny_config(data, "train.steps=2", "train.eval_every=0", "train.milestones=[0.0,1.0]")
    assert train(cfg, run)["status"] == "completed"
    corrupt = root / "corrupt"
    shutil.copytree(run, corrupt)
    f = corrupt / "checkpoints" / "latest" / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    incomplete = root / "incomplete"  # an unfinished run whose state.json lost a key
    shutil.copytree(run, incomplete)
    state = json.loads((incomplete / "checkpoints" / "latest" / "state.json").read_text())
    del state["rng"]
    (incomplete / "checkpoints" / "latest" / "state.json").write_text(json.dumps(state))
    meta = json.loads((incomplete / "meta.json").read_text())
    (incomplete / "meta.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    (root / "badstudy").mkdir()
    (root / "badstudy" / "study.json").write_text('{"name": ')
    (root / "file.txt").write_text("not a directory\n")
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("someone else's files\n")
    (root / "started" / "checkpoints").mkdir(parents=True)
    (root / "readonly").mkdir()
    (root / "syntax.toml").write_text("[model\nd_model = 3\n")
    (root / "nan.toml").write_text("[optim]\nlr = nan\n")
    (root / "inflist.toml").write_text("[train]\nmilestones = [0.5, inf]\n")
    (root / "unknown.toml").write_text("[bogus]\nx = 1\n")
    (root / "date.toml").write_text("[model]\nd_model = 1979-05-27\n")
    (root / "spec.toml").write_text(SPEC.format(data=data))
    (root / "nodata_spec.toml").write_text(SPEC.format(data=root / "nowhere"))
    (root / "arm_inf.toml").write_text(SPEC.format(data=data) + '[[arms]]\nname = "hot"\nmodel = { init_std = inf }\n')
    _manifest_edit(data, root / "lie-rows", lambda m: m["splits"]["train"].update(rows=m["splits"]["train"]["rows"] + 5))
    _manifest_edit(data, root / "lie-bytes",
                   lambda m: m["splits"]["train"]["shards"][0]["files"]["docs"].update(bytes=12))
    shutil.copytree(data, root / "lie-json")
    (root / "lie-json" / "manifest.json").write_text('{"format": "sanlab-prepared", "version": 1, "splits": ')
    shutil.copytree(data, root / "truncated")
    shard = root / "truncated" / "val-00000.tokens.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    return {"root": str(root), "data": str(data), "run": str(run), "corrupt": str(corrupt),
            "incomplete": str(incomplete),
            "spec": str(root / "spec.toml"),
            "base": f"data.dir={data} {TINY_ARGS} train.steps=2 train.eval_every=0",
            "nodata": f"{TINY_ARGS} train.steps=2 train.eval_every=0"}


@pytest.fixture
def readonly(world: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`readonly/` may not be written: by its mode, and for root (whom modes do not stop)
    by what os.access says, which is what a read-only mount would answer."""
    ro = Path(world["root"]) / "readonly"
    ro.chmod(0o555)
    real = os.access

    def access(path: object, mode: int, *args: object, **kwargs: object) -> bool:
        if mode & os.W_OK and Path(os.path.abspath(str(path))) == ro:
            return False
        return real(path, mode, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", access)
    yield
    ro.chmod(0o755)


def test_the_table_covers_every_command() -> None:
    assert len(CASES) >= 60
    commands = {argv.split()[0] for argv, _ in CASES.values()}
    assert {"train", "prepare", "study", "match", "signal", "analyze", "probe"} <= commands


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_input_is_one_line_exit_2_and_changes_nothing(
        name: str, world: dict[str, str], readonly: None, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    template, needle = CASES[name]
    argv = template.format(**world).split()
    root = Path(world["root"])
    monkeypatch.chdir(root)  # a default output location (`probe`: ./runs/probe) is inside the world too
    before = _snapshot(root)
    rc = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert rc == EXIT_USAGE, (rc, captured.err)
    assert len(lines) == 1 and lines[0].startswith("sanlab: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    assert needle in lines[0], lines[0]
    assert _snapshot(root) == before, "files changed"


def test_overrides_are_accepted_after_the_flags(world: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """`sanlab study plan SPEC --out DIR key=value` (the form `study --help` shows) applies the override."""
    assert main(["study", "plan", world["spec"], "--json", "runner.workers=3", "sweep.multipliers=[1,2]"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["workers"] == 3
    assert sorted({r["multiplier"] for r in plan["runs"] if r["multiplier"] is not None}) == [1.0, 2.0]
