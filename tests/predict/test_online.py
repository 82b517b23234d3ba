"""Online learning: per-model refits over a window, the offline score until then, saved state."""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from headway.predict.online import MemoryStore, OnlineConfig, OnlineLearner


def _embed(prompts: Sequence[str]) -> np.ndarray:
    """Four deterministic pseudo-features per prompt (from its CRC); feature 0 drives the length."""
    rows = [np.random.default_rng(zlib.crc32(p.encode())).normal(size=4) for p in prompts]
    return np.array(rows).reshape(len(prompts), 4)


def _prior(emb: np.ndarray) -> np.ndarray:
    return -emb[:, 0]  # an offline predictor that ranks this model backwards


def _length(prompt: str) -> int:
    return int(np.exp(3 + _embed([prompt])[0, 0]) + 1)


PROMPTS = [f"prompt number {i}" for i in range(400)]


def test_before_min_observations_the_offline_score_is_used_then_the_model_is_learned() -> None:
    cfg = OnlineConfig(window=300, min_observations=30, refit_every=10, alpha=1.0)
    learner = OnlineLearner(_embed, _prior, cfg, background=False)
    later = PROMPTS[300:]
    truth = [_length(p) for p in later]
    for p in PROMPTS[:29]:
        learner.observe(p, _length(p), "m")
    assert np.array_equal(learner.score(later, "m"), _prior(_embed(later)))
    assert not learner.fitted("m")
    learner.observe(PROMPTS[29], _length(PROMPTS[29]), "m")
    assert learner.fitted("m") and not learner.fitted("other")
    for p in PROMPTS[30:200]:
        learner.observe(p, _length(p), "m")
    assert learner.observed("m") == 200
    assert stats.kendalltau(learner.score(later, "m"), truth).statistic > 0.9
    # another model has seen nothing: still the offline ranking
    assert np.array_equal(learner.score(later, "other"), _prior(_embed(later)))


def test_a_light_prior_penalty_keeps_a_good_offline_ranking_from_few_observations() -> None:
    """With the features penalized hard, the head leans on the offline score (here a right one, with
    noise) and the prompt size; with one penalty for all it is shrunk like every feature."""

    def prior(emb: np.ndarray) -> np.ndarray:
        return emb[:, 0] + 0.3 * emb[:, 1]

    later = PROMPTS[300:]
    truth = [_length(p) for p in later]
    taus = {}
    for prior_alpha in (1.0, 1000.0):
        cfg = OnlineConfig(window=100, min_observations=30, refit_every=10, alpha=1000.0, prior_alpha=prior_alpha)
        learner = OnlineLearner(_embed, prior, cfg, background=False)
        for p in PROMPTS[:30]:
            learner.observe(p, _length(p), "m")
        head = learner._heads["m"]
        taus[prior_alpha] = (abs(head.weights[0]), stats.kendalltau(learner.score(later, "m"), truth).statistic)
    assert taus[1.0][0] > 5 * taus[1000.0][0]
    assert taus[1.0][1] > 0.8


def test_the_window_keeps_the_latest_observations() -> None:
    learner = OnlineLearner(_embed, _prior, OnlineConfig(window=50, min_observations=5), background=False)
    for p in PROMPTS[:120]:
        learner.observe(p, _length(p), "m")
    rows = learner.store.rows("m")
    assert len(rows) == 50
    assert rows[-1, -1] == _length(PROMPTS[119]) and rows[0, -1] == _length(PROMPTS[70])


def test_background_learning_matches_inline_learning() -> None:
    cfg = OnlineConfig(window=200, min_observations=20, refit_every=20, alpha=1.0)
    inline = OnlineLearner(_embed, _prior, cfg, background=False)
    threaded = OnlineLearner(_embed, _prior, cfg)
    for p in PROMPTS[:100]:
        inline.observe(p, _length(p), "m")
        threaded.observe(p, _length(p), "m")
    threaded.flush()
    threaded.close()
    assert np.allclose(inline.score(PROMPTS[300:], "m"), threaded.score(PROMPTS[300:], "m"))


