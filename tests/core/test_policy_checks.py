"""A policy of the user's that breaks the contract fails once, naming the policy and the fix, as it
registers or with its first key, instead of giving wrong results or failing deep in an engine."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import pytest

from factories import make_request
from headway.core import Policy, PolicyKey, PolicyQueue, Request, check_key
from headway.core._policy import _POLICIES


@pytest.fixture
def register() -> Iterator[object]:
    """``register(name)(cls)`` as ``register_policy``, unregistered after the test."""
    names: list[str] = []

    def reg(name: str):  # type: ignore[no-untyped-def]
        names.append(name)
        return _POLICIES.register(name)

    yield reg
    for name in names:
        if name in _POLICIES._classes:
            _POLICIES.unregister(name)


def test_a_class_without_key_is_refused_as_it_registers(register) -> None:
    class NoKey(Policy):
        def keys(self, request: Request, now: float) -> PolicyKey:  # a slip for key
            return (0,)

    no_key = r"policy 'test-no-key' \(.*NoKey\) does not define key: every policy needs"
    with pytest.raises(TypeError, match=no_key), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # keys is one letter off key: a warning too
        register("test-no-key")(NoKey)


def test_an_unknown_displacement_mode_is_refused_as_it_registers(register) -> None:
    class Typo(Policy):
        preemptive = True
        displacement = "evcit"

        def key(self, request: Request, now: float) -> PolicyKey:
            return (0,)

    with pytest.raises(ValueError, match=r"displacement must be one of 'none', 'pause', 'evict', got 'evcit'"):
        register("test-typo")(Typo)


def test_a_preemptive_class_without_a_displacement_mode_is_refused(register) -> None:
    class NeverDisplaces(Policy):
        preemptive = True

        def key(self, request: Request, now: float) -> PolicyKey:
            return (0,)

    with pytest.raises(ValueError, match=r"is preemptive but its displacement is 'none'.*'pause'.*'evict'"):
        register("test-never-displaces")(NeverDisplaces)
    # an instance never registered is checked where an engine first reads its hooks
    with pytest.raises(ValueError, match=r"policy 'NeverDisplaces' \(.*NeverDisplaces\) is preemptive but"):
        NeverDisplaces.hooks()


def test_an_unknown_running_keys_mode_is_refused_as_it_registers(register) -> None:
    class Bound(Policy):
        running_keys = "bound"

        def key(self, request: Request, now: float) -> PolicyKey:
            return (0,)

    with pytest.raises(ValueError, match=r"running_keys must be one of '', 'bounded', 'countdown', got 'bound'"):
        register("test-bound")(Bound)


def test_a_misspelled_hook_is_a_warning_naming_the_hook(register) -> None:
    class Misspelled(Policy):
        def on_progres(self, request: Request, now: float, num_new_tokens: int) -> None:
            pass

        def rekey_after_token(self, request: Request) -> int:
            return 1

        def attained(self, request: Request) -> int:  # a helper of its own: no warning
            return 0

        def key(self, request: Request, now: float) -> PolicyKey:
            return (0,)

    with pytest.warns(RuntimeWarning) as caught:
        register("test-misspelled")(Misspelled)
    said = [str(w.message) for w in caught]
    assert len(said) == 2, said
    assert "defines 'on_progres', which is no Policy attribute" in said[0] and "'on_progress'?" in said[0]
    assert "did you mean 'rekey_after_tokens'?" in said[1]
    assert caught[0].filename == __file__  # points at the registration, not into headway


def test_the_built_in_policies_pass_their_own_checks() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in _POLICIES.names():
            _POLICIES.get(name).hooks()


class _Keyed(Policy):
    def __init__(self, keys: list[object]) -> None:
        self.keys = iter(keys)

    def key(self, request: Request, now: float) -> PolicyKey:
        return next(self.keys)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("key", "said"),
    [
        (37, r"key\(\) must return a tuple of numbers \(smaller runs first\), got int 37: return \(37,\)"),
        (2.5, r"key\(\) .* got float 2.5: return \(2.5,\)"),
        ([1, 2], r"key\(\) .* got list \[1, 2\]$"),
        ((1, "premium"), r"key\(\) .* got \(1, 'premium'\), whose element 1 is a str: map it to a number"),
        ((math.nan,), r"key\(\) returned \(nan,\), whose element 0 is NaN, .* \(math.inf to run last\)"),
    ],
)
def test_the_first_key_a_queue_gets_is_checked(key: object, said: str) -> None:
    queue = PolicyQueue(_Keyed([key]))
    with pytest.raises(ValueError, match=r"^policy '' \(_Keyed\): " + said):
        queue.add(make_request(seq=0), 0.0)


def test_keys_that_do_not_compare_are_one_error_naming_the_policy() -> None:
    queue = PolicyQueue(_Keyed([(1,), ("x",)]))
    queue.add(make_request(seq=0), 0.0)
    with pytest.raises(ValueError, match=r"key \('x',\) cannot be ordered against the queue's other keys"):
        queue.add(make_request(seq=1), 0.0)


def test_check_key_takes_every_tuple_of_numbers() -> None:
    import numpy as np

    for key in [(), (1,), (1.5, -2, True), (np.float64(1.0), np.int64(3)), (math.inf, -math.inf)]:
        check_key(_Keyed([]), key)
