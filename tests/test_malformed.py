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
from sanlab.study.spec import load_spec
from sanlab.train.checkpoint import state_digest
from sanlab.train.trainer import train
from test_train_loop import TINY, tiny_config

import malformed_round4

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
    "data dir is a file": ("train {nodata} data.dir={root}/file.txt --out {root}/new", "a file, not a directory"),
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
    "study lock_at with the sweep off": ("study plan {root}/axis_spec.toml sweep.lock_at=400 sweep.enabled=false",
                                         "sweep.enabled = false"),
    "study table --json with --format": ("study table {root}/badstudy --json --format md", "--json and --format md"),
    "study status --json with --format": ("study status {root}/badstudy --json --format csv", "--json and --format"),
    "match --json with --format": ("match --preset base --json --format text", "--json and --format text"),
    "study run another spec into a study dir": ("study run {spec} sweep.tokens=1K --out {root}/madestudy",
                                                "sweep.tokens differ"),
    "study run another spec, --extend": ("study run {spec} sweep.tokens=1K --out {root}/madestudy --extend",
                                         "sweep.tokens differ"),
    "study run more seeds without --extend": ("study run {spec} seeds=[1,2] --out {root}/madestudy", "add --extend"),
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

# Round 3 (issue 29): the commands added in round 2, tried as a new user would.
# /proc allows root to write by its mode and refuses every mkdir; others are refused by the mode.
CANNOT_CREATE = "cannot create anything in /proc" if os.geteuid() == 0 else "no permission to write in /proc"
CASES |= {
    # ---- every reader of a checkpoint verifies it against state.json, the same way
    "sample corrupt weights": ("sample {corrupt} --prompt hi", "model.safetensors: checksum mismatch"),
    "eval corrupt weights": ("eval {corrupt} --tasks builtin", "model.safetensors: checksum mismatch"),
    "eval a good run then a corrupt one": ("eval {run} {corrupt} --tasks builtin", "checksum mismatch"),
    "analyze corrupt weights": ("analyze {corrupt} --skip spectra", "model.safetensors: checksum mismatch"),
    "analyze corrupt milestone": ("analyze {badms}", "milestone-000/model.safetensors: checksum mismatch"),
    "export corrupt weights": ("export {corrupt} --hf {root}/hf", "model.safetensors: checksum mismatch"),
    "export corrupt milestone": ("export {badms} --hf {root}/hf --checkpoint 0", "checksum mismatch"),
    "sample no state.json": ("sample {nostate} --prompt hi", "state.json: missing, so the checkpoint cannot"),
    "analyze no state.json": ("analyze {nostate} --skip spectra", "state.json: missing"),
    "export no state.json": ("export {nostate} --hf {root}/hf", "state.json: missing"),
    "eval no state.json": ("eval {nostate} --tasks builtin", "state.json: missing"),
    "resume no state.json": ("train --out {nostate_unfinished} --resume",
                             "--resume: " + "{nostate_unfinished}/checkpoints/latest/state.json is missing"),
    "finished run, no state.json": ("train {base} train.milestones=[0.0,1.0] --out {nostate}",
                                    "is a finished run, but"),
    "sample state.json not UTF-8": ("sample {badstate} --prompt hi", "unreadable checkpoint state (not UTF-8 JSON)"),
    "sample state.json without checksums": ("sample {nochecks} --prompt hi", "no checksums of model.safetensors"),
    "sample state.json edited": ("sample {editedstate} --prompt hi", "checksum mismatch of its own content"),
    "resume state.json edited": ("train --out {editedstate_unfinished} --resume", "checksum mismatch of its own"),
    "sample config.json edited": ("sample {editedcfg} --prompt hi", "its model differs from the config latest was"),
    "analyze config.json edited": ("analyze {editedcfg} --skip spectra", "its model differs from the config"),
    # data.seq_len edited to 16 (trained at 32): the model still runs at 16, so only the check stops it
    "sample seq_len edited": ("sample {editedseq} --prompt hi", "its data.seq_len differs from the config latest"),
    "eval seq_len edited": ("eval {editedseq} --tasks builtin", "its data.seq_len differs from the config latest"),
    "analyze seq_len edited": ("analyze {editedseq} --skip spectra", "its data.seq_len differs from the config"),
    "export seq_len edited": ("export {editedseq} --hf {root}/hf", "its data.seq_len differs from the config latest"),
    "resume config.json edited": ("train --out {editedcfg_unfinished} --resume",
                                  "written under another config than the run dir's config.json (train.z_loss"),
    "resume state.json not UTF-8": ("train --out {badstate_unfinished} --resume", "unreadable checkpoint state"),
    # ---- one validation step before anything is written
    "mixit draw shorter than the rows": ("train {base} model.mixer=mixit model.mixer_options.seq_len=16 --out {root}/new",
                                         "its fixed draw covers model.mixer_options.seq_len=16"),
    "freeze what the model lacks": ('train {base} train.freeze=["mlp"] --out {root}/new', "nothing to freeze for 'mlp'"),
    "unknown mixer": ("train {base} model.mixer=nosuch --out {root}/new", "nosuch"),
    "layout of the wrong length": ("train {base} model.layout=softmax,softmax --out {root}/new",
                                   "2 mixers listed for n_layers=1"),
    "eval builtin then an unknown task": ("eval {run} --tasks builtin,no_such_task", "unknown task 'no_such_task'"),
    "eval an unknown task": ("eval {run} --tasks no_such_task", "unknown task 'no_such_task'"),
    "eval limit zero": ("eval {run} --tasks builtin --limit 0", "--limit must be positive"),
    "eval batch size zero": ("eval {run} --tasks builtin --batch-size 0", "--batch-size must be positive"),
    "eval no tasks": ("eval {run} --tasks ,", "at least one task"),
    "eval run missing": ("eval {root}/nowhere --tasks builtin", "run dir not found"),
    "eval bad checkpoint": ("eval {run} --tasks builtin --checkpoint 33", "no checkpoint 'milestone-033'"),
    # ---- one reader per file format
    "toml nested 100,000 deep (train)": ("train {root}/deep.toml --out {root}/new", "nested too deeply"),
    "toml tables nested 100,000 deep": ("train {root}/deep_tables.toml --out {root}/new", "nested too deeply"),
    "toml nested 100,000 deep (match)": ("match {root}/deep.toml", "nested too deeply"),
    "toml nested 100,000 deep (study plan)": ("study plan {root}/deep.toml", "nested too deeply"),
    "toml nested 100,000 deep (study run)": ("study run {root}/deep.toml --out {root}/s", "nested too deeply"),
    "toml nested 100,000 deep (prepare)": ("prepare --config {root}/deep.toml --out {root}/new", "nested too deeply"),
    "toml not UTF-8 (train)": ("train {root}/latin1.toml --out {root}/new", "malformed TOML (not UTF-8: byte 0xe9"),
    "toml not UTF-8 (study plan)": ("study plan {root}/latin1.toml", "not UTF-8"),
    "override nested 100,000 deep": ("train {base} model.layout={deep_list} --out {root}/new", "model.layout"),
    "config.json not UTF-8 (sample)": ("sample {badcfg} --prompt hi", "config.json: malformed JSON (not UTF-8"),
    "config.json not UTF-8 (analyze)": ("analyze {badcfg}", "config.json: malformed JSON (not UTF-8"),
    "config.json not UTF-8 (resume)": ("train --out {badcfg} --resume", "config.json: unreadable run config"),
    "config.json a list": ("sample {listcfg} --prompt hi", "config.json: malformed JSON (a list, not an object)"),
    "meta.json nested 100,000 deep": ("analyze {deepmeta}", "meta.json: malformed JSON (nested too deeply)"),
    "meta.json nested deep (export)": ("export {deepmeta} --hf {root}/hf", "nested too deeply"),
    "study.json not UTF-8 (status)": ("study status {badstudy2}", "study.json: malformed JSON (not UTF-8"),
    "study.json not UTF-8 (table)": ("study table {badstudy2}", "study.json: malformed JSON (not UTF-8"),
    "study.json nested deep (report)": ("report {deepstudy}", "nested too deeply"),
    "manifest not UTF-8": ("train {nodata} data.dir={root}/latin1-manifest --out {root}/new",
                           "manifest.json: malformed manifest (not UTF-8"),
    "import config.json not UTF-8": ("import --hf {root}/hfbad --out {root}/imported", "config.json: malformed JSON"),
    "import no folder": ("import --hf {root}/nowhere --out {root}/imported", "no such folder"),
    # ---- sample
    "sample prompt not UTF-8": ("sample {run} --prompt {bad_prompt}", "--prompt: not valid UTF-8 text"),
    "sample seed too large": ("sample {run} --prompt hi --seed 99999999999999999999999", "--seed must lie in"),
    "sample seed negative": ("sample {run} --prompt hi --seed -1", "--seed must lie in"),
    "sample max-new-tokens 1e9": ("sample {run} --prompt hi --max-new-tokens 1000000000",
                                  "--max-new-tokens must lie in [0, 1,000,000]"),
    "sample max-new-tokens negative": ("sample {run} --prompt hi --max-new-tokens -1", "--max-new-tokens"),
    "sample temperature nan": ("sample {run} --prompt hi --temperature nan", "--temperature must be"),
    "sample top-p zero": ("sample {run} --prompt hi --top-p 0", "--top-p must lie in"),
    "sample top-k negative": ("sample {run} --prompt hi --top-k -1", "--top-k must be non-negative"),
    "sample empty prompt": ("sample {run} --prompt=", "--prompt: give some text"),
    "sample bad checkpoint": ("sample {run} --prompt hi --checkpoint 33", "no checkpoint 'milestone-033'"),
    "sample run missing": ("sample {root}/nowhere --prompt hi", "run dir not found"),
    # ---- destinations that cannot be written although permissions say they can
    "train out in /proc": ("train {base} --out /proc/sanlab-x", "sanlab-x: " + CANNOT_CREATE),
    "prepare out in /proc": ("prepare --tokens 1000 --out /proc/sanlab-x", "sanlab-x: " + CANNOT_CREATE),
    "study run out in /proc": ("study run {spec} --out /proc/sanlab-x", "sanlab-x: " + CANNOT_CREATE),
    "analyze out in /proc": ("analyze {run} --out /proc/sanlab-x", "sanlab-x: " + CANNOT_CREATE),
    "signal json in /proc": ("signal --depths 2 --json /proc/sanlab-x.json", "sanlab-x.json: " + CANNOT_CREATE),
    "export out in /proc": ("export {run} --hf /proc/sanlab-x", "sanlab-x: " + CANNOT_CREATE),
    "export out not empty": ("export {run} --hf {root}/other", "exists and is not empty"),
    "record export under a file": ("record export {study} {root}/file.txt/sub", "is a file, not a directory"),
    "record export into a user's dir": ("record export {study} {root}/other", "is not empty and not a record"),
    "record export into itself": ("record export {study} {study}", "is the source itself"),
    "record export inside itself": ("record export {study} {study}/rec", "is inside the source"),
    "record export into a run dir": ("record export {study} {run}", "is a training run dir"),
    "record export into a file": ("record export {study} {root}/file.txt", "exists and is not a directory"),
    "record export in /proc": ("record export {study} /proc/sanlab-x", "sanlab-x: " + CANNOT_CREATE),
    "record export study.json not UTF-8": ("record export {badspec} {root}/rec", "study.json: malformed JSON (not UTF"),
    # ---- accepted silently before
    "match no targets": ("match --preset tiny --targets ,", "--targets ',': give at least one partner"),
    "match a target twice": ("match --preset tiny --targets params,params", "params given twice"),
    "match unknown target": ("match --preset tiny --targets nope", "unknown target 'nope'"),
    "probe arm sets data": ("probe retrieval --arm x:data.seq_len=32 --out {root}/probe",
                            "the probe writes its own data (data.* is not settable)"),
    "probe arm sets the task": ("probe retrieval --arm x:task.n_keys=3 --out {root}/probe",
                                "an arm sets model.*, optim.*, train.* only"),
    "ffn true, no state mixer": ("train {base} model.ffn=true model.state_mixer=none --out {root}/new",
                                 "ffn=true contradicts state_mixer=none"),
    "ffn false, a state mixer": ("train {base} model.ffn=false model.state_mixer=swiglu --out {root}/new",
                                 "ffn=false contradicts state_mixer=swiglu"),
    "ffn contradiction in a file": ("train {root}/ffn.toml {base} --out {root}/new", "ffn=true contradicts"),
    "ffn contradiction (match)": ("match --preset tiny ffn=true state_mixer=none", "ffn=true contradicts"),
    "ffn contradiction in an arm": ("study plan {root}/ffn_arm.toml", "arms.0.model: ffn=true contradicts"),
}
# Round 4 (issues 46 and 49), written with paths relative to the world (the cwd of every case)
OUTSIDE = "../../badms/checkpoints/latest"  # another run's valid checkpoint, reached from run/checkpoints/
OTHER_TOKENIZER = "tokenizers differ (the vocabulary): data otherdata vs"
CASES |= {
    # ---- a checkpoint name is one directory of the run's checkpoints/, never a path
    "export checkpoint of another run": (f"export run --hf o --checkpoint {OUTSIDE}",
                                         f"--checkpoint '{OUTSIDE}': not a checkpoint name"),
    "export checkpoint absolute path": ("export run --hf o --checkpoint {root}/badms/checkpoints/latest",
                                        "not a checkpoint name"),
    "sample checkpoint of another run": (f"sample run --prompt hi --checkpoint {OUTSIDE}", "not a checkpoint name"),
    "eval checkpoint of another run": (f"eval run --tasks builtin --checkpoint {OUTSIDE}", "not a checkpoint name"),
    "analyze checkpoint of another run": (f"analyze run --skip spectra --checkpoint {OUTSIDE}",
                                          "not a checkpoint name"),
    "export checkpoint ..": ("export run --hf o --checkpoint ..", "not a checkpoint name"),
    # ---- --data with another corpus's tokenizer: refused alike everywhere (what it encodes, not its bytes)
    "export --data another tokenizer": ("export run --hf o --data otherdata", OTHER_TOKENIZER),
    "sample --data another tokenizer": ("sample run --prompt hi --data otherdata", OTHER_TOKENIZER),
    "eval --data another tokenizer": ("eval run --tasks builtin --data otherdata", OTHER_TOKENIZER),
    "analyze --data another tokenizer": ("analyze run --skip spectra --data otherdata", OTHER_TOKENIZER),
    # ---- import validates the config as train does
    "import seq_len 10**12": ("import --hf hf-seq-huge --out imported", "seq_len must lie in [1, 65534]"),
    "import seq_len 1e12": ("import --hf hf-seq-float --out imported", "seq_len must be a positive integer"),
    "import seq_len true": ("import --hf hf-seq-true --out imported", "seq_len must be an integer, got true"),
}
CASES |= malformed_round4.CASES  # issue 46: odd paths, hand-edited records, suites, formats (its own module)