def test_state_survives_a_restart(tmp_path: Path) -> None:
    cfg = OnlineConfig(window=100, min_observations=10, refit_every=10, alpha=1.0)
    learner = OnlineLearner(_embed, _prior, cfg, background=False)
    for p in PROMPTS[:60]:
        learner.observe(p, _length(p), "m")
    path = learner.save(tmp_path / "online.npz")
    again = OnlineLearner(_embed, _prior, cfg, store=MemoryStore.load(path, cfg.window), background=False)
    assert again.observed("m") == 60
    assert np.allclose(again.score(PROMPTS[300:], "m"), learner.score(PROMPTS[300:], "m"))
    with pytest.raises(ValueError, match="not a saved online-learning state"):
        MemoryStore.load(tmp_path / "missing.npz", 10)


def test_a_state_path_is_saved_at_close_and_resumed(tmp_path: Path) -> None:
    cfg = OnlineConfig(window=100, min_observations=10, refit_every=10, alpha=1.0)
    path = tmp_path / "state" / "online.npz"  # its folder is made at the first save
    learner = OnlineLearner(
        _embed, _prior, cfg, background=False, state_path=path, save_interval_s=3600, fingerprint="pack-a"
    )
    for p in PROMPTS[:25]:
        learner.observe(p, _length(p), "m")
    assert not path.exists()  # not due yet
    learner.close()
    assert MemoryStore.load(path, 100).rows("m").shape[0] == 25
    again = OnlineLearner(_embed, _prior, cfg, background=False, state_path=path, fingerprint="pack-a")
    assert again.observed("m") == 25 and again.fitted("m")
    # refitted at start on all 25 (the first learner's head is from 20)
    every = OnlineLearner(_embed, _prior, dataclasses.replace(cfg, refit_every=1), background=False)
    for p in PROMPTS[:25]:
        every.observe(p, _length(p), "m")
    assert np.allclose(again.score(PROMPTS[300:], "m"), every.score(PROMPTS[300:], "m"))
    with pytest.raises(ValueError, match="save_interval_s must be >= 0, got -1"):
        OnlineLearner(_embed, _prior, state_path=path, save_interval_s=-1)


def test_observations_are_saved_once_due(tmp_path: Path) -> None:
    """Inline, at the observation that finds them due; in the background, also while idle: a process
    killed without a shutdown (vLLM's default --shutdown-timeout 0) keeps what was saved."""
    cfg = OnlineConfig(window=100, min_observations=10, refit_every=10, alpha=1.0)
    path = tmp_path / "inline.npz"
    inline = OnlineLearner(_embed, _prior, cfg, background=False, state_path=path, save_interval_s=0)
    for n, p in enumerate(PROMPTS[:3], 1):
        inline.observe(p, _length(p), "m")
        assert MemoryStore.load(path, 100).rows("m").shape[0] == n
    path = tmp_path / "background.npz"
    threaded = OnlineLearner(_embed, _prior, cfg, state_path=path, save_interval_s=0.05)
    for p in PROMPTS[:33]:
        threaded.observe(p, _length(p), "m")
    threaded.flush()  # processed; then saved by the idle thread, with no close
    deadline = time.monotonic() + 10
    while not (path.exists() and MemoryStore.load(path, 100).rows("m").shape[0] == 33):
        assert time.monotonic() < deadline, "the idle learner did not save its observations"
        time.sleep(0.02)
    threaded.close()
    assert OnlineLearner(_embed, _prior, cfg, background=False, state_path=path).observed("m") == 33


def test_a_state_of_another_predictor_is_refused(tmp_path: Path) -> None:
    cfg = OnlineConfig(window=100, min_observations=10, refit_every=10, alpha=1.0)
    path = tmp_path / "online.npz"
    learner = OnlineLearner(_embed, _prior, cfg, background=False, state_path=path, fingerprint="pack-a")
    for p in PROMPTS[:10]:
        learner.observe(p, _length(p), "m")
    learner.close()
    with pytest.raises(ValueError, match=f"^{path}: holds the features of another predictor \\(pack-a\\), not of this"):
        OnlineLearner(_embed, _prior, cfg, background=False, state_path=path, fingerprint="pack-b")

    def wider(prompts: Sequence[str]) -> np.ndarray:
        return np.hstack([_embed(prompts), _embed(prompts)])

    # a file without a fingerprint (saved before they were recorded, or by a learner without one) is
    # checked by the width of its rows
    bare = OnlineLearner(_embed, _prior, cfg, background=False)
    for p in PROMPTS[:10]:
        bare.observe(p, _length(p), "m")
    old = bare.save(tmp_path / "bare.npz")
    with pytest.raises(ValueError, match="its rows have 9 columns, this predictor's 13"):
        OnlineLearner(wider, lambda e: e[:, 0], cfg, background=False, state_path=old, fingerprint="pack-a")
    assert OnlineLearner(_embed, _prior, cfg, background=False, state_path=old, fingerprint="pack-a").fitted("m")


