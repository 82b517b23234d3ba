"""One front door for every workload: :func:`load_workload` (``headway simulate --workload X``)."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headway.workload._arrivals import (
    ArrivalProcess,
    BurstArrivals,
    GammaArrivals,
    PoissonArrivals,
    arrivals_meta,
    is_finite_real,
    replay_arrivals,
)
from headway.workload._datasets import TokenCounter
from headway.workload._default import DEFAULT_BURSTINESS, DEFAULT_NUM_REQUESTS, DEFAULT_RATE, default_workload
from headway.workload._errors import UnknownWorkloadError
from headway.workload._formats import MODEL_FORMATS, available_formats, is_format, read_file
from headway.workload._resample import resample_output_lengths
from headway.workload._sessions import (
    DEFAULT_THINK_TIME,
    read_turn_lengths,
    resample_answers,
    session_workload,
    with_system_prompts,
)
from headway.workload._spec import Workload
from headway.workload._tenants import DEFAULT_TENANT_MIX, TenantMix, assign_tenants

__all__ = [
    "ARRIVAL_KINDS",
    "DATA_DIR_ENV",
    "MAX_NUM_REQUESTS",
    "LoadOptions",
    "available_formats",
    "available_workloads",
    "check_workload_options",
    "find_data_dir",
    "load_workload",
    "workload_data_path",
    "workload_description",
]

DATA_DIR_ENV = "HEADWAY_DATA_DIR"
"""Environment variable naming the shared data folder (the one holding ``azure_llm_2023/``...)."""

ARRIVAL_KINDS = ("trace", "gamma", "poisson", "burst", "gamma-vllm")
MAX_NUM_REQUESTS = 10**8
"""Largest ``num_requests`` :func:`load_workload` accepts (more would not fit in memory)."""


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """Options of :func:`load_workload`; every field is optional.

    - ``num_requests``: how many requests, at most :data:`MAX_NUM_REQUESTS` (synthetic:
      generated, default 2,000; timed traces: the first N by arrival; timeless datasets:
      a seeded random sample, with replacement when N exceeds the dataset).
    - ``arrivals``: ``"trace"`` (replay recorded times), ``"gamma"``, ``"poisson"``,
      ``"burst"`` (all at t = 0) or ``"gamma-vllm"`` (the same Gamma gaps placed as
      ``vllm bench serve`` places them: first request after one gap, times rescaled so
      the last is exactly N / rate; see :class:`~headway.workload.GammaArrivals`).
      Default: ``"gamma"`` when ``burstiness`` is given, else ``"trace"`` for timed
      sources, else ``"gamma"`` when ``rate`` is given, else ``"burst"``. The synthetic
      ``default`` uses Gamma(6 req/s, burstiness 0.5), first request at t = 0, not
      rescaled (the realised rate moves a few % with the seed).
    - ``rate``: requests/s. For ``"trace"`` the replay is time-scaled by one factor so
      that the N requests taken have rate (N - 1) / span (span = last minus first of
      their recorded times), the gaps keeping their proportions; for ``"gamma"``,
      ``"poisson"`` and ``"gamma-vllm"`` it is the mean rate and defaults, on a timed
      trace, to the trace's own (N - 1) / span. Burst arrivals take no rate (ValueError).
    - ``burstiness``: Gamma shape (``vllm bench serve --burstiness``; default 1, 0.5 for
      the synthetic ``default``); refused with ``"trace"``, ``"burst"`` and, unless 1,
      ``"poisson"`` arrivals, which would ignore it.
    - ``seed``: drives sampling, arrivals, resampling and tenants.
    - ``output_cv``: resample output lengths with this lognormal CV (0.19 is realistic; ``sharegpt-sessions``:
      the answers, before the turns are built, so that each turn's prompt holds its conversation's answers).
    - ``model``: alpaca_eval model whose output lengths to use.
    - ``tenants``: a :class:`TenantMix`, ``"default"`` (3 tiers) or ``"none"``; default:
      the 3-tier mix for synthetic workloads, none (one standard tenant) for data.
    - ``data_dir``: the shared data folder for named data sources.
    - ``format``: force a file's format (see :func:`available_formats`); refused with a built-in name.
    - ``count_tokens``: token counter for text datasets.
    - ``name``: workload name.
    - ``think_time``: ``sharegpt-sessions`` only: mean seconds between an answer and the next turn
      (exponential; default :data:`~headway.workload.DEFAULT_THINK_TIME`).
    - ``system_prompts``, ``system_prompt_tokens``: put one of that many shared prefixes of
      that many tokens (default 1,000) before every prompt (a workload without block hashes).
    - ``client_timeout``: every request's :attr:`~headway.workload.RequestSpec.timeout` (seconds
      after its arrival at which its client aborts it, if unfinished).
    """

    num_requests: int | None = None
    arrivals: str | None = None
    rate: float | None = None
    burstiness: float | None = None
    seed: int = 0
    output_cv: float | None = None
    model: str | None = None
    tenants: TenantMix | str | None = None
    data_dir: str | Path | None = None
    format: str | None = None
    count_tokens: TokenCounter | None = None
    name: str | None = None
    think_time: float | None = None
    system_prompts: int | None = None
    system_prompt_tokens: int | None = None
    client_timeout: float | None = None

    def __post_init__(self) -> None:
        n = self.num_requests
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
                raise ValueError(f"num_requests must be a non-negative integer, got {n!r}")
            if n > MAX_NUM_REQUESTS:
                raise ValueError(f"num_requests must be at most {MAX_NUM_REQUESTS:,}, got {n!r}")
            object.__setattr__(self, "num_requests", int(n))  # a numpy integer becomes an int
        if self.arrivals is not None and self.arrivals not in ARRIVAL_KINDS:
            raise ValueError(f"arrivals must be one of {', '.join(ARRIVAL_KINDS)}, got {self.arrivals!r}")
        for what, value in (("rate", self.rate), ("burstiness", self.burstiness)):
            if value is not None and not (is_finite_real(value) and value > 0):
                raise ValueError(f"{what} must be a positive finite number, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        cv = self.output_cv
        if cv is not None and not (is_finite_real(cv) and cv >= 0):
            raise ValueError(f"output_cv must be a finite number >= 0, got {cv!r}")
        if isinstance(self.tenants, str) and self.tenants not in ("default", "none"):
            raise ValueError(f"tenants must be a TenantMix, 'default' or 'none', got {self.tenants!r}")
        tt = self.think_time
        if tt is not None and not (is_finite_real(tt) and tt >= 0):
            raise ValueError(f"think_time must be a finite number >= 0, got {tt!r}")
        ct = self.client_timeout
        if ct is not None and not (is_finite_real(ct) and ct > 0):
            # (0 would abort every request as it arrives: nothing left to compare)
            raise ValueError(f"client_timeout must be a finite number > 0, got {ct!r}")
        for what, count in (
            ("system_prompts", self.system_prompts),
            ("system_prompt_tokens", self.system_prompt_tokens),
        ):
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise ValueError(f"{what} must be an integer >= 1, got {count!r}")
        if self.system_prompt_tokens is not None and self.system_prompts is None:
            raise ValueError("system_prompt_tokens needs system_prompts (how many shared prefixes)")
        if self.format is not None and not is_format(self.format):
            raise ValueError(f"format must be one of {', '.join(available_formats())}, got {self.format!r}")

    def stream(self, role: int) -> np.random.SeedSequence:
        """An independent seed stream for one post-processing step."""
        return np.random.SeedSequence([self.seed, role])


_SELECT, _ARRIVE, _RESAMPLE, _TENANTS, _SYSTEM = 1, 2, 3, 4, 5
_SESSIONS_DATA = ("sharegpt", "sharegpt_all_turn_lengths.csv.gz")  # sharegpt-sessions' turn lengths
DEFAULT_SYSTEM_PROMPT_TOKENS = 1000
"""Length of each shared system prompt when only their number is given."""


# ----------------------------------------------------------------------- data dir
def find_data_dir(data_dir: str | Path | None = None) -> Path:
    """The shared data folder: ``data_dir``, else ``$HEADWAY_DATA_DIR``, else ``../shared/data``.

    ``../shared/data`` is looked for next to the current directory and next to the
    checkout this package lives in. Raises ``FileNotFoundError`` listing what was tried.
    """
    if data_dir is not None:
        candidates = [Path(data_dir)]
    elif os.environ.get(DATA_DIR_ENV):
        candidates = [Path(os.environ[DATA_DIR_ENV])]
    else:
        repo = Path(__file__).resolve().parents[3]
        candidates = [
            Path.cwd() / ".." / "shared" / "data",
            Path.cwd() / "shared" / "data",
            repo.parent / "shared" / "data",
        ]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"the data folder of the trace workloads was not found (tried {tried}): set {DATA_DIR_ENV} to the folder "
        "holding them (docs/workloads.md), or give data_dir= in Python"
    )


# ------------------------------------------------------------------- named sources
def _refuse_ignored(kind: str, o: LoadOptions, name: str, *, fixed: bool = False) -> None:
    """Raise ValueError naming ``rate`` or ``burstiness`` when arrivals of ``kind`` would ignore it.

    ``fixed``: the workload's arrivals cannot be changed (the ``burst`` workload).
    """
    if kind == "burst":
        instead = "workload 'default' (--workload default)" if fixed else "arrivals= (--arrivals) gamma or poisson"
        for what, flag, value in (("rate", "--rate", o.rate), ("burstiness", "--burstiness", o.burstiness)):
            if value is not None:
                raise ValueError(
                    f"workload {name!r} has burst arrivals (all at t = 0), which ignore {what}; "
                    f"got {what}={value!r} ({flag}); use {instead} for timed arrivals"
                )
    elif kind == "trace" and o.burstiness is not None:
        raise ValueError(
            f"arrivals='trace' replays the recorded gaps of workload {name!r}, which ignores burstiness; "
            f"got burstiness={o.burstiness!r} (--burstiness); use arrivals= (--arrivals) gamma"
        )
    elif kind == "poisson" and o.burstiness not in (None, 1, 1.0):
        raise ValueError(f"poisson arrivals have burstiness 1, got burstiness={o.burstiness!r}")


def _process(kind: str, rate: float, burstiness: float | None, default_burstiness: float) -> ArrivalProcess:
    """The generated arrival process of ``kind`` (not ``"trace"``) at ``rate``."""
    if kind == "burst":
        return BurstArrivals()
    if kind == "poisson":
        return PoissonArrivals(rate)
    return GammaArrivals(rate, burstiness or default_burstiness, vllm_placement=kind == "gamma-vllm")


def _synthetic(o: LoadOptions, *, burst: bool) -> Workload:
    kind = o.arrivals or ("burst" if burst else "gamma")
    if burst and kind != "burst":
        raise ValueError(f"workload 'burst' has burst arrivals; got arrivals={kind!r} (use 'default')")
    if kind == "trace":
        raise ValueError(
            "the synthetic workload has no recorded times; arrivals must be gamma, poisson, gamma-vllm or burst"
        )
    _refuse_ignored(kind, o, "burst" if burst else "default", fixed=burst)
    process = _process(kind, o.rate or DEFAULT_RATE, o.burstiness, DEFAULT_BURSTINESS)
    num = DEFAULT_NUM_REQUESTS if o.num_requests is None else o.num_requests
    return default_workload(
        num,
        o.seed,
        arrivals=process,
        tenants=_tenant_mix(o, synthetic=True),
        name="burst" if burst else "default",
    )


SESSIONS_RATE = 1.0
"""Default rate (conversations/s) at which ``sharegpt-sessions`` starts conversations."""
SESSIONS_MAX_MODEL_LEN = 8192
"""``sharegpt-sessions`` ends a conversation before a turn longer than this (Llama-3-8B's context)."""


def _sessions(o: LoadOptions) -> Workload:
    kind = o.arrivals or "poisson"
    if kind == "trace":
        raise ValueError(
            "sharegpt-sessions has no recorded times; arrivals must be gamma, poisson, gamma-vllm or burst"
        )
    _refuse_ignored(kind, o, "sharegpt-sessions")
    process = _process(kind, o.rate or SESSIONS_RATE, o.burstiness, 1.0)
    path = _data_path(o, *_SESSIONS_DATA)
    num = DEFAULT_NUM_REQUESTS if o.num_requests is None else o.num_requests
    think = DEFAULT_THINK_TIME if o.think_time is None else o.think_time
    # conversations in file order; about 3.5 turns each, so a few more than needed, else all of them
    for limit in (num + 10, None):
        convs = read_turn_lengths(path, limit=limit)
        if o.output_cv:  # before the turns are built: a turn's prompt holds the answers resampled
            convs = resample_answers(convs, o.output_cv, o.stream(_RESAMPLE))
        w = session_workload(
            convs, process, num_requests=num, think_time=think, max_model_len=SESSIONS_MAX_MODEL_LEN,
            seed=o.stream(_ARRIVE), name="sharegpt-sessions",
        )  # fmt: skip
        if len(w) >= num:
            break
    if len(w) < num:
        raise ValueError(f"workload 'sharegpt-sessions' has {len(w)} turns; cannot take num_requests={num}")
    if o.output_cv:
        w.meta["output_cv"] = float(o.output_cv)
    return w


def _data_path(o: LoadOptions, *parts: str) -> Path:
    """``parts`` in the shared data folder; FileNotFoundError naming the folder when it lacks them
    (a folder that is not the shared data, or holds only part of it)."""
    root = find_data_dir(o.data_dir)
    path = root.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            2,
            f"not in the data folder {root}; set {DATA_DIR_ENV} to the folder holding the shared data "
            "(docs/workloads.md), or give data_dir= in Python",
            str(path),
        )
    return path


