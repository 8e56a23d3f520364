"""CUDA paths: FlexAttention with a document block mask, compiled and eager, short and odd
lengths, bf16 autocast training, resume, sample, eval and a study on CUDA.

Skipped without a GPU (the default suite deselects `gpu`); run with `pytest -m gpu`
(`scripts/device_check.sh`). With SANLAB_DEVICE_CHECK_DRY=1 (the script's DRY_RUN=1) the
tests that do not need CUDA itself run on the CPU, their compiled models traced by dynamo
alone (backend "eager", no inductor): a check of the script and the tests, not of a GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sanlab.config import ModelConfig, load_config
from sanlab.model.lm import LM, lm_loss

DRY = os.environ.get("SANLAB_DEVICE_CHECK_DRY") == "1"
DEVICE = "cpu" if DRY else "cuda"
COMPILE: dict = {"backend": "eager"} if DRY else {}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not DRY and not torch.cuda.is_available(), reason="needs CUDA"),
]


def _packed_batch(V: int, B: int = 2, T: int = 256):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (B, T), generator=g)
    cuts = torch.tensor([[0] * 100 + [1] * 120 + [2] * 36, [0] * 17 + [1] * 239])
    return tokens.to(DEVICE), cuts.to(DEVICE)


@needs_cuda
@pytest.mark.parametrize("ffn", [False, True])
def test_flex_and_sdpa_agree_forward_and_backward(ffn):
    """The CUDA default (FlexAttention, block mask) computes what the SDPA dense-mask path does."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn=ffn)
    flex = LM(cfg.model_copy(update={"attn_backend": "flex"})).cuda()
    sdpa = LM(cfg.model_copy(update={"attn_backend": "sdpa"})).cuda()
    sdpa.load_state_dict(flex.state_dict())
    tokens, seg = _packed_batch(512)
    targets, mask = tokens.roll(-1, 1), torch.ones_like(tokens, dtype=torch.bool)
    results = []
    for model in (flex, sdpa):
        logits = model(tokens, seg)
        lm_loss(logits, targets, mask)[0].backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=2e-4, atol=2e-4)
    for name in results[0][1]:
        torch.testing.assert_close(results[0][1][name], results[1][1][name], rtol=2e-3, atol=2e-5, msg=name)


@needs_cuda
def test_cuda_matches_cpu_at_init():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn=True)
    cpu = LM(cfg)
    gpu = LM(cfg).cuda()
    gpu.load_state_dict(cpu.state_dict())
    tokens, seg = _packed_batch(512)
    torch.testing.assert_close(gpu(tokens, seg).cpu(), cpu(tokens.cpu(), seg.cpu()), rtol=1e-3, atol=1e-3)


@needs_cuda
def test_training_on_cuda_learns_and_resumes(train_data_dir: Path, tmp_path: Path):
    """bf16 autocast on CUDA: the run completes, learns, and a resumed run finishes its steps."""
    from sanlab.train.trainer import train

    base = [f"data.dir={train_data_dir}", "data.seq_len=32", "model.vocab_size=320", "model.d_model=64",
            "model.n_layers=2", "train.batch_rows=16", "train.eval_every=20"]
    meta = train(load_config(None, base + ["train.steps=40"]), tmp_path / "run")
    assert meta["status"] == "completed"
    assert meta["device"]["type"] == "cuda" and meta["device"]["precision"] == "bf16"
    assert meta["final"]["val_loss"] < meta["init"]["val_loss"] - 0.5
    # A longer run continued from the finished one's last checkpoint.
    meta2 = train(load_config(None, base + ["train.steps=60"]), tmp_path / "run", resume=True, force=True)
    assert meta2["status"] == "completed" and meta2["final"]["steps"] == 60


# --------------------------------------------------------------------------- compiled = eager, every attending mixer

