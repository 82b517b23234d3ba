"""Score-ranked policies given a predictor by its spec (``scorer="default"``), as the gateway's ``--scorer``."""

from __future__ import annotations

import numpy as np
import pytest

from headway.core import make_policy

from .conftest import make_request

LONG = "Write a detailed 2000-word essay on the history of Rome, with sources."
SHORT = "Say yes or no: is 7 prime?"
MIDDLE = "Summarize the plot of Hamlet in three paragraphs."


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No predictor trained into the user's cache: ``default`` is the one shipped in the package."""
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "headway-cache"))


@pytest.mark.parametrize("policy", ["pars", "sjf-score"])
@pytest.mark.parametrize("spec", ["default", "default:onnx-int8"])
def test_default_scores_prompts_with_the_shipped_predictor(policy: str, spec: str) -> None:
    from headway.predict.score import default_scorer

    pol = make_policy(policy, scorer=spec)
    assert pol.scorer == spec and not pol.oracle
    reqs = [make_request(prompt=p) for p in (LONG, SHORT, MIDDLE)]
    for r in reqs:
        pol.on_arrival(r, 0.0)
    shipped = default_scorer("onnx-int8" if spec.endswith("int8") else "torch", threads=1)
    expected = [float(shipped.score([r.prompt])[0]) for r in reqs]
    assert [pol.score_of(r) for r in reqs] == pytest.approx(expected, abs=1e-6)
    # the shortest expected answer first: the yes/no question before the essay
    order = sorted(reqs, key=lambda r: pol.key(r, 0.0))
    assert order[0].prompt == SHORT and order[-1].prompt == LONG


def test_the_int8_spec_is_another_graph_than_the_float_one() -> None:
    reqs = [make_request(prompt=p) for p in (LONG, SHORT)]
    plain = [make_policy("pars", scorer="default").score_of(r) for r in reqs]
    int8 = [make_policy("pars", scorer="default:onnx-int8").score_of(make_request(prompt=r.prompt)) for r in reqs]
    assert not np.array_equal(plain, int8)


def test_a_spec_is_loaded_once_per_process() -> None:
    a, b = make_policy("pars", scorer="default"), make_policy("sjf-score", scorer="default")
    assert a._score_fn is b._score_fn


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("default:fp4", r"^pars: scorer 'default:fp4': unknown backend 'fp4'; use torch, onnx, onnx-int8"),
        ("defualt", r"^pars: unknown scorer 'defualt'; use None .*'default' \(the shipped predictor\).*'default'\?$"),
        ("no-such-ckpt", r"^pars: unknown scorer 'no-such-ckpt'; .*; there is no checkpoint directory 'no-such-ckpt'"),
        ("headway.nowhere:scorer", r"^pars: cannot load scorer 'headway.nowhere:scorer'"),
    ],
)
def test_a_bad_spec_is_a_value_error_naming_it(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy("pars", scorer=spec)


def test_noisy_oracle_settings_are_refused_with_a_predictor() -> None:
    with pytest.raises(ValueError, match=r"^pars: tau=0.5 is only used by scorer='noisy-oracle'; scorer='default'"):
        make_policy("pars", scorer="default", tau=0.5)


def test_a_request_without_prompt_text_is_an_error_naming_it() -> None:
    pol = make_policy("pars", scorer="default")
    with pytest.raises(ValueError, match=r"request 'no-text' has no prompt text"):
        pol.on_arrival(make_request(rid="no-text"), 0.0)
