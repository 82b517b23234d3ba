"""The GPU step-time benchmark (``benchmarks/bench_gpu_steps.py``) run on a CPU with a tiny decoder, and
the preset fitted to its timings."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from factories import load_script
from headway.sim import fit_timings, read_step_timings

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu_steps.py"
TINY = [
    "--device", "cpu", "--threads", "1", "--dtype", "float32", "--layers", "2", "--hidden", "256", "--heads", "4",
    "--kv-heads", "2", "--intermediate", "1024", "--vocab", "2048", "--prefill", "32,128,512", "--batches", "1,8,32",
    "--contexts", "128,1024", "--mixed-chunks", "64,256", "--mixed-batches", "8", "--mixed-context", "128",
    "--prefixes", "0,96", "--warmup", "1", "--repeats", "7",
]  # fmt: skip
STEPS = {  # (kind, batch, context, chunk, prefix) -> (num_tokens, num_seqs, num_kv_tokens)
    **{("prefill", 0, 0, n, p): (n, 1, p + n) for n in (32, 128, 512) for p in (0, 96)},
    **{("decode", b, c, 0, 0): (b, b, b * c) for b in (1, 8, 32) for c in (128, 1024)},
    **{("mixed", 8, 128, n, p): (8 + n, 9, 8 * 128 + p + n) for n in (64, 256) for p in (0, 96)},
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("benchmarks/bench_gpu_steps.py")


def test_the_script_needs_only_the_standard_library_and_torch() -> None:
    tree = ast.parse(SCRIPT.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == {"torch"}


def test_a_tiny_decoder_on_cpu_is_timed_and_the_fitted_preset_predicts_it(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *TINY], capture_output=True, text=True,
                         timeout=300, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("device: ")
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["command"].startswith("python3 benchmarks/bench_gpu_steps.py --out $OUT/steps.json --device cpu ")
    assert str(tmp_path) not in out.read_text()  # no path of the measuring machine in the result file
    assert doc["model"]["layers"] == 2 and doc["model"]["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 4
    got = {(p["kind"], p["batch"], p["context"], p["chunk"], p["prefix"]):
           (p["num_tokens"], p["num_seqs"], p["num_kv_tokens"]) for p in doc["points"]}  # fmt: skip
    assert got == STEPS and doc["skipped"] == doc["not_run"] == []
    assert all(len(p["times_s"]) == 7 and p["median_s"] > 0 and not p["cuda_graph"] for p in doc["points"])

    fit, _ = fit_timings(read_step_timings(out), "tiny-cpu")
    # How well a fit predicts CPU timings depends on the machine's load, so this test checks only that the
    # script's output feeds the fit end to end (a positive time for every measured step); the fit's accuracy
    # is tested on synthetic timings in test_timings.py, where it cannot depend on the machine's speed.
    samples = read_step_timings(out).samples()
    assert len(samples) == len(STEPS)
    assert all(fit.model.sample_time(s) > 0 for s in samples)


def test_a_spent_budget_runs_no_step_and_lists_them_all(
    tmp_path: Path, bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "steps.json"
    try:
        assert bench.main(["--out", str(out), "--budget-s", "0", *TINY]) == 0
    finally:
        torch.set_num_threads(threads)
    doc = json.loads(out.read_text())
    assert doc["points"] == [] and len(doc["not_run"]) == len(STEPS)
    assert f"budget of 0 s spent: {len(STEPS)} steps not run" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no timed points"):
        read_step_timings(out)


def test_a_chunk_after_its_cached_prefix_computes_what_the_whole_prompt_does(bench: ModuleType) -> None:
    """The chunk path (its KV after the prefix's in the cache, positions from the prefix on, the offset
    causal mask) is the real computation: prefilling 40 tokens and then a 24-token chunk after them gives
    the last token's logits of a 64-token prefill."""
    import torch

    shape = bench.ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)
    model = bench.Decoder(shape, torch.device("cpu"), torch.float32, kv_tokens=64, max_pos=64, seed=0)
    ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(1))
    last = torch.tensor([63])
    pos = torch.arange(64)
    whole = model.forward(bench.Step("prefill", 0, 0, 64), ids, pos, last, None)
    model.forward(bench.Step("prefill", 0, 0, 40), ids[:40], pos[:40], torch.tensor([39]), None)
    step = bench.Step("prefill", 0, 0, 24, 40)
    _, chunk_pos, chunk_last, mask = model.inputs(step, torch.Generator().manual_seed(2))
    assert chunk_pos.tolist() == list(range(40, 64)) and chunk_last.tolist() == [23]
    assert type(mask).__name__ == "CausalBias"  # torch's lower-right causal bias (SDPA's fused kernels)
    _, _, _, boolean = model.inputs(step, torch.Generator().manual_seed(2), boolean_mask=True)
    assert boolean.shape == (24, 64) and boolean.sum().item() == sum(41 + i for i in range(24))
    for m in (mask, boolean):
        chunked = model.forward(step, ids[40:], chunk_pos, chunk_last, m)
        torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-5)
    wrong = model.forward(step, ids[40:], chunk_pos, chunk_last, None)  # the chunk alone, prefix ignored
    assert not torch.allclose(wrong, whole, rtol=1e-2, atol=1e-3)