# every mixer that attends, each beside softmax layers where it is a variant (the hybrid layout)
ATTENDING = [("softmax", "uniform"), ("sliding_window", "hybrid"), ("sink_window", "hybrid"),
             ("non_approximate", "hybrid"), ("static_emb_qk", "uniform"), ("rnd_emb_qk", "uniform"),
             ("fixed_seq_qk", "uniform")]
MASKED = {"sliding_window": {"window": 48}, "sink_window": {"sinks": 4, "window": 48}}


def _model(cfg: ModelConfig, T: int) -> LM:
    model = LM(cfg).to(DEVICE)
    model.bind_data(lambda n: torch.arange(n) % cfg.vocab_size, T)  # (FixedSeqQK's fixed sequence)
    return model


@pytest.mark.parametrize("mixer,layout", ATTENDING)
def test_compiled_equals_eager_on_packed_documents(mixer, layout):
    """`compile_layers` (what train.compile runs) gives the eager model's logits and
    gradients on packed documents of 256-token rows (FlexAttention's path on CUDA), fp32;
    the tolerances are the flex-vs-SDPA test's (inductor reorders sums)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn=True, mixer=mixer,
                      layout=layout, mixer_options=MASKED.get(mixer, {}))
    eager, compiled = _model(cfg, 256), _model(cfg, 256)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_layers(**COMPILE)
    tokens, seg = _packed_batch(512)
    tokens, seg = tokens.to(DEVICE), seg.to(DEVICE)
    targets, mask = tokens.roll(-1, 1), torch.ones_like(tokens, dtype=torch.bool)
    results = []
    for model in (eager, compiled):
        loss, _ = model(tokens, seg, targets, mask, 1e-4)
        loss.backward()
        with torch.no_grad():
            logits = model(tokens, seg)
        results.append((logits, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert compiled.compiled, "the compiled model fell back to eager"
    torch.testing.assert_close(results[1][0], results[0][0], rtol=2e-4, atol=2e-4)
    for name, g in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], g, rtol=2e-3, atol=2e-5, msg=name)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_short_and_odd_lengths_give_each_document_its_own_logits(compiled):
    """Rows of 1, 4 and 130 tokens (SDPA) and of 128 and 256 (FlexAttention), packed: each
    document gets the logits it gets alone (windowed and whole-document layers)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, mixer="sliding_window",
                      layout="hybrid", mixer_options={"window": 16})
    model = _model(cfg, 256)
    if compiled:
        model.compile_layers(**COMPILE)
    with torch.no_grad():
        for lengths in ([1], [4], [37, 90, 1], [100, 30], [255, 1]):
            docs = [torch.randint(0, 64, (n,), device=DEVICE) for n in lengths]
            seg = torch.cat([torch.full((n,), i, device=DEVICE) for i, n in enumerate(lengths)])[None]
            packed = model(torch.cat(docs)[None], seg)[0]
            start = 0
            for doc in docs:
                torch.testing.assert_close(packed[start:start + len(doc)], model(doc[None])[0], rtol=2e-4, atol=2e-4)
                start += len(doc)
    assert model.compiled == compiled


# --------------------------------------------------------------------------- the commands on CUDA

TINY = ["model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.vocab_size=320",
        "train.batch_rows=8", "train.eval_rows=8", "train.log_every=1000"]