def _data_file(*parts: str, fmt: str) -> _Source:
    """The built-in workload of the file (or folder) ``parts`` in the shared data folder, read as ``fmt``."""

    def load(o: LoadOptions) -> Workload:
        return read_file(_data_path(o, *parts), fmt, model=o.model, count_tokens=o.count_tokens)

    load.__doc__ = f"{'/'.join(parts)} in the shared data folder ({fmt} format)"
    return _Source(load, data=parts)


@dataclass(frozen=True, slots=True)
class _Source:
    load: Callable[[LoadOptions], Workload]
    synthetic: bool = False
    about: str = ""
    data: tuple[str, ...] = ()
    """The file or folder it reads, as parts of a path in the shared data folder (none: it reads no data)."""

    def description(self) -> str:
        return self.about or (self.load.__doc__ or "").strip()


_WORKLOADS: dict[str, _Source] = {
    "default": _Source(
        lambda o: _synthetic(o, burst=False),
        synthetic=True,
        about=f"synthetic, Azure-conv-shaped lengths, Gamma({DEFAULT_RATE:g} req/s, burstiness "
        f"{DEFAULT_BURSTINESS:g}) arrivals, 3 tenant tiers; needs no data",
    ),
    "burst": _Source(
        lambda o: _synthetic(o, burst=True), synthetic=True, about="the default's requests, all at t = 0 (as in PARS)"
    ),
    "azure-conv": _data_file("azure_llm_2023", "AzureLLMInferenceTrace_conv.csv", fmt="azure"),
    "azure-code": _data_file("azure_llm_2023", "AzureLLMInferenceTrace_code.csv", fmt="azure"),
    "vidur-conv": _data_file("vidur_traces", "splitwise_conv.csv", fmt="vidur"),
    "vidur-code": _data_file("vidur_traces", "splitwise_code.csv", fmt="vidur"),
    "arxiv": _data_file("vidur_traces", "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", fmt="vidur"),
    "sharegpt": _data_file("sharegpt", "sharegpt_first_turn.jsonl.gz", fmt="sharegpt"),
    "alpaca-eval": _data_file("alpaca_eval", fmt="alpaca-eval"),
    "sharegpt-sessions": _Source(
        _sessions,
        synthetic=True,
        about="ShareGPT's multi-turn conversations (turn lengths): turn k's prompt is the conversation so far, "
        f"sent an exponential think time (mean {DEFAULT_THINK_TIME:g} s) after the previous answer; conversations "
        f"start at {SESSIONS_RATE:g}/s (Poisson); prefix-cache block hashes; needs the shared data",
        data=_SESSIONS_DATA,
    ),
}


