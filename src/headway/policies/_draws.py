""":func:`~headway.policies._scoring.request_normal` for many requests at once, bit for bit.

``request_normal`` seeds numpy's ``SeedSequence`` with a hash's two 32-bit words, has it
generate a ``PCG64`` seed (four 64-bit words) and draws one standard normal. Numpy builds the
``SeedSequence`` and its generated state one request at a time (about 4 us of the draw's 6);
its hashing (``SeedSequence.mix_entropy`` then ``generate_state``) is a fixed chain of 32-bit
multiply-xorshift steps whose constants do not depend on the data, so :func:`seed_states`
runs it over a whole array of entropy words at once with numpy's wrapping ``uint32``
arithmetic. :func:`normal_from_state` then seeds ``PCG64`` with such a state (numpy's own
seeding from it) and draws. ``tests/policies/test_draws.py`` compares both with
``request_normal`` (and ``SeedSequence``) on random and edge-case words.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence
from numpy.typing import NDArray

__all__ = ["normal_from_state", "seed_states"]

# numpy's SeedSequence constants (numpy/random/bit_generator.pyx), a 4-word pool
_POOL = 4
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_L = 0xCA01F9DD
_MIX_R = 0x4973F715
_MASK = 0xFFFFFFFF


_Step = tuple[np.uint32, np.uint32]


def _hash_consts(init: int, mult: int, n: int) -> list[_Step]:
    """``n`` hashmix steps of a hash constant (``init``, then each times ``mult`` mod 2^32): the
    value is xored with the constant, which is then multiplied, and multiplied by it."""
    out, h = [], init
    for _ in range(n):
        xor = h
        h = (h * mult) & _MASK
        out.append((np.uint32(xor), np.uint32(h)))
    return out


# mix_entropy's hashmix steps: 4 pool words, then 12 mixes; generate_state: 8 output words
_A_STEPS = _hash_consts(_INIT_A, _MULT_A, _POOL + _POOL * (_POOL - 1))
_B_STEPS = _hash_consts(_INIT_B, _MULT_B, 2 * _POOL)
_U16 = np.uint32(16)
_ML = np.uint32(_MIX_L)
_MR = np.uint32(_MIX_R)


def _hashmix(value: NDArray[np.uint32], step: _Step) -> NDArray[np.uint32]:
    xor, mult = step
    value = (value ^ xor) * mult
    return value ^ (value >> _U16)


def seed_states(words: NDArray[np.uint32]) -> NDArray[np.uint64]:
    """``SeedSequence(w).generate_state(4, np.uint64)`` for each row ``w`` of an ``(n, 2)`` array of
    32-bit entropy words (no spawn key), as one ``(n, 4)`` C-contiguous array."""
    words = np.asarray(words, dtype=np.uint32)
    if words.ndim != 2 or words.shape[1] != 2:
        raise ValueError(f"seed_states takes an (n, 2) array of 32-bit words, got shape {words.shape}")
    zero = np.zeros(len(words), dtype=np.uint32)
    steps = iter(_A_STEPS)
    with np.errstate(over="ignore"):  # (uint32 arrays wrap silently; numpy scalars would warn)
        # mix_entropy: the entropy words, then the pool's padding, each hashed in turn
        pool = [_hashmix(words[:, i] if i < 2 else zero, next(steps)) for i in range(_POOL)]
        # then every pool word into every other one, in numpy's order
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    y = _hashmix(pool[src], next(steps))
                    r = _ML * pool[dst] - _MR * y
                    pool[dst] = r ^ (r >> _U16)
        # generate_state: 8 words cycling over the pool, read as 4 little-endian 64-bit words
        out = np.empty((len(words), 2 * _POOL), dtype="<u4")
        for i, step in enumerate(_B_STEPS):
            out[:, i] = _hashmix(pool[i % _POOL], step)
    return np.ascontiguousarray(out.view("<u8").astype(np.uint64))


class _State(ISeedSequence):
    """A seed sequence whose generated state is given (one row of :func:`seed_states`)."""

    __slots__ = ("_state",)

    def __init__(self, state: NDArray[np.uint64]) -> None:
        self._state = state

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> NDArray[np.uint64]:
        if n_words != _POOL or dtype is not np.uint64:  # PCG64 asks for exactly this
            raise ValueError(f"only 4 uint64 words are precomputed, not {n_words} of {dtype}")
        return self._state


def normal_from_state(state: NDArray[np.uint64]) -> float:
    """The standard normal ``default_rng``'s generator draws first when its ``SeedSequence``
    generated ``state`` (4 ``uint64`` words, contiguous)."""
    # (PCG64 takes any ISeedSequence; numpy's stubs name only SeedSequence)
    return float(np.random.Generator(np.random.PCG64(_State(state))).standard_normal())  # type: ignore[arg-type]