def test_a_state_path_that_cannot_be_written_or_read_is_refused(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(ValueError, match="cannot save the online-learning state there"):
        OnlineLearner(_embed, _prior, background=False, state_path=blocked / "online.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=f"^{garbage}: not a saved online-learning state"):
        OnlineLearner(_embed, _prior, background=False, state_path=garbage)
    with pytest.raises(ValueError, match="a state_path or a store, not both"):
        OnlineLearner(_embed, _prior, store=MemoryStore(), background=False, state_path=garbage)


def test_a_failed_save_is_logged_and_learning_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = OnlineConfig(window=100, min_observations=5, refit_every=5, alpha=1.0)
    folder = tmp_path / "state"
    learner = OnlineLearner(_embed, _prior, cfg, background=False, state_path=folder / "online.npz", save_interval_s=0)
    folder.write_text("the folder became a file")  # every save fails from here on
    for p in PROMPTS[:5]:
        learner.observe(p, _length(p), "m")
    assert learner.fitted("m") and "could not save the state to" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window must be an integer >= 1, got 0"),
        ({"window": 10, "min_observations": 11}, "min_observations \\(11\\) exceeds window \\(10\\)"),
        ({"alpha": -1.0}, "alpha must be > 0, got -1.0"),
        ({"prior_alpha": 0.0}, "prior_alpha must be > 0, got 0.0"),
        ({"row_cache": -1}, "row_cache must be an integer >= 0, got -1"),
    ],
)
def test_config_names_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OnlineConfig(**kwargs)  # type: ignore[arg-type]


def test_observe_rejects_a_bad_length() -> None:
    learner = OnlineLearner(_embed, _prior, background=False)
    with pytest.raises(ValueError, match="positive integer, got 0"):
        learner.observe("p", 0)


@pytest.mark.redis
def test_replicas_share_windows_through_redis(tmp_path: Path) -> None:
    import shutil
    import socket
    import subprocess
    import time

    redis = pytest.importorskip("redis")
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not found")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", ""]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        from headway.predict.online import RedisStore

        cfg = OnlineConfig(window=40, min_observations=10, refit_every=5, alpha=1.0)
        one = OnlineLearner(_embed, _prior, cfg, store=RedisStore(client, "t"), background=False)
        for p in PROMPTS[:30]:
            one.observe(p, _length(p), "m")
        two = OnlineLearner(_embed, _prior, cfg, store=RedisStore(client, "t"), background=False)
        for p in PROMPTS[30:60]:  # a second replica adds to the same window
            two.observe(p, _length(p), "m")
        late = OnlineLearner(_embed, _prior, cfg, store=RedisStore(client, "t"), background=False)
        assert late.observed("m") == 40  # the shared window, cut to 40
        assert late.store.models() == ["m"]
        mem = OnlineLearner(_embed, _prior, cfg, background=False)
        for p in PROMPTS[20:60]:
            mem.observe(p, _length(p), "m")
        assert np.allclose(late.score(PROMPTS[300:], "m"), mem.score(PROMPTS[300:], "m"))
        # the windows record the predictor whose features they hold (none was named above)
        def on_redis(prefix: str, fingerprint: str) -> OnlineLearner:
            store = RedisStore(client, prefix)
            return OnlineLearner(_embed, _prior, cfg, store=store, background=False, fingerprint=fingerprint)

        on_redis("t", "pack-a")  # windows without a recorded predictor: checked by their width
        on_redis("f", "pack-a").observe(PROMPTS[0], 5, "m")
        on_redis("f", "pack-a")
        with pytest.raises(ValueError, match=r"another predictor \(pack-a\), not of this one \(pack-b\)"):
            on_redis("f", "pack-b")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class _Featured:
    """An offline predictor as the shipped one looks to the learner: embed and score_embeddings."""

    embed = staticmethod(_embed)
    score_embeddings = staticmethod(_prior)