def available_workloads() -> list[str]:
    """Short names :func:`load_workload` accepts."""
    return sorted(_WORKLOADS)


def workload_data_path(name: str, data_dir: str | Path | None = None) -> Path | None:
    """The file or folder of the shared data folder (``data_dir``, found as :func:`find_data_dir` finds
    it) that the built-in workload ``name`` reads; None for one that reads no data (``default``,
    ``burst``). FileNotFoundError where it is not there; UnknownWorkloadError for a name not built in."""
    parts = _source(name).data
    return _data_path(LoadOptions(data_dir=data_dir), *parts) if parts else None


def workload_description(name: str) -> str:
    """One line on what the built-in workload ``name`` is (UnknownWorkloadError listing the names)."""
    return _source(name).description()


def _source(name: str) -> _Source:
    if name not in _WORKLOADS:
        raise UnknownWorkloadError(f"unknown workload {name!r}; valid names: {', '.join(available_workloads())}")
    return _WORKLOADS[name]


# ------------------------------------------------------------------ post-processing
def _select(w: Workload, o: LoadOptions, timed: bool) -> Workload:
    n = o.num_requests
    if n is None or (timed and n == len(w)):
        return w
    if timed:
        if n > len(w):
            raise ValueError(f"workload {w.name!r} has {len(w)} requests; cannot take num_requests={n}")
        return Workload(w.name, w.requests[:n], dict(w.meta))
    if not w.requests:
        raise ValueError(f"workload {w.name!r} has no requests to sample {n} from")
    rng = np.random.default_rng(o.stream(_SELECT))
    picks = rng.choice(len(w), size=n, replace=n > len(w)).tolist()
    seen: dict[str, int] = {}
    specs = []
    for k in picks:
        spec = w.requests[k]
        copies = seen.get(spec.request_id, 0)
        seen[spec.request_id] = copies + 1
        rid = spec.request_id if copies == 0 else f"{spec.request_id}#{copies}"
        specs.append(dataclasses.replace(spec, request_id=rid))
    more = {"sampled_with_replacement_from": len(w)} if n > len(w) else {}
    return Workload(w.name, tuple(specs), {**w.meta, "sampled": n, **more})


