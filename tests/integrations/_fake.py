"""A minimal continuous-batching engine over fake requests, to test the plugin's adapter without vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from headway.core import Policy
from headway.integrations.vllm import PolicyAdapter


@dataclass(eq=False)
class FakeRequest:
    """Has the fields of vLLM's ``Request`` that the adapter reads."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    priority: int = 0
    num_computed_tokens: int = 0
    output: int = 0
    status: str = "WAITING"
    sampling_params: Any = field(default_factory=lambda: SimpleNamespace(extra_args=None, ignore_eos=True))
    prompt_token_ids: list[int] | None = None

    @property
    def num_output_tokens(self) -> int:
        return self.output

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.output


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeEngine:
    """One prompt per step, one token per running request per step; ``max_num_seqs`` slots.

    Uses the adapter the way the vLLM scheduler subclass does: ``step_start`` then the
    queue's peek/pop, ``mark_running``, ``progress`` and ``finish``; for preemptive
    policies the head of the queue displaces ``displacement_victim`` when no slot is free.
    """

    def __init__(
        self, policy: Policy, max_num_seqs: int = 2, gain_bound: int | None = 1, **adapter_kwargs: Any
    ) -> None:
        self.clock = FakeClock()
        self.adapter = PolicyAdapter(policy, clock=self.clock, epoch=1000.0, **adapter_kwargs)
        self.waiting = self.adapter.make_queue()
        self.running: list[FakeRequest] = []
        self.max_num_seqs = max_num_seqs
        self.finished: list[str] = []
        self.preempted: list[str] = []
        self.started: list[str] = []
        self.step_dt = 0.01
        self.gain_bound = gain_bound  # what progress() is told a request gains per step at most

    def add(self, req: FakeRequest) -> None:
        self.waiting.add_request(req)

    def step(self) -> None:
        a = self.adapter
        a.step_start()
        if a.preemptive:
            while self.waiting and len(self.running) >= self.max_num_seqs:
                victim = a.displacement_victim(self.waiting, self.running)
                if victim is None:
                    break
                self.running.remove(victim)
                a.preempt(victim)
                victim.status = "PREEMPTED"
                victim.num_computed_tokens = 0
                self.preempted.append(victim.request_id)
                self.waiting.prepend_request(victim)
        scheduled: dict[str, int] = {}
        for r in self.running:
            n = r.num_tokens - r.num_computed_tokens
            scheduled[r.request_id] = n
            r.num_computed_tokens += n
        while self.waiting and len(self.running) < self.max_num_seqs:
            r = self.waiting.pop_request()
            r.status = "RUNNING"
            self.started.append(r.request_id)
            self.running.append(r)
            n = r.num_tokens - r.num_computed_tokens
            scheduled[r.request_id] = n
            r.num_computed_tokens += n
        for h in a.take_popped():
            a.mark_running(h, a.engine[h])
        self.clock.t += self.step_dt
        for r in self.running:
            r.output += 1
        a.progress(scheduled, self.gain_bound)
        for r in list(self.running):
            if r.output >= r.max_tokens:
                self.running.remove(r)
                r.status = "FINISHED"
                a.finish(r, aborted=False)
                self.finished.append(r.request_id)

    def run(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.running and not self.waiting:
                return
            self.step()
        raise AssertionError("fake engine did not drain")