def test_the_plan_interleaves_the_kinds_and_the_shape_is_checked(bench: ModuleType) -> None:
    steps = bench.plan([8, 4], [2, 1], [16], [4], [3], 16, [0, 10])
    assert [(s.kind, s.batch, s.chunk, s.prefix) for s in steps] == [
        ("prefill", 0, 4, 0), ("decode", 1, 0, 0), ("mixed", 3, 4, 0), ("prefill", 0, 8, 0), ("decode", 2, 0, 0),
        ("mixed", 3, 4, 10), ("prefill", 0, 4, 10), ("prefill", 0, 8, 10),
    ]  # fmt: skip
    assert [(s.num_tokens, s.num_seqs, s.num_kv_tokens) for s in steps][2] == (7, 4, 3 * 16 + 4)
    assert [(s.num_tokens, s.num_seqs, s.num_kv_tokens) for s in steps][5] == (7, 4, 3 * 16 + 10 + 4)
    llama = bench.ModelShape()
    assert llama.params == 8_030_261_248  # Llama-3-8B's parameter count
    assert llama.kv_bytes_per_token(2) == 131_072
    with pytest.raises(ValueError, match="multiple of --kv-heads 3"):
        bench.ModelShape(kv_heads=3)


def test_without_a_gpu_the_default_device_is_refused_at_once(tmp_path: Path, bench: ModuleType) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SystemExit, match=r"--device cuda: this torch .* sees no CUDA device"):
        bench.main(["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_a_step_that_fails_is_listed_as_skipped_and_the_run_goes_on(
    tmp_path: Path, bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of memory, or a kernel the GPU lacks, on one step must not end a one-shot run."""
    import torch

    forward = bench.Decoder.forward

    def failing(self: Any, step: Any, *args: Any) -> Any:
        if step.kind == "mixed":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return forward(self, step, *args)

    monkeypatch.setattr(bench.Decoder, "forward", failing)
    threads = torch.get_num_threads()
    out = tmp_path / "steps.json"
    try:
        bench.main(["--out", str(out), *TINY, "--repeats", "1", "--warmup", "0"])
    finally:
        torch.set_num_threads(threads)
    doc = json.loads(out.read_text())
    mixed = [s for s in STEPS if s[0] == "mixed"]
    assert sorted((p["kind"], p["batch"], p["context"], p["chunk"], p["prefix"]) for p in doc["skipped"]) == mixed
    assert all("OutOfMemoryError: CUDA out of memory (injected)" in p["why"] for p in doc["skipped"])
    assert len(doc["points"]) == len(STEPS) - len(mixed) == 12 and doc["not_run"] == []