def _arrival_kind(o: LoadOptions, timed: bool) -> str:
    if o.arrivals is not None:
        return o.arrivals
    if o.burstiness is not None:
        return "gamma"
    if timed:
        return "trace"
    return "gamma" if o.rate is not None else "burst"


def _retime(w: Workload, o: LoadOptions, timed: bool) -> Workload:
    kind = _arrival_kind(o, timed)
    _refuse_ignored(kind, o, w.name)
    recorded = [s.arrival_time for s in w.requests]
    if kind == "trace":
        if not timed:
            raise ValueError(
                f"workload {w.name!r} has no recorded arrival times; "
                "use arrivals= (--arrivals) gamma, poisson, gamma-vllm or burst"
            )
        if o.rate is None:
            return w
        times = replay_arrivals(recorded, o.rate)
        meta = {**w.meta, "arrivals": f"trace scaled to {o.rate} req/s"}
    else:
        rate = o.rate
        if kind != "burst" and rate is None and timed and len(recorded) > 1 and recorded[-1] > recorded[0]:
            rate = (len(recorded) - 1) / (recorded[-1] - recorded[0])
        if kind != "burst" and rate is None:
            raise ValueError(f"arrivals={kind!r} needs a rate (rate=, --rate; requests/s) for workload {w.name!r}")
        process = _process(kind, rate or 1.0, o.burstiness, 1.0)
        times = process.sample(len(w), o.stream(_ARRIVE))
        meta = {**w.meta, **arrivals_meta(process)}
    specs = [dataclasses.replace(s, arrival_time=float(t)) for s, t in zip(w.requests, times.tolist(), strict=True)]
    return Workload.from_specs(w.name, specs, meta)