@pytest.fixture(scope="module")
def long_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared synth dir with rows of 128 tokens: one FlexAttention block on CUDA."""
    from sanlab.config import apply_overrides
    from sanlab.data.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("gpu-data") / "synth"
    prepare(apply_overrides(PrepareConfig, {}, ["tokens=60000", "seq_len=128", "vocab_size=320", "val_frac=0.1"]),
            out)
    return out


def _sanlab(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sanlab", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=400)


def test_sample_and_eval_builtin_on_cuda(long_rows: Path, tmp_path: Path):
    """`sanlab sample` (decoding: a growing context, rows of every length) and `sanlab eval
    --tasks builtin` (short items) on CUDA, on a hybrid sliding-window model trained there."""
    base = [f"data.dir={long_rows}", *TINY, "data.seq_len=128", "model.mixer=sliding_window", "model.layout=hybrid",
            "train.steps=10", "train.eval_every=0", f"train.device={DEVICE}"]
    proc = _sanlab("train", "--out", "run", *base, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _sanlab("sample", "run", "--prompt", "The", "--max-new-tokens", "40", "--temperature", "0",
                   "--device", DEVICE, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    proc = _sanlab("eval", "run", "--tasks", "builtin", "--limit", "8", "--device", DEVICE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sanlab_grounded_qa" in proc.stdout


def test_batched_greedy_decoding_on_cuda_matches_each_row_alone():
    """`sanlab eval` decodes same-length greedy requests as the rows of one batch
    (`SanlabLM._greedy_rows`): on CUDA, in bf16 as eval runs there, each row's logits after
    the prefill and every appended token are its logits decoded alone, to bf16 rounding (a
    misplaced row or cache slot moves them by O(1))."""
    from sanlab.model.generate import Decoder

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn=True)
    model = LM(cfg).to(DEVICE).eval()
    g = torch.Generator().manual_seed(1)
    B, T, steps = 8, 20, 6
    prompt = torch.randint(4, 512, (B, T), generator=g).to(DEVICE)
    fed = torch.randint(4, 512, (steps, B, 1), generator=g).to(DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        dec = Decoder(model, max_len=64, batch=B)
        batched = [dec.prefill(prompt)] + [dec.append(t) for t in fed]
        for r in range(B):
            one = Decoder(model, max_len=64, batch=1)
            alone = [one.prefill(prompt[r:r + 1])] + [one.append(t[r:r + 1]) for t in fed]
            for a, b in zip(batched, alone):
                scale = b.abs().max().item()
                assert (a[r] - b[0]).abs().max().item() <= 2e-2 * scale, r


# a `sanlab train` that sends itself SIGTERM after the given step (argv: step, then the CLI's)
STOPPING = """
import os, signal, sys
import sanlab.train.trainer as trainer
stop_at = int(sys.argv.pop(1))
real = trainer.RunLog.log
def log(self, row):
    real(self, row)
    if row["step"] == stop_at:
        os.kill(os.getpid(), signal.SIGTERM)
