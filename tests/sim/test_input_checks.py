"""What a library user passes in by mistake fails at once, naming the argument or field and its type."""

from __future__ import annotations

import numpy as np
import pytest

from headway.sim import CacheConfig, SchedulerConfig, simulate
from headway.workload import RequestSpec


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SchedulerConfig(max_num_seqs=2.5), "SchedulerConfig.max_num_seqs must be an int, got float 2.5"),
        (lambda: SchedulerConfig(max_num_seqs="256"), "SchedulerConfig.max_num_seqs must be an int, got str '256'"),
        (lambda: SchedulerConfig(max_model_len=True), "SchedulerConfig.max_model_len must be an int, got bool True"),
        (lambda: SchedulerConfig(enable_chunked_prefill="no"), "enable_chunked_prefill must be a bool, got str 'no'"),
        (lambda: SchedulerConfig(async_scheduling=1), "SchedulerConfig.async_scheduling must be a bool, got int 1"),
        (lambda: SchedulerConfig(watermark="0.1"), "SchedulerConfig.watermark must be a number, got str '0.1'"),
        (lambda: CacheConfig(num_gpu_blocks=100.5), "CacheConfig.num_gpu_blocks must be an int, got float 100.5"),
        (lambda: CacheConfig(block_size=None), "CacheConfig.block_size must be an int, got NoneType None"),
        (lambda: CacheConfig(enable_prefix_caching="off"), "enable_prefix_caching must be a bool, got str 'off'"),
    ],
)
def test_configs_refuse_values_of_the_wrong_type(make: object, message: str) -> None:
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(".", r"\.")):
        make()  # type: ignore[operator]


def test_configs_take_integers_of_any_kind_and_ints_for_floats() -> None:
    assert SchedulerConfig(max_num_seqs=np.int64(8), watermark=0).max_num_seqs == 8
    assert CacheConfig(num_gpu_blocks=np.int32(100), gpu_memory_utilization=1).num_gpu_blocks == 100


def test_simulate_names_an_argument_of_the_wrong_type() -> None:
    spec = RequestSpec("a", 0.0, 10, 5)
    with pytest.raises(TypeError, match=r"scheduler must be a SchedulerConfig or None, got dict"):
        simulate([spec], "fcfs", scheduler={"max_num_seqs": 4})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"cache must be a CacheConfig or None, got dict"):
        simulate([spec], "fcfs", cache={"num_gpu_blocks": 4})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got str 'default' \(headway\.workload\.load_workload builds one"):
        simulate("default", "fcfs")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"workload must hold RequestSpec objects, got a dict"):
        simulate([spec, {"num_prompt_tokens": 10}], "fcfs")  # type: ignore[list-item]