def test_a_learner_around_a_predictor_uses_its_features_and_scores() -> None:
    learner = OnlineLearner.around(_Featured(), OnlineConfig(min_observations=5), background=False)
    assert np.array_equal(learner.score(PROMPTS[:10], "m"), _prior(_embed(PROMPTS[:10])))
    with pytest.raises(ValueError, match=r"^online learning needs .*embed\(\).*got a trained checkpoint"):
        OnlineLearner.around(type("Scorer", (), {"score": lambda self, p: p})())
    with pytest.raises(ValueError, match=r"got Other$"):
        OnlineLearner.around(type("Other", (), {})())


class _FlakyStore(MemoryStore):
    """A store whose first append fails (a Redis that was unreachable for a moment)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def append(self, model: str, row: np.ndarray, window: int) -> None:
        if not self.failed:
            self.failed = True
            raise ConnectionError("store unreachable")
        super().append(model, row, window)


def test_a_failing_store_loses_a_batch_not_the_learning_thread(caplog: pytest.LogCaptureFixture) -> None:
    learner = OnlineLearner(_embed, _prior, store=_FlakyStore())
    learner.observe(PROMPTS[0], 5, "m")
    learner.flush()
    assert learner.observed("m") == 0 and "online learning: 1 observations dropped" in caplog.text
    learner.observe(PROMPTS[1], 7, "m")
    learner.flush()
    assert learner.observed("m") == 1
    learner.close()


def test_a_prompt_scored_then_observed_is_embedded_once() -> None:
    embedded: list[str] = []

    def counting(prompts: Sequence[str]) -> np.ndarray:
        embedded.extend(prompts)
        return _embed(prompts)

    cached = OnlineLearner(counting, _prior, OnlineConfig(min_observations=5, row_cache=8), background=False)
    first = cached.score(PROMPTS[:4], "m")
    for p in PROMPTS[:4]:
        cached.observe(p, _length(p), "m")
    assert embedded == PROMPTS[:4]
    plain = OnlineLearner(_embed, _prior, OnlineConfig(min_observations=5, row_cache=0), background=False)
    for p in PROMPTS[:4]:
        plain.observe(p, _length(p), "m")
    assert np.array_equal(cached.store.rows("m"), plain.store.rows("m"))  # the same rows as embedding again
    assert np.array_equal(first, plain.score(PROMPTS[:4], "m"))
    cached.score(PROMPTS[4:14], "m")  # ten more: only the latest 8 are kept
    embedded.clear()
    cached.score(PROMPTS[:1] + PROMPTS[13:14], "m")
    assert embedded == PROMPTS[:1]


def test_the_models_learned_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """The gateway learns under the request's own ``model``: clients naming a new model each time (a
    backend that serves any name) grew a window per name without bound."""
    learner = OnlineLearner(_embed, _prior, OnlineConfig(window=10, min_observations=2, max_models=3),
                            background=False)  # fmt: skip
    for i in range(20):
        learner.observe(f"prompt {i}", 5, f"m{i % 10}")
    assert sorted(learner.store.models()) == ["m0", "m1", "m2"]
    assert learner.observed("m0") == 2 and learner.observed("m3") == 0
    assert [r.getMessage() for r in caplog.records].count(
        "online learning: 3 models learned already (max_models): requests of another model, 'm3', and of any "
        "other new one, are not learned from"
    ) == 1
    # a store that another replica filled counts: none is added beyond it
    store = MemoryStore()
    for m in ("a", "b", "c"):
        store.append(m, np.zeros(learner.store.rows("m0").shape[1]), 10)
    shared = OnlineLearner(_embed, _prior, OnlineConfig(window=10, min_observations=2, max_models=3), store=store,
                           background=False)  # fmt: skip
    shared.observe("x", 4, "d")
    shared.observe("y", 4, "a")
    assert sorted(store.models()) == ["a", "b", "c"] and shared.observed("a") == 2
    with pytest.raises(ValueError, match="max_models"):
        OnlineConfig(max_models=0)
