"""vLLM's ``--max-model-len`` (``SchedulerConfig.max_model_len``), the model's context length: a
prompt that reaches it is refused before the engine, an output stops where prompt and output reach
it, and a length the KV cache cannot hold fails as vLLM fails to start
(``tests/integrations/test_sim_vs_vllm.py`` checks the stop against vLLM's scheduler).

Hand-computed with a unit cost model (every step takes 1 s).
"""

from __future__ import annotations

import pytest

from factories import make_workload, unit_cost
from headway.cli import main
from headway.core import RequestState
from headway.sim import CacheConfig, SchedulerConfig, SimResult, simulate


def _run(rows: list[tuple[float, int, int]], max_model_len: int | None) -> SimResult:
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=max_model_len)
    cache = CacheConfig(num_gpu_blocks=64)
    return simulate(make_workload(rows), "fcfs", preset=unit_cost(1.0), scheduler=cfg, cache=cache)


def test_a_prompt_that_reaches_max_model_len_is_refused_and_an_output_stops_there() -> None:
    # 100 tokens: a 100-token prompt leaves no room for a token (vLLM: 400); 90 leaves 10 of its 30;
    # 40 gets its 30. Without the setting the limit is the cache's 1,024 tokens: all run whole.
    rows = [(0.0, 100, 5), (0.0, 90, 30), (0.0, 40, 30)]
    refused, capped, whole = _run(rows, 100).requests
    assert refused.state is RequestState.ABORTED and refused.first_scheduled_time is None
    assert refused.extra["abort_reason"] == "prompt does not fit max_model_len 100"
    assert (capped.state, capped.num_output_tokens) == (RequestState.FINISHED, 10)
    assert capped.finish_time == pytest.approx(10.0)  # its prefill step yields the first token, nine more
    assert whole.num_output_tokens == 30
    assert [r.num_output_tokens for r in _run(rows, None).requests] == [5, 30, 30]
    # unset, a prompt the cache cannot hold is refused naming the cache, not a max_model_len never given
    (alone,) = _run([(0.0, 1024, 1)], None).requests
    assert alone.extra["abort_reason"] == "prompt does not fit the KV cache (1,024 tokens)"


def test_settings_vllm_refuses_are_refused() -> None:
    with pytest.raises(ValueError, match="max_model_len must be >= 1"):
        SchedulerConfig(max_model_len=0)
    # without chunked prefill a prompt must fit one step, as vLLM's own check says
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(512\) is smaller than max_model_len \(1024\)"):
        SchedulerConfig(max_num_batched_tokens=512, max_model_len=1024, enable_chunked_prefill=False)
    SchedulerConfig(max_num_batched_tokens=512, max_model_len=1024)  # chunked: fine
    # 64 blocks of 16 tokens hold 1,024: a longer context does not fit, as vLLM fails to start
    with pytest.raises(ValueError, match="max_model_len 1,025 does not fit the KV cache on unit: 64 blocks"):
        _run([(0.0, 10, 1)], 1025)
    assert _run([(0.0, 10, 1)], 1024).requests[0].state is RequestState.FINISHED


def test_the_flag_refuses_prompts_and_names_itself_in_errors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--policies", "fcfs", "--num-requests", "200", "--no-report"]
    assert main([*argv, "--max-model-len", "600"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "requests aborted" in out and "prompt does not fit max_model_len 600" in out
    assert main([*argv, "--max-model-len", "100000000"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--max-model-len 100,000,000 does not fit the KV cache on llama3-8b-a100" in err
    assert main([*argv, "--max-model-len", "9000", "--no-chunked-prefill"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--max-num-batched-tokens (8192) is smaller than --max-model-len (9000)" in err
