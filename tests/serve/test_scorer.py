"""The gateway's batch scorer: one batch at a time, later arrivals batched behind it."""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from pathlib import Path

import pytest

from headway.serve._scorer import BatchScorer, ProcessScoreFn, default_scorer_threads, load_score_fn


def test_batches_run_one_at_a_time_and_arrivals_meanwhile_form_the_next() -> None:
    running = 0
    most = 0
    sizes: list[int] = []
    lock = threading.Lock()

    def slow(prompts: list[str]) -> list[float]:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        sizes.append(len(prompts))
        time.sleep(0.05)
        with lock:
            running -= 1
        return [float(len(p)) for p in prompts]

    async def main() -> list[float]:
        scorer = BatchScorer(slow, batch_size=4, max_wait_s=0.001)
        first = asyncio.ensure_future(scorer.score("a"))
        await asyncio.sleep(0.01)  # the first batch (one prompt) is being scored
        rest = [asyncio.ensure_future(scorer.score("b" * (i + 2))) for i in range(9)]
        return await asyncio.gather(first, *rest)

    scores = asyncio.run(main())
    assert scores == [1.0] + [float(i + 2) for i in range(9)]
    assert most == 1  # never two batches at once
    assert sizes == [1, 4, 4, 1]  # the nine that arrived meanwhile, in batches of at most 4


def test_a_failing_batch_fails_its_prompts_and_the_next_batch_still_runs() -> None:
    calls = 0

    def flaky(prompts: list[str]) -> list[float]:
        nonlocal calls
        calls += 1
        time.sleep(0.02)
        if calls == 1:
            raise RuntimeError("model crashed")
        return [1.0] * len(prompts)

    async def main() -> list[object]:
        scorer = BatchScorer(flaky, batch_size=8, max_wait_s=0.001)
        first = asyncio.ensure_future(scorer.score("x"))
        await asyncio.sleep(0.005)
        second = asyncio.ensure_future(scorer.score("y"))
        return await asyncio.gather(first, second, return_exceptions=True)

    first, second = asyncio.run(main())
    assert isinstance(first, RuntimeError) and second == 1.0


def test_threads_and_max_length_are_refused_for_a_custom_scorer() -> None:
    with pytest.raises(ValueError, match="apply only to a trained predictor"):
        load_score_fn("headway.predict.score:default_scorer()", threads=2)
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        load_score_fn("default:gpu")


def test_default_scorer_gets_the_gateways_threads_and_max_length(monkeypatch: pytest.MonkeyPatch) -> None:
    import headway.predict.score as score_mod

    seen: list[tuple[str, int, int | None]] = []

    class Fake:
        def score(self, prompts: list[str]) -> list[float]:
            return [0.0] * len(prompts)

    def fake_default_scorer(backend: str = "torch", *, threads: int = 2, max_length: int | None = None) -> Fake:
        seen.append((backend, threads, max_length))
        return Fake()

    monkeypatch.setattr(score_mod, "default_scorer", fake_default_scorer)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setenv("HEADWAY_VLLM_CPUS", "all")  # no local engine's CPUs to leave alone
    assert load_score_fn("default:onnx-int8", threads=1, max_length=64)(["a", "b"]) == [0.0, 0.0]
    load_score_fn("default")
    assert seen == [("onnx-int8", 1, 64), ("torch", 2, None)]  # unset: 2 threads, the checkpoint's length


@pytest.mark.parametrize(
    ("cpus", "machine", "engine", "threads"),
    [
        ({3}, 16, None, 1),  # one CPU to run on
        ({0, 1}, 16, None, 2),
        (set(range(16)), 16, None, 2),
        ({0, 1}, 2, None, 1),  # a 2-CPU machine: a local vLLM gets CPU 0 by default
        ({0, 1, 2, 3}, 4, None, 1),  # ... and CPUs 0-2 of 4
        ({0, 1}, 2, "all", 2),  # no pinning asked for
        ({0, 1, 2, 3}, 4, "0", 2),
        ({0, 1, 2, 3}, 8, "0-2", 1),
        ({0}, 2, None, 1),  # only the engine's CPU: still one thread
        ({0, 1}, 16, "0,x", 2),  # a malformed list is the launcher's to report
    ],
)
def test_default_threads_follow_the_cpus_the_gateway_may_use_beside_a_local_engine(
    monkeypatch: pytest.MonkeyPatch, cpus: set[int], machine: int, engine: str | None, threads: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: machine)
    if engine is None:
        monkeypatch.delenv("HEADWAY_VLLM_CPUS", raising=False)
    else:
        monkeypatch.setenv("HEADWAY_VLLM_CPUS", engine)
    assert default_scorer_threads() == threads


