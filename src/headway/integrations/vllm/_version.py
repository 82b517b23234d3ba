"""The supported vLLM versions and the scheduler interface the plugin relies on."""

from __future__ import annotations

from typing import Any

from headway.integrations.vllm._errors import VllmVersionError

__all__ = ["SUPPORTED_VLLM_VERSIONS", "check_vllm_version"]

SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = ("0.32",)
"""``major.minor`` releases of vLLM whose V1 scheduler this plugin was written against."""

_SCHEDULER_HOOKS = ("schedule", "update_from_output", "add_request", "_preempt_request", "_free_request")
_QUEUE_METHODS = (
    "add_request", "pop_request", "peek_request", "prepend_request", "prepend_requests",
    "remove_request", "remove_requests",
)  # fmt: skip


def check_vllm_version(version: str) -> None:
    """Raise :class:`VllmVersionError` unless ``version`` is a supported vLLM release."""
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM_VERSIONS):
        raise VllmVersionError(
            f"headway's vLLM plugin supports vLLM {', '.join(v + '.x' for v in SUPPORTED_VLLM_VERSIONS)} "
            f"(the V1 scheduler interface it subclasses); found vLLM {version}. Install a supported "
            "version, or set check_version=false in the headway settings to try anyway."
        )


def _check_interface(scheduler_cls: Any, queue_cls: Any, version: str) -> None:
    missing = [f"Scheduler.{m}" for m in _SCHEDULER_HOOKS if not callable(getattr(scheduler_cls, m, None))]
    missing += [f"RequestQueue.{m}" for m in _QUEUE_METHODS if not hasattr(queue_cls, m)]
    if missing:
        raise VllmVersionError(
            f"vLLM {version}'s scheduler interface differs from the one headway's plugin supports "
            f"(vLLM {', '.join(v + '.x' for v in SUPPORTED_VLLM_VERSIONS)}): missing {', '.join(missing)}"
        )