def _tenant_mix(o: LoadOptions, synthetic: bool) -> TenantMix | None:
    if isinstance(o.tenants, TenantMix):
        return o.tenants
    if o.tenants == "none":
        return None
    if o.tenants == "default" or synthetic:
        return DEFAULT_TENANT_MIX
    return None


# ---------------------------------------------------------------------- front door
def _options(options: dict[str, object]) -> LoadOptions:
    valid = [f.name for f in dataclasses.fields(LoadOptions)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"unknown workload option(s) {', '.join(unknown)}; valid options: {', '.join(valid)}")
    return LoadOptions(**options)  # type: ignore[arg-type]


def _looks_like_path(source: str) -> bool:
    return (
        os.sep in source
        or "/" in source
        or source.endswith((".csv", ".json", ".jsonl", ".gz"))
        or Path(source).exists()
    )


def _check_source_options(source: str, o: LoadOptions) -> None:
    """The options that apply to some workloads only, checked against ``source``."""
    if o.think_time is not None and source != "sharegpt-sessions":
        raise ValueError(
            f"option think_time={o.think_time!r} (--think-time) only applies to sharegpt-sessions, not {source!r}"
        )
    if o.tenants is not None and source == "sharegpt-sessions":  # (it was ignored)
        raise ValueError(
            f"option tenants={o.tenants!r} (--tenants) does not apply to sharegpt-sessions: each conversation is "
            "a tenant of its own (standard tier)"
        )
    if o.format is not None and source in _WORKLOADS:
        raise ValueError(
            f"option format={o.format!r} (--format) applies to a workload file, not the built-in {source!r}"
        )