def test_a_malformed_engine_cpu_list_is_named_in_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("HEADWAY_VLLM_CPUS", "0,x")
    with caplog.at_level("WARNING", logger="headway.serve.scorer"):
        assert default_scorer_threads() == 2
    assert "HEADWAY_VLLM_CPUS: bad CPU list '0,x'" in caplog.text


def test_a_checkpoint_directory_scores_with_the_gateways_threads_and_max_length(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import headway.predict.score as score_mod

    seen: list[tuple[str, str, int, int | None]] = []

    class Fake:
        def score(self, prompts: list[str]) -> list[float]:
            return [1.0] * len(prompts)

    def fake_from_checkpoint(
        path: str, backend: str = "torch", *, threads: int = 2, max_length: int | None = None
    ) -> Fake:
        seen.append((path, backend, threads, max_length))
        return Fake()

    monkeypatch.setattr(score_mod.Scorer, "from_checkpoint", fake_from_checkpoint)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("HEADWAY_VLLM_CPUS", "all")  # no local engine's CPUs to leave alone
    (tmp_path / "predictor.json").write_text("{}")
    assert load_score_fn(f"{tmp_path}:onnx-int8", threads=1, max_length=64)(["a"]) == [1.0]
    load_score_fn(str(tmp_path))
    assert seen == [(str(tmp_path), "onnx-int8", 1, 64), (str(tmp_path), "torch", 2, None)]
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        load_score_fn(f"{tmp_path}:gpu")


def test_a_blank_prompt_is_scored_and_so_are_its_batch_mates(tmp_path: Path) -> None:
    """A blank prompt is a request too; it used to fail its whole scoring batch."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint

    encoder, tokenizer = load_encoder(None)  # the bundled MiniLM, frozen: only the head is written
    ck = save_checkpoint(LengthPredictor(encoder, "mean"), tokenizer, tmp_path / "ck", fine_tuned=False, max_length=32)
    prompts = ["Write a poem about the sea.", "What is 2+2?", " ", "List three colors.", ""]

    async def main() -> list[float]:
        scorer = BatchScorer(load_score_fn(str(ck), threads=1), batch_size=32, max_wait_s=0.01)
        return await asyncio.gather(*[scorer.score(p) for p in prompts])

    got = asyncio.run(main())
    assert all(math.isfinite(x) for x in got) and got[2] == pytest.approx(got[4])
    assert len({round(x, 6) for x in got}) == 4


# ------------------------------------------------------------- scoring in a worker process
_WORKER_SCORERS = """
import os


def length(prompts):
    return [float(len(p)) for p in prompts]


def pid(prompts):
    return [float(os.getpid())] * len(prompts)


def crash(prompts):
    if prompts == ["die"]:
        os._exit(3)
    return [1.0] * len(prompts)


def broken(prompts):
    raise KeyError("no such token")


def no_model():
    raise RuntimeError("no model at /nowhere")


def chatty():
    import logging

    logging.getLogger("headway.predict.shipped").info("building the int8 scorer once")
    logging.getLogger("headway.predict.shipped").debug("not at info")
    return length
"""


@pytest.fixture
def worker_scorers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module the worker process can import (a spawned process gets the parent's sys.path)."""
    (tmp_path / "hw_worker_scorers.py").write_text(_WORKER_SCORERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hw_worker_scorers"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # a child that exited and was joined (reaped) is gone
    except ProcessLookupError:
        return False
    return True


def test_a_process_scorer_scores_in_another_process_and_close_stops_it(worker_scorers: str) -> None:
    fn = ProcessScoreFn(f"{worker_scorers}:length")
    pid = fn.pid
    try:
        assert pid is not None and pid != os.getpid() and _alive(pid)
        assert list(fn(["a", "bcd"])) == [1.0, 3.0]
        scores, cpu_s = fn.timed(["xy"])
        assert list(scores) == [2.0] and cpu_s >= 0.0
    finally:
        fn.close()
    assert fn.pid is None and not _alive(pid)
    fn.close()  # twice is fine


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_process_scorer_logs_as_the_gateway_does(
    worker_scorers: str, fmt: str, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import logging

    from headway.serve._logging import setup_logging

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # restored after the test
    monkeypatch.setattr(root, "level", root.level)
    setup_logging("info", fmt)
    fn = ProcessScoreFn(f"{worker_scorers}:chatty()")  # logs at INFO while it loads
    fn.close()
    err = capfd.readouterr().err
    assert "building the int8 scorer once" in err and "not at info" not in err
    line = next(x for x in err.splitlines() if "building the int8 scorer once" in x)
    if fmt == "json":
        assert json.loads(line)["logger"] == "headway.predict.shipped"
    else:
        assert " INFO headway.predict.shipped: building the int8 scorer once" in line


def test_a_process_scorer_reports_load_errors_when_built(worker_scorers: str) -> None:
    with pytest.raises(ValueError, match="no model at /nowhere"):
        ProcessScoreFn(f"{worker_scorers}:no_model()")
    with pytest.raises(ValueError, match="apply only to a trained predictor"):
        ProcessScoreFn(f"{worker_scorers}:length", threads=2)


def test_a_scoring_error_fails_the_batch_and_the_worker_goes_on(worker_scorers: str) -> None:
    bad = ProcessScoreFn(f"{worker_scorers}:broken")
    try:
        with pytest.raises(RuntimeError, match="KeyError: 'no such token'"):
            bad(["a"])
        pid = bad.pid
        with pytest.raises(RuntimeError, match="KeyError"):
            bad(["b"])
        assert bad.pid == pid  # the same worker
    finally:
        bad.close()


def test_a_dead_worker_fails_its_batch_and_the_next_call_starts_another(worker_scorers: str) -> None:
    fn = ProcessScoreFn(f"{worker_scorers}:crash")
    first = fn.pid
    try:
        with pytest.raises(RuntimeError, match="exited with code 3 while scoring"):
            fn(["die"])
        assert fn.pid is None
        assert list(fn(["a", "b"])) == [1.0, 1.0]  # a new worker
        assert fn.pid not in (None, first)
    finally:
        fn.close()


def test_batch_scorer_through_a_worker_process(worker_scorers: str) -> None:
    async def main() -> tuple[list[float], int]:
        scorer = BatchScorer(ProcessScoreFn(f"{worker_scorers}:pid"), batch_size=4, max_wait_s=0.001)
        try:
            got = await asyncio.gather(*[scorer.score(f"p{i}") for i in range(6)])
            return got, scorer.num_batches
        finally:
            scorer.close()

    got, batches = asyncio.run(main())
    assert len(set(got)) == 1 and got[0] != float(os.getpid())  # every score from the one worker
    assert batches >= 2  # at most 4 per batch


def test_a_trained_scorer_reads_a_bounded_prefix_with_lone_surrogates_replaced(tmp_path: Path) -> None:
    """A lone surrogate used to raise in the cache key (and the tokenizer refuses one); a 1 MB
    prompt used to be tokenized whole."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint
    from headway.predict.score import MAX_CHARS_PER_TOKEN, Scorer, scoring_text

    encoder, tokenizer = load_encoder(None)
    ck = save_checkpoint(LengthPredictor(encoder, "mean"), tokenizer, tmp_path / "ck", fine_tuned=False, max_length=32)
    scorer = Scorer.from_checkpoint(ck, cache_size=0)
    got = scorer.score(["ab\ud800cd", "ab\ufffdcd"])
    assert math.isfinite(got[0]) and got[0] == pytest.approx(got[1])
    big = "the quick brown fox " * 50_000
    assert scoring_text(big, 32) == big[: 32 * MAX_CHARS_PER_TOKEN]
    seen: list[int] = []
    run = scorer._run
    scorer._run = lambda texts: (seen.extend(len(t) for t in texts), run(texts))[1]  # type: ignore[method-assign]
    assert scorer.score_one(big) == pytest.approx(scorer.score_one(big[:300]))  # 32 tokens either way
    assert seen == [32 * MAX_CHARS_PER_TOKEN, 300]


def test_the_int8_scorer_is_built_once_with_one_log_line_and_no_onnxruntime_chatter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`--scorer default:onnx-int8` at first start quantizes the shipped predictor into the cache:
    one line says so and where, not ONNX Runtime's ~40 (a line per tensor, a pre-processing hint)."""
    import logging

    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path))
    root, ort = logging.getLogger(), logging.getLogger("onnxruntime")
    filters, ort_level = list(root.filters), ort.level
    caplog.set_level(logging.INFO)
    score = load_score_fn("default:onnx-int8", threads=1)
    assert len(score(["What is 2 + 2?"])) == 1
    assert [r for r in caplog.records if "onnxruntime" in r.pathname] == []
    (built,) = [r for r in caplog.records if r.name.startswith("headway")]
    (cached,) = (tmp_path / "derived").glob("*.int8-rows.onnx")
    assert "int8 scorer" in built.getMessage() and str(cached) in built.getMessage()
    assert (root.filters, ort.level) == (filters, ort_level)  # restored
    logging.getLogger().info("after")  # the root logger itself logs again
    assert caplog.records[-1].getMessage() == "after"
    caplog.clear()
    load_score_fn("default:onnx-int8", threads=1)  # the next start finds it built: nothing to say
    assert [r for r in caplog.records if "int8" in r.getMessage()] == []
