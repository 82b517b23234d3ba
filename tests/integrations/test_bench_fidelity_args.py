"""``benchmarks/bench_fidelity.py`` refuses bad workload arguments before it starts vLLM (the second,
shared-prefix replay set comes after minutes of calibration and replays)."""

from __future__ import annotations

import pytest

from factories import load_script


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--system-prompts", "-1"], "--system-prompts must be >= 0, got -1"),
        (["--system-prompt-tokens", "0"], "--system-prompt-tokens must be in 1..1023 (--max-model-len 2048), got 0"),
        (["--system-prompt-tokens", "1024"], "got 1024"),
        (["--no-enable-prefix-caching"], "--system-prompts needs prefix caching"),
        (["--system-prompts", "0", "--no-enable-prefix-caching"], "--sessions needs prefix caching"),
        (["--sessions", "-1"], "--sessions must be >= 0 and --turns >= 1, got -1 and 4"),
        (["--turns", "0"], "got 50 and 0"),
        (["--think-time", "nan"], "--think-time must be a finite number of seconds >= 0, got nan"),
    ],
)
def test_bad_workload_arguments_are_refused_before_the_server(
    extra: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_script("benchmarks/bench_fidelity.py")

    def no_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("the server was started")

    monkeypatch.setattr(bench, "start_vllm_server", no_server)
    with pytest.raises(SystemExit) as info:
        bench.main(extra)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