def check_workload_options(source: str | os.PathLike[str], **options: object) -> None:
    """Raise what :func:`load_workload` would raise for ``options`` on ``source`` (a bad value, or an
    option that does not apply to it), without reading anything: for callers that check settings
    before a long run (a sweep's grid)."""
    _check_source_options(os.fspath(source), _options(options))


def load_workload(source: str | os.PathLike[str], **options: object) -> Workload:
    """Load a workload by short name (see :func:`available_workloads`) or from a file path
    (a ``str`` or a :class:`~pathlib.Path`).

    Names: ``default`` (synthetic Azure-conv-shaped, bursty, 3 tenants; needs no data),
    ``burst`` (the same requests, all at t = 0, as in PARS), and the shared data sets
    ``azure-conv``, ``azure-code``, ``vidur-conv``, ``vidur-code``, ``arxiv``,
    ``sharegpt``, ``alpaca-eval`` (found with :func:`find_data_dir`). A path is read by
    its content (CSV header or JSON keys), or by ``format=``; a folder is read as
    alpaca_eval. Options are the fields of :class:`LoadOptions` (``num_requests``,
    ``rate``, ``burstiness``, ``arrivals``, ``seed``, ``output_cv``, ``model``,
    ``tenants``, ...). Raises :class:`UnknownWorkloadError` listing the valid names.
    """
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"source must be a workload name or a file path, got {type(source).__name__} {source!r}")
    source = os.fspath(source)
    o = _options(options)
    entry = _WORKLOADS.get(source)
    if entry is None and not _looks_like_path(source):
        close = difflib.get_close_matches(source.lower().replace("_", "-"), available_workloads(), n=1)
        raise UnknownWorkloadError(
            f"unknown workload {source!r}; {f'did you mean {close[0]!r}? ' if close else ''}"
            f"valid names: {', '.join(available_workloads())} "
            f"(or a path to a trace/dataset file: {', '.join(available_formats())})"
        )
    _check_source_options(source, o)
    if entry is not None:
        w = entry.load(o)
        synthetic = entry.synthetic
        if not synthetic:
            w = Workload(source, w.requests, dict(w.meta))
    else:
        w = read_file(Path(source), o.format, model=o.model, count_tokens=o.count_tokens)
        synthetic = False
    if o.model is not None and w.meta.get("format") not in MODEL_FORMATS:
        raise ValueError(f"option model={o.model!r} (--model) only applies to alpaca_eval, not {source!r}")
    if not synthetic:
        timed = bool(w.meta.get("timed", False))
        w = _retime(_select(w, o, timed), o, timed)
        mix = _tenant_mix(o, synthetic=False)
        if mix is not None:
            w = assign_tenants(w, mix, o.stream(_TENANTS))
    if o.output_cv and w.meta.get("format") != "sessions":  # (sessions: resampled as they were built)
        w = resample_output_lengths(w, o.output_cv, o.stream(_RESAMPLE))
    if o.system_prompts is not None:
        tokens = DEFAULT_SYSTEM_PROMPT_TOKENS if o.system_prompt_tokens is None else o.system_prompt_tokens
        w = with_system_prompts(w, o.system_prompts, tokens, o.stream(_SYSTEM))
    if o.client_timeout is not None:
        ct = float(o.client_timeout)
        w = Workload(w.name, tuple(dataclasses.replace(s, timeout=ct) for s in w.requests), dict(w.meta))
    if o.name is not None:
        w = Workload(o.name, w.requests, dict(w.meta))
    return w