trainer.RunLog.log = log
sys.argv = ["sanlab", *sys.argv[1:]]
from sanlab.cli import entry
entry()
"""

# bf16 tolerance: autocast rounds every matmul input to 8 significant bits (2^-9 relative),
# and CUDA's backward kernels (SDPA's and flex's dK/dV, the embedding's index_add)
# accumulate with atomics in an order that differs from run to run, so two identical
# CUDA runs already differ in the last bits at step 1; 30 steps amplify that to ~1e-3 of
# the loss. 1% still fails a wrong resume (a lost optimizer state or a reshuffled batch
# moves a step's loss by several %). Compiled against eager adds inductor's own rounding
# (fused kernels keep fp32 where eager rounds to bf16 between ops): 5%.
RESUME_RTOL, COMPILE_RTOL = 1e-2, 5e-2


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_on_cuda_compiled_and_eager_stop_and_resume(long_rows: Path, tmp_path: Path):
    """A 30-step `sanlab train` on CUDA (bf16), compile on and off: each stopped by SIGTERM at
    step 12 and resumed with --resume ends where the uninterrupted run does, and the
    compiled run's losses are the eager run's (tolerances above)."""
    base = [f"data.dir={long_rows}", *TINY, "data.seq_len=128", "train.steps=30", "train.eval_every=10",
            f"train.device={DEVICE}"]
    modes = [False] if DRY else [False, True]  # (a dry run on the CPU does not run inductor)
    whole = {}
    for on in modes:
        args = [*base, f"train.compile={str(on).lower()}"]
        proc = _sanlab("train", "--out", f"whole-{on}", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        meta = json.loads((tmp_path / f"whole-{on}" / "meta.json").read_text())
        assert meta["device"]["compile"] is on and meta["device"]["type"] == DEVICE
        whole[on] = _losses(tmp_path / f"whole-{on}")
        stopped = subprocess.run([sys.executable, "-c", STOPPING, "12", "train", "--out", f"cut-{on}", *args],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=400)
        assert stopped.returncode == 4, stopped.stderr[-3000:]  # interrupted, checkpointed
        proc = _sanlab("train", "--out", f"cut-{on}", "--resume", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        resumed = _losses(tmp_path / f"cut-{on}")
        assert len(resumed) == 30
        torch.testing.assert_close(torch.tensor(resumed), torch.tensor(whole[on]), rtol=RESUME_RTOL, atol=0)
    if len(whole) == 2:
        torch.testing.assert_close(torch.tensor(whole[True]), torch.tensor(whole[False]), rtol=COMPILE_RTOL, atol=0)


STUDY = """
name = "gpu"
seeds = [1]
[data]
dir = "{data}"
seq_len = 32
[model]
d_model = 32
n_layers = 3
n_heads = 4
n_kv_heads = 2
vocab_size = 512
[train]
batch_rows = 8
eval_every = 0
eval_rows = 8
device = "{device}"
[matching]
arms = ["iso_depth"]
policy = "nearest"
tolerance = 0.5
[sweep]
enabled = false
[final]
tokens = ["2K"]
[noise]
enabled = false
[runner]
workers = 1
threads = 1
"""


def test_a_tiny_study_runs_on_cuda(study_data_dir: Path, tmp_path: Path):
    """`sanlab study run` on CUDA (train.compile auto: compiled there) to its table."""
    (tmp_path / "spec.toml").write_text(STUDY.format(data=study_data_dir, device=DEVICE))
    proc = _sanlab("study", "run", "spec.toml", "--out", "runs/s", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _sanlab("study", "table", "runs/s", cwd=tmp_path)
    assert proc.returncode == 0 and "iso_depth" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_members_on_cuda_train_as_their_solo_runs(long_rows: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  backend: str):
    """The member dimension on the GPU path: three runs (two LRs, two seeds) as the members
    of one batched model on CUDA (eager; attention one call over the members folded into the
    batch, rows of 128: one FlexAttention block) end where their solo runs (eager) do, within
    CUDA's run-to-run tolerance (RESUME_RTOL: two identical CUDA runs already differ), and
    record the device and attention kernel the solo runs record."""
    if DRY and backend == "flex":
        pytest.skip("FlexAttention on the CPU runs only compiled by inductor")
    from sanlab.config import load_config
    from sanlab.train.members import train_members
    from sanlab.train.trainer import train

    monkeypatch.chdir(tmp_path)
    base = [f"data.dir={long_rows}", *TINY, "data.seq_len=128", "train.steps=8", "train.eval_every=4",
            f"train.device={DEVICE}", "train.compile=false", f"model.attn_backend={backend}"]
    points = [["optim.lr=0.01", "train.seed=1"], ["optim.lr=0.04", "train.seed=2"], ["optim.lr=0.02", "train.seed=1"]]
    cfgs = [load_config(None, [*base, *p]) for p in points]
    metas = train_members(cfgs, [f"m{i}" for i in range(3)])
    assert [m["status"] for m in metas] == ["completed"] * 3
    for i, cfg in enumerate(cfgs):
        solo = train(cfg, f"s{i}")
        assert metas[i]["device"]["type"] == solo["device"]["type"] == DEVICE
        assert metas[i]["device"]["attention"] == solo["device"]["attention"]
        member, alone = _losses(Path(f"m{i}")), _losses(Path(f"s{i}"))
        assert len(member) == len(alone) == 8
        assert member == pytest.approx(alone, rel=RESUME_RTOL)
        assert metas[i]["final"]["val_loss"] == pytest.approx(solo["final"]["val_loss"], rel=RESUME_RTOL)