# Damaged but readable: the command answers (exit 0) and names the damage in one line on
# stderr; nothing is changed (the store is repaired only by `study run`, which owns it).
READABLE: dict[str, tuple[str, str]] = {
    "status with a results line not UTF-8": ("study status {dmgstudy}", "1 damaged line(s) skipped"),
    "table with a results line not UTF-8": ("study table {dmgstudy}", "1 damaged line(s) skipped"),
    "table json with a results line not UTF-8": ("study table {dmgstudy} --json", "1 damaged line(s) skipped"),
} | malformed_round4.READABLE


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` with a hash of its content (directories as 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():  # a loop or a dangling one is a case's input: the link itself, never followed
            out[rel] = "link to " + os.readlink(p)
            continue
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
    state["state_sha256"] = state_digest(state)  # a state written without it, not a damaged one
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
    (root / "axis_spec.toml").write_text(SPEC.format(data=data).replace(f'dir = "{data}"', 'corpus = "synth"\ntokens = 20000\n'
                                                                      'axis = {"synth.facts" = [400, 1600]}'))
    (root / "madestudy").mkdir()  # a study dir made from {spec}: another spec must not take it over
    (root / "madestudy" / "study.json").write_text(
        json.dumps(load_spec(root / "spec.toml").model_dump(mode="json", exclude_unset=True)))
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
            "nodata": f"{TINY_ARGS} train.steps=2 train.eval_every=0",
            **_round3_world(root, data, run), **_round4_world(root, data, run),
            **malformed_round4.world(root, run, root / "study")}


DEEP = 100_000


def _copy_run(run: Path, dst: Path, *, status: str | None = None) -> Path:
    shutil.copytree(run, dst)
    if status is not None:
        meta = json.loads((dst / "meta.json").read_text())
        (dst / "meta.json").write_text(json.dumps({**meta, "status": status}))
    return dst


def _flip_tensor_bytes(f: Path) -> None:
    """4 bytes of tensor data flipped, the header intact (the file still loads)."""
    raw = bytearray(f.read_bytes())
    for i in range(len(raw) - 64, len(raw) - 60):
        raw[i] ^= 0xFF
    f.write_bytes(bytes(raw))


def _round3_world(root: Path, data: Path, run: Path) -> dict[str, str]:
    """The files of issue 29's cases: damaged run dirs, files nested too deeply or not
    UTF-8, a study and a damaged copy of it (`write_study`'s numbers)."""
    from test_records import write_study

    latest = Path("checkpoints") / "latest"
    badms = _copy_run(run, root / "badms")
    _flip_tensor_bytes(badms / "checkpoints" / "milestone-000" / "model.safetensors")
    for name, status in (("nostate", None), ("nostate_unfinished", "interrupted")):
        (_copy_run(run, root / name, status=status) / latest / "state.json").unlink()
    for name, status in (("badstate", None), ("badstate_unfinished", "interrupted")):
        f = _copy_run(run, root / name, status=status) / latest / "state.json"
        f.write_bytes(b"\xff\xfe" + f.read_bytes())
    f = _copy_run(run, root / "nochecks") / latest / "state.json"
    state = {k: v for k, v in json.loads(f.read_text()).items() if k != "checksums"}
    f.write_text(json.dumps({**state, "state_sha256": state_digest(state)}))
    for name, status in (("editedstate", None), ("editedstate_unfinished", "interrupted")):
        f = _copy_run(run, root / name, status=status) / latest / "state.json"
        f.write_text(f.read_text().replace('"step": 2', '"step": 1', 1))  # still JSON, another step
    for name, status, key, value in (("editedcfg", None, "model", {"rope_theta": 10001.0}),
                                     ("editedcfg_unfinished", "interrupted", "train", {"z_loss": 0.5})):
        f = _copy_run(run, root / name, status=status) / "config.json"
        cfg = json.loads(f.read_text())
        f.write_text(json.dumps({**cfg, key: {**cfg[key], **value}}))  # valid, and not what was trained
    f = _copy_run(run, root / "editedseq") / "config.json"
    cfg = json.loads(f.read_text())
    f.write_text(json.dumps({**cfg, "data": {**cfg["data"], "seq_len": cfg["data"]["seq_len"] // 2}}))
    (_copy_run(run, root / "badcfg") / "config.json").write_bytes(b'{"model": "\xff"}')
    (_copy_run(run, root / "listcfg") / "config.json").write_text("[1, 2]")
    (_copy_run(run, root / "deepmeta") / "meta.json").write_text("[" * DEEP + "]" * DEEP)
    (root / "deep.toml").write_text("a = " + "[" * DEEP + "]" * DEEP + "\n")
    (root / "deep_tables.toml").write_text("[model]\nmixer_options = " + "{ a = " * DEEP + "1" + " }" * DEEP + "\n")
    (root / "latin1.toml").write_bytes('[model]\nmixer = "caf\u00e9"\n'.encode("latin-1"))
    (root / "ffn.toml").write_text('[model]\nffn = true\nstate_mixer = "none"\n')
    (root / "ffn_arm.toml").write_text(SPEC.format(data=data)
                                       + '[[arms]]\nname = "x"\nmodel = { ffn = true, state_mixer = "none" }\n')
    shutil.copytree(data, root / "latin1-manifest")
    m = json.loads((root / "latin1-manifest" / "manifest.json").read_text())
    (root / "latin1-manifest" / "manifest.json").write_bytes(json.dumps({**m, "note": "caf\u00e9"},
                                                                        ensure_ascii=False).encode("latin-1"))
    (root / "hfbad").mkdir()
    (root / "hfbad" / "config.json").write_bytes(b'{"model_type": "\xff"}')
    study = write_study(root / "study")
    shutil.copytree(study, root / "dmgstudy")
    store = root / "dmgstudy" / "results.jsonl"
    lines = store.read_bytes().split(b"\n")
    store.write_bytes(b"\n".join([*lines[:2], b'{"type": "run", "run_id": "x\xff"}', *lines[2:]]))
    shutil.copytree(study, root / "badspec")
    (root / "badspec" / "study.json").write_bytes(b'{"name": "\xff"}')
    (root / "badstudy2").mkdir()
    (root / "badstudy2" / "study.json").write_bytes(b'{"name": "\xff"}')
    (root / "deepstudy").mkdir()
    (root / "deepstudy" / "study.json").write_text("[" * DEEP + "]" * DEEP)
    names = ("badms", "nostate", "nostate_unfinished", "badstate", "badstate_unfinished", "nochecks", "badcfg",
             "editedstate", "editedstate_unfinished", "editedcfg", "editedcfg_unfinished", "editedseq",
             "listcfg", "deepmeta", "study", "dmgstudy", "badspec", "badstudy2", "deepstudy")
    return {**{n: str(root / n) for n in names}, "deep_list": "[" * DEEP + "]" * DEEP,
            "bad_prompt": b"\xff\xfe".decode("utf-8", "surrogateescape")}  # what Python makes of argv bytes


def _round4_world(root: Path, data: Path, run: Path) -> dict[str, str]:
    """A corpus whose tokenizer gives two tokens each other's ids, and exports of `run`
    whose config.json says seq_len 10**12, 1e12 and true."""
    from test_analysis_cli import swap_two_tokens

    shutil.copytree(data, root / "otherdata")
    swap_two_tokens(root / "otherdata")
    assert main(["export", str(run), "--hf", str(root / "hfsrc")]) == 0
    for name, value in (("hf-seq-huge", "1000000000000"), ("hf-seq-float", "1e12"), ("hf-seq-true", "true")):
        shutil.copytree(root / "hfsrc", root / name)
        f = root / name / "config.json"
        text = f.read_text()
        assert text.count('"seq_len": 32,') == 1
        f.write_text(text.replace('"seq_len": 32,', f'"seq_len": {value},'))
    return {}


class _TaskIndex:
    """lm-eval's task index with a few names: building the real one takes ~20 s, and what a
    row tests is sanlab's order (task names checked before anything is written)."""

    all_tasks = ["arc_easy", "lambada_openai", "sciq"]

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


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
    assert len(CASES) >= 380
    commands = {argv.split()[0] for argv, _ in CASES.values()}
    assert {"train", "prepare", "study", "match", "signal", "analyze", "sample", "eval", "export", "import",
            "record", "probe", "report"} <= commands


def _run(template: str, world: dict[str, str], monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], dict[str, str], dict[str, str]]:
    """(exit code, stderr lines, the world's files before, after) of one command."""
    argv = template.format(**world).split()
    if argv[0] == "eval":
        import lm_eval.tasks

        monkeypatch.setattr(lm_eval.tasks, "TaskManager", _TaskIndex)
    root = Path(world["root"])
    monkeypatch.chdir(root)  # a default output location (`probe`: ./runs/probe) is inside the world too
    before = _snapshot(root)
    rc = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return rc, captured.err.splitlines(), before, _snapshot(root)


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_input_is_one_line_exit_2_and_changes_nothing(
        name: str, world: dict[str, str], readonly: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    template, needle = CASES[name]
    if " /proc/" in template and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    rc, lines, before, after = _run(template, world, monkeypatch, capsys)
    assert rc == EXIT_USAGE, (rc, lines)
    assert len(lines) == 1 and lines[0].startswith("sanlab: error: "), lines
    assert needle.format(**world) in lines[0], lines[0]
    assert after == before, "files changed"


@pytest.mark.parametrize("name", list(READABLE))
def test_damaged_but_readable_input_answers_and_names_the_damage_in_one_line(
        name: str, world: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    template, needle = READABLE[name]
    rc, lines, before, after = _run(template, world, monkeypatch, capsys)
    assert rc == 0, (rc, lines)
    assert len(lines) == 1 and needle in lines[0], lines
    assert after == before, "files changed"


def test_overrides_are_accepted_after_the_flags(world: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """`sanlab study plan SPEC --out DIR key=value` (the form `study --help` shows) applies the override."""
    assert main(["study", "plan", world["spec"], "--json", "runner.workers=3", "sweep.multipliers=[1,2]"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["workers"] == 3
    assert sorted({r["multiplier"] for r in plan["runs"] if r["multiplier"] is not None}) == [1.0, 2.0]
