"""Learning online from the served model: refit a ranking head per model on its latest completions.

The gateway and the plugin see each finished request's prompt and true output length. Feeding them to
:meth:`OnlineLearner.observe` (``observe(prompt, output_tokens, model)``) costs a queue append: a
background thread embeds the prompt (the offline predictor's own features), keeps the last ``window``
observations of that model and, every ``refit_every`` new ones, refits a ridge head on
``[offline score, prompt size, features]`` against rank-normal targets: the offline score and the
prompt's size are penalized lightly (``prior_alpha``), so the head keeps the offline ranking and re-weighs
it against the prompt's size from a few dozen completions, while the features (``alpha``) learn a
residual on top more slowly. :meth:`OnlineLearner.score`
then ranks a model's prompts with its head (the offline score alone until ``min_observations``). Nothing
on the scoring path waits for a refit: heads are swapped in whole.

The windows are stored in an :class:`ObservationStore`: in memory (:class:`MemoryStore`, saved to and
loaded from a file across restarts: ``state_path`` saves it within ``save_interval_s`` of each
observation and at :meth:`close`) or in Redis (:class:`RedisStore`), where gateway replicas share one
window per model, each refitting from it.
Prompts are not stored, only their features and lengths. A store records which predictor's features it
holds (the predictor's ``fingerprint``); a learner around another predictor refuses it, since its rows
would be another model's features.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from headway._files import write_atomic
from headway._help import unwritable
from headway.predict.head import RidgeHead, extra_features, fit_ridge, rank_targets

__all__ = ["MemoryStore", "ObservationStore", "OnlineConfig", "OnlineLearner", "RedisStore"]

log = logging.getLogger("headway.predict.online")

_F64 = npt.NDArray[np.float64]
_LIGHT_COLUMNS = 4
"""Leading row columns penalized with ``prior_alpha``: the offline score and the three prompt-size ones."""
DEFAULT_MODEL = ""
"""Window key of observations that name no model."""


@dataclass(frozen=True)
class OnlineConfig:
    """``window``: observations kept per model; ``min_observations``: before a model's head is used;
    ``refit_every``: new observations between refits; ``alpha``: ridge penalty on the offline
    predictor's features; ``prior_alpha``: on the offline score and the prompt-size columns;
    ``row_cache``: features of the latest prompts scored, kept so that observing one when it finishes
    does not embed it again (0: none); ``max_models``: models learned at most (the store's, counted
    over every replica sharing it): a finished request of another is not learned from, since the
    gateway takes a request's ``model`` from its client and a backend that serves any name would
    otherwise let clients grow the windows without bound. The penalties were chosen on the
    arena_hard_v2 o3-mini replay and four alpaca_eval models (``benchmarks/predictor_online_replay.py``),
    not on Sky-T1-32B."""

    window: int = 500
    min_observations: int = 25
    refit_every: int = 25
    alpha: float = 1000.0
    prior_alpha: float = 10.0
    row_cache: int = 2048
    max_models: int = 64

    def __post_init__(self) -> None:
        for name in ("window", "min_observations", "refit_every", "row_cache", "max_models"):
            value = getattr(self, name)
            least = 0 if name == "row_cache" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"OnlineConfig.{name} must be an integer >= {least}, got {value!r}")
        if self.min_observations > self.window:
            raise ValueError(f"OnlineConfig.min_observations ({self.min_observations}) exceeds window ({self.window})")
        for name in ("alpha", "prior_alpha"):
            if not getattr(self, name) > 0:
                raise ValueError(f"OnlineConfig.{name} must be > 0, got {getattr(self, name)!r}")


class ObservationStore(Protocol):
    """Per-model windows of observation rows (``[offline score, prompt size..., features..., length]``)."""

    def append(self, model: str, row: _F64, window: int) -> None: ...

    def rows(self, model: str) -> _F64: ...

    def models(self) -> list[str]: ...

    def claim(self, fingerprint: str) -> str | None:
        """The fingerprint of the predictor whose features the windows hold: ``fingerprint``, recorded,
        when the store holds no window yet; else the one recorded (None: not recorded)."""
        ...


class MemoryStore:
    """Windows in this process; :meth:`save` / :meth:`load` keep them across restarts."""

    def __init__(self) -> None:
        self._rows: dict[str, deque[_F64]] = {}
        self._lock = threading.Lock()
        self._fingerprint: str | None = None

    def claim(self, fingerprint: str) -> str | None:
        with self._lock:
            if not self._rows:
                self._fingerprint = fingerprint
            return self._fingerprint

    def append(self, model: str, row: _F64, window: int) -> None:
        with self._lock:
            q = self._rows.get(model)
            if q is None or q.maxlen != window:
                q = self._rows[model] = deque(q or (), maxlen=window)
            q.append(np.asarray(row, dtype=np.float64))

    def rows(self, model: str) -> _F64:
        with self._lock:
            q = list(self._rows.get(model, ()))
        return np.vstack(q) if q else np.zeros((0, 0))

    def models(self) -> list[str]:
        with self._lock:
            return sorted(self._rows)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        models = self.models()
        arrays = {f"m{i}": self.rows(m) for i, m in enumerate(models)}
        names = np.frombuffer(json.dumps(models).encode(), dtype=np.uint8)
        meta = np.frombuffer(json.dumps({"predictor": self._fingerprint}).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        savez: Any = np.savez  # (features do not compress: a window is ~1.5 MB either way, 40x faster so)
        savez(buf, models=names, meta=meta, **arrays)
        return write_atomic(p, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path, window: int) -> MemoryStore:
        """The windows saved at ``path`` (each cut to its last ``window`` rows); ValueError naming the
        file when it is not one."""
        store = cls()
        try:
            with np.load(Path(path), allow_pickle=False) as z:
                models = json.loads(bytes(z["models"]).decode())
                for i, model in enumerate(models):
                    for row in z[f"m{i}"][-window:]:
                        store.append(str(model), row, window)
                if "meta" in z.files:  # (not in files saved before fingerprints were recorded)
                    fingerprint = json.loads(bytes(z["meta"]).decode()).get("predictor")
                    store._fingerprint = None if fingerprint is None else str(fingerprint)
        except (OSError, KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path}: not a saved online-learning state ({exc})") from None
        return store


class RedisStore:
    """Windows in Redis lists ``{prefix}:{model}`` (float64 rows), shared by gateway replicas."""

    def __init__(self, client: Any, prefix: str = "headway:online") -> None:
        self._client = client
        self._prefix = prefix

    def _key(self, model: str) -> str:
        return f"{self._prefix}:{model}"

    def append(self, model: str, row: _F64, window: int) -> None:
        pipe = self._client.pipeline()
        pipe.rpush(self._key(model), np.asarray(row, dtype=np.float64).tobytes())
        pipe.ltrim(self._key(model), -window, -1)
        pipe.sadd(f"{self._prefix}:models", model)
        pipe.execute()

    def rows(self, model: str) -> _F64:
        raw = self._client.lrange(self._key(model), 0, -1)
        return np.vstack([np.frombuffer(r, dtype=np.float64) for r in raw]) if raw else np.zeros((0, 0))

    def models(self) -> list[str]:
        return sorted(
            m.decode() if isinstance(m, bytes) else str(m) for m in self._client.smembers(f"{self._prefix}:models")
        )

    def claim(self, fingerprint: str) -> str | None:
        key = f"{self._prefix}:predictor"
        if not self.models():
            self._client.set(key, fingerprint)
        found = self._client.get(key)
        return found.decode() if isinstance(found, bytes) else None if found is None else str(found)


class OnlineLearner:
    """Per-model online refits around an offline predictor.

    ``embed(prompts) -> (n, d)`` are the offline predictor's features and ``prior(embeddings) -> (n,)``
    its scores (e.g. :class:`~headway.predict.shipped.ShippedPredictor`'s ``embed`` and
    ``score_embeddings``). With ``background=False`` observations are processed inside
    :meth:`observe` (deterministic; for replays and tests).

    ``state_path``: a file the windows are loaded from when it exists and saved to (atomically) once
    new observations are ``save_interval_s`` old (by the background thread, idle or not; inline, at the
    next observation) and at :meth:`close`, so a restart resumes with every model's head and a process
    killed without a shutdown loses at most the last ``save_interval_s`` of observations.
    ``fingerprint`` names the predictor whose features the rows are (:attr:`ShippedPredictor.fingerprint
    <headway.predict.shipped.ShippedPredictor.fingerprint>`): a store or file that holds another
    predictor's rows is refused with a ValueError naming it, where it would otherwise be refitted on
    features that mean something else.
    """

    def __init__(
        self,
        embed: Callable[[Sequence[str]], npt.NDArray[Any]],
        prior: Callable[[npt.NDArray[Any]], _F64],
        config: OnlineConfig | None = None,
        *,
        store: ObservationStore | None = None,
        background: bool = True,
        state_path: str | Path | None = None,
        save_interval_s: float = 1.0,
        fingerprint: str | None = None,
    ) -> None:
        if not save_interval_s >= 0:
            raise ValueError(f"OnlineLearner: save_interval_s must be >= 0, got {save_interval_s!r}")
        self.config = config or OnlineConfig()
        self._save_interval = save_interval_s
        self._unsaved_since: float | None = None  # monotonic time of the oldest observation not saved
        self._embed = embed
        self._prior = prior
        self.state_path = Path(state_path) if state_path is not None else None
        where = "the online-learning store"
        if self.state_path is not None:
            if store is not None:
                raise ValueError("OnlineLearner: give a state_path or a store, not both (Redis keeps its own state)")
            where = str(self.state_path)
            if self.state_path.exists():
                store = MemoryStore.load(self.state_path, self.config.window)
            elif (problem := unwritable(self.state_path.parent)) is not None:
                raise ValueError(
                    f"{self.state_path}: cannot save the online-learning state there ({problem[0]} {problem[1]})"
                )
        self.store: ObservationStore = store if store is not None else MemoryStore()
        self._check_store(fingerprint, where)
        self._heads: dict[str, RidgeHead] = {}
        self._since_refit: dict[str, int] = {}
        self._learned: set[str] = set()
        """Models with a window (as the store last said; see :meth:`_learns`)."""
        self._over_warned = False
        self._row_cache: OrderedDict[bytes, _F64] = OrderedDict()
        self._row_lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, int, str] | None] | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = queue.Queue(maxsize=10_000)
            self._thread = threading.Thread(target=self._work, name="headway-online", daemon=True)
            self._thread.start()
        for model in self.store.models():
            self._refit(model)

    def _check_store(self, fingerprint: str | None, where: str) -> None:
        """Refuse windows of another predictor's features: by the recorded fingerprint, else (none
        recorded, or none given) by the width of a row."""
        recorded = self.store.claim(fingerprint) if fingerprint is not None else None
        if recorded is not None and recorded != fingerprint:
            raise ValueError(
                f"{where}: holds the features of another predictor ({recorded}), not of this one ({fingerprint}); "
                "remove it or name another, to start learning afresh"
            )
        models = self.store.models()
        if recorded is None and models:
            width = self._compute_rows([""]).shape[1] + 1
            found = self.store.rows(models[0]).shape[1]
            if found != width:
                raise ValueError(
                    f"{where}: its rows have {found} columns, this predictor's {width}: they were made with another "
                    "predictor; remove it or name another, to start learning afresh"
                )

    @classmethod
    def around(
        cls,
        predictor: Any,
        config: OnlineConfig | None = None,
        *,
        store: ObservationStore | None = None,
        background: bool = True,
        state_path: str | Path | None = None,
        save_interval_s: float = 1.0,
    ) -> OnlineLearner:
        """A learner refitting on ``predictor``'s features: one with ``embed(prompts)`` and
        ``score_embeddings(embeddings)``, as :class:`~headway.predict.shipped.ShippedPredictor` (what
        ``"default"`` loads when nothing is trained); ValueError naming its type otherwise. Its
        ``fingerprint``, where it has one, guards the store."""
        embed = getattr(predictor, "embed", None)
        prior = getattr(predictor, "score_embeddings", None)
        if not callable(embed) or not callable(prior):
            what = (
                "a trained checkpoint (its scores come from the whole network: no fixed features to refit a head on)"
                if type(predictor).__name__ == "Scorer"
                else type(predictor).__name__
            )
            raise ValueError(
                f"online learning needs a predictor with embed() and score_embeddings() (the shipped one: "
                f"scorer 'default' with no predictor trained into the cache), got {what}"
            )
        fingerprint = getattr(predictor, "fingerprint", None)
        return cls(
            embed,
            prior,
            config,
            store=store,
            background=background,
            state_path=state_path,
            save_interval_s=save_interval_s,
            fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        )

    # ------------------------------------------------------------------ feeding
    def observe(self, prompt: str, output_tokens: int, model: str | None = None) -> None:
        """Record one finished request (its prompt and true output length). Never blocks: when the
        background queue is full the observation is dropped."""
        if isinstance(output_tokens, bool) or not isinstance(output_tokens, int) or output_tokens < 1:
            raise ValueError(f"output_tokens must be a positive integer, got {output_tokens!r}")
        item = (prompt, output_tokens, model or DEFAULT_MODEL)
        if self._queue is None:
            self._process([item])
            return
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(item)

    def flush(self) -> None:
        """Wait until every queued observation is processed (for tests and shutdown)."""
        if self._queue is not None:
            self._queue.join()

    def close(self, *, save: bool = True) -> None:
        """Stop the background thread once the queued observations are processed, then (``save``)
        save the windows to ``state_path``, if any."""
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5.0)
            self._queue = None
        if save and self._unsaved_since is not None:
            self._save_state()

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        self._unsaved_since = None
        try:
            self.save(self.state_path)
        except OSError:  # a full disk or a bad path: the learning goes on in memory
            log.exception("online learning: could not save the state to %s", self.state_path)

    def _save_due_in(self) -> float | None:
        """Seconds until unsaved observations are due to be saved (None: nothing to save)."""
        if self.state_path is None or self._unsaved_since is None:
            return None
        return max(0.0, self._unsaved_since + self._save_interval - time.monotonic())

    def _work(self) -> None:
        assert self._queue is not None
        q = self._queue
        while True:
            due = self._save_due_in()
            if due == 0.0:
                self._save_state()
                continue
            try:
                item = q.get(timeout=due)
            except queue.Empty:  # idle: the unsaved observations are due
                continue
            batch = [item]
            while item is not None and not q.empty() and len(batch) < 64:
                item = q.get_nowait()
                batch.append(item)
            stop = any(b is None for b in batch)
            items = [b for b in batch if b is not None]
            try:
                self._process(items)
            except Exception:  # e.g. Redis unreachable: these observations are lost, the thread goes on
                log.exception("online learning: %d observations dropped", len(items))
            finally:
                for _ in batch:
                    q.task_done()
            if stop:
                return

    def _rows_for(self, prompts: Sequence[str]) -> _F64:
        """``[offline score, prompt size..., features...]`` per prompt; the latest ``row_cache`` are
        kept (scored at arrival, observed at the end: embedded once)."""
        if not self.config.row_cache:
            return self._compute_rows(prompts)
        keys = [hashlib.blake2b(p.encode(), digest_size=16).digest() for p in prompts]
        with self._row_lock:
            rows: list[_F64 | None] = [self._row_cache.get(k) for k in keys]
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            fresh = self._compute_rows([prompts[i] for i in missing])
            with self._row_lock:
                for i, row in zip(missing, fresh, strict=True):
                    rows[i] = self._row_cache[keys[i]] = row
                while len(self._row_cache) > self.config.row_cache:
                    self._row_cache.popitem(last=False)
        return np.vstack([row for row in rows if row is not None])  # all of them by now

    def _compute_rows(self, prompts: Sequence[str]) -> _F64:
        emb = np.asarray(self._embed(list(prompts)), dtype=np.float64)
        prior = np.asarray(self._prior(emb), dtype=np.float64).reshape(-1, 1)
        return np.hstack([prior, extra_features(prompts), emb])

    def _learns(self, model: str) -> bool:
        """Whether observations of ``model`` are kept: it has a window, or fewer than ``max_models``
        models have (another replica's count through a shared store)."""
        if model in self._learned:
            return True
        self._learned.update(self.store.models())
        if model in self._learned:
            return True
        if len(self._learned) < self.config.max_models:
            self._learned.add(model)
            return True
        if not self._over_warned:
            self._over_warned = True
            log.warning("online learning: %d models learned already (max_models): requests of another model, "
                        "%.80r, and of any other new one, are not learned from", len(self._learned), model)  # fmt: skip
        return False

    def _process(self, items: Sequence[tuple[str, int, str]]) -> None:
        items = [item for item in items if self._learns(item[2])]  # (before the embedding's cost)
        if not items:
            return
        rows = self._rows_for([p for p, _, _ in items])
        for row, (_, length, model) in zip(rows, items, strict=True):
            self.store.append(model, np.append(row, float(length)), self.config.window)
            self._since_refit[model] = self._since_refit.get(model, 0) + 1
            if self._since_refit[model] >= self.config.refit_every or model not in self._heads:
                self._refit(model)
        if self._unsaved_since is None:
            self._unsaved_since = time.monotonic()
        if self._queue is None and self._save_due_in() == 0.0:  # inline: no thread to save later
            self._save_state()

    def _refit(self, model: str) -> None:
        data = self.store.rows(model)
        self._since_refit[model] = 0
        if len(data) < self.config.min_observations:
            return
        x, y = data[:, :-1], data[:, -1]
        penalty = np.full(x.shape[1], self.config.alpha)
        penalty[:_LIGHT_COLUMNS] = self.config.prior_alpha
        self._heads[model] = fit_ridge(x, rank_targets(y), kind="text", alpha=self.config.alpha, column_alpha=penalty)

    # ------------------------------------------------------------------ scoring
    def observed(self, model: str | None = None) -> int:
        return len(self.store.rows(model or DEFAULT_MODEL))

    def observed_by_model(self) -> dict[str, int]:
        """Observations in each model's window (``"(no model)"`` for those that named none): what a
        restart resumed, as the gateway and the plugin report it."""
        return {m or "(no model)": self.observed(m) for m in self.store.models()}

    def resumed_line(self, state: object) -> str:
        """The line the gateway and the plugin log at start for the state file ``state``: the
        completions resumed from it per model, or that it held none yet (a first start)."""
        seen = self.observed_by_model()
        if not any(seen.values()):
            return f"online learning state {state}: nothing saved there yet, learning from the first completion"
        done = (f"{n} completion{'' if n == 1 else 's'} of {m}" for m, n in seen.items())
        return f"online learning state {state}: resumed " + ", ".join(done)

    def fitted(self, model: str | None = None) -> bool:
        """Whether ``model`` has a head of its own yet (else :meth:`score` gives the offline scores)."""
        return (model or DEFAULT_MODEL) in self._heads

    def score(self, prompts: Sequence[str], model: str | None = None) -> _F64:
        """Scores for ``prompts`` served by ``model``: its online head's once it has one, else the
        offline predictor's."""
        rows = self._rows_for(prompts)
        head = self._heads.get(model or DEFAULT_MODEL)
        if head is None:
            return rows[:, 0].copy()
        return head.score(rows)

    def save(self, path: str | Path) -> Path:
        """Save the windows (a :class:`MemoryStore`'s) so a restart resumes where this one stopped."""
        if not isinstance(self.store, MemoryStore):
            raise TypeError("save(): only an in-memory store is saved to a file; Redis keeps its own state")
        return self.store.save(path)
