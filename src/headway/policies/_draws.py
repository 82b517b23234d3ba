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

Building a generator per state still takes about 2 us; :func:`normals_from_states` draws for a
whole array of states at once. ``PCG64`` seeded from a state and its first 64-bit output are a
few 128-bit multiply-adds (:func:`first_outputs`, in 32-bit halves with numpy's wrapping
``uint64`` arithmetic), and ``standard_normal`` turns that output into a normal by numpy's
ziggurat: the low 8 bits pick a layer ``idx``, the next one the sign, the next 52 a magnitude
``rabs``; if ``rabs < ki[idx]`` the draw is ``rabs * wi[idx]`` (the fast path, about 98.5 % of
states), else it takes further outputs (the wedge or the tail). The tables ``wi`` and ``ki``
are read back from numpy's own generator once (:func:`_ziggurat_tables`: a generator put in a
state whose next output is chosen, about a thousand draws); states off the fast path are drawn
by :func:`normal_from_state`. The tests compare every draw with :func:`normal_from_state`.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import numpy as np
from numpy.random.bit_generator import ISeedSequence
from numpy.typing import NDArray

__all__ = ["first_outputs", "normal_from_state", "normals_from_states", "seed_states"]

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


# PCG64 (numpy/random/src/pcg64): a 128-bit LCG with this multiplier, XSL-RR output
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_M_HI = np.uint64(_PCG_MULT >> 64)
_M_LO = np.uint64(_PCG_MULT & 0xFFFFFFFFFFFFFFFF)
_LOW32 = np.uint64(0xFFFFFFFF)
_U1 = np.uint64(1)
_U32 = np.uint64(32)
_U58 = np.uint64(58)
_U63 = np.uint64(63)
_U64 = np.uint64(64)
_ZIG_LAYERS = 256
_ZIG_BITS = 52  # the ziggurat's magnitude: bits 9 .. 60 of the output
_GUARD_DRAWS = 16  # fast-path draws of each call compared with numpy's (normals_from_states)


def _mulhi(a: NDArray[np.uint64], b: np.uint64) -> NDArray[np.uint64]:
    """The high 64 bits of each ``a * b`` (unsigned 128-bit product), from 32-bit halves."""
    a0, a1 = a & _LOW32, a >> _U32
    b0, b1 = b & _LOW32, b >> _U32
    low, mid1, mid2 = a0 * b0, a1 * b0, a0 * b1
    carry = ((low >> _U32) + (mid1 & _LOW32) + (mid2 & _LOW32)) >> _U32
    return a1 * b1 + (mid1 >> _U32) + (mid2 >> _U32) + carry  # type: ignore[no-any-return]


def _lcg_step(
    hi: NDArray[np.uint64], lo: NDArray[np.uint64], inc_hi: NDArray[np.uint64], inc_lo: NDArray[np.uint64]
) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """PCG64's step, ``state * MULT + inc`` mod 2^128, on (high, low) word arrays."""
    prod_lo = lo * _M_LO
    prod_hi = _mulhi(lo, _M_LO) + lo * _M_HI + hi * _M_LO
    new_lo = prod_lo + inc_lo
    return prod_hi + inc_hi + (new_lo < prod_lo).astype(np.uint64), new_lo


def first_outputs(states: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``PCG64(s).random_raw()`` for each row ``s`` of an ``(n, 4)`` array of seed states (the
    words numpy's ``SeedSequence`` generates): the first 64-bit output of ``PCG64`` seeded by them."""
    states = np.asarray(states, dtype=np.uint64)
    s0, s1, s2, s3 = (np.ascontiguousarray(states[:, i]) for i in range(4))
    with np.errstate(over="ignore"):  # (uint64 arrays wrap, as the C arithmetic does)
        # pcg64_set_seed: initstate (s0, s1), initseq (s2, s3); inc = initseq << 1 | 1
        inc_hi = (s2 << _U1) | (s3 >> _U63)
        inc_lo = (s3 << _U1) | _U1
        # srandom: state 0, a step (state = inc), state += initstate, a step
        lo = inc_lo + s1
        hi = inc_hi + s0 + (lo < inc_lo).astype(np.uint64)
        hi, lo = _lcg_step(hi, lo, inc_hi, inc_lo)
        hi, lo = _lcg_step(hi, lo, inc_hi, inc_lo)  # the draw: a step, then XSL-RR of the state
        value, rot = hi ^ lo, hi >> _U58
        return cast("NDArray[np.uint64]", (value >> rot) | (value << ((_U64 - rot) & _U63)))


def _next_output_draw(bits: np.random.PCG64, gen: np.random.Generator, raw: int) -> tuple[float, bool]:
    """``gen.standard_normal()`` with ``raw`` as the generator's next output, and whether it took
    that output alone (the ziggurat's fast path; the wedge and the tail take more)."""
    # a state whose step lands on ``raw`` (a state below 2^122 outputs its low word: no rotation)
    before = 1 if raw % 2 == 0 else 2  # (an odd increment, as PCG64 keeps)
    inc = (raw - before * _PCG_MULT) % (1 << 128)
    bits.state = {"bit_generator": "PCG64", "state": {"state": before, "inc": inc}, "has_uint32": 0, "uinteger": 0}
    x = float(gen.standard_normal())
    return x, bits.state["state"]["state"] == raw


@functools.cache
def _ziggurat_tables() -> tuple[NDArray[np.float64], NDArray[np.uint64]]:
    """numpy's ``standard_normal`` ziggurat tables ``wi`` and ``ki``, read back from its generator:
    ``wi[idx]`` is the draw of magnitude 1 in layer ``idx``, ``ki[idx]`` the least magnitude off
    the fast path (found by search; a layer that is never fast gets 0 or 1, and ``wi`` 0)."""
    bits = np.random.PCG64(0)
    gen = np.random.Generator(bits)
    wi = np.zeros(_ZIG_LAYERS, dtype=np.float64)
    ki = np.zeros(_ZIG_LAYERS, dtype=np.uint64)
    top = 1 << _ZIG_BITS
    for idx in range(_ZIG_LAYERS):

        def fast(rabs: int, idx: int = idx) -> bool:
            return _next_output_draw(bits, gen, rabs << 9 | idx)[1]  # (sign bit 8 clear)

        x, one_fast = _next_output_draw(bits, gen, 1 << 9 | idx)
        if not one_fast:
            ki[idx] = 1 if fast(0) else 0
            continue
        wi[idx] = x
        # the least magnitude that is not fast, in [2, top]: gallop from a guess (a layer's ki is
        # about top times the ratio of its width to the one below), then bisect
        guess = int(wi[idx - 1] / x * top) if idx > 1 and wi[idx - 1] else top // 2
        guess = min(max(guess, 2), top - 1)
        step = 1
        if fast(guess):
            lo, hi = guess, min(guess + step, top)
            while hi < top and fast(hi):
                step *= 2
                lo, hi = hi, min(hi + step, top)
        else:
            lo, hi = max(guess - step, 1), guess
            while lo > 1 and not fast(lo):
                step *= 2
                lo, hi = max(lo - step, 1), lo
        while hi - lo > 1:  # fast(lo) (or lo == 1), not fast(hi) (or hi == top)
            mid = (lo + hi) // 2
            if fast(mid):
                lo = mid
            else:
                hi = mid
        ki[idx] = hi
    return wi, ki


def normals_from_states(states: NDArray[np.uint64]) -> NDArray[np.float64]:
    """``normal_from_state(s)`` for each row ``s`` of an ``(n, 4)`` array of seed states, bit for
    bit: the ziggurat's fast path for the whole array at once, the other states one at a time."""
    states = np.asarray(states, dtype=np.uint64)
    wi, ki = _ziggurat_tables()
    raw = first_outputs(states)
    idx = (raw & np.uint64(_ZIG_LAYERS - 1)).astype(np.intp)
    rabs = (raw >> np.uint64(9)) & np.uint64((1 << _ZIG_BITS) - 1)
    x = rabs.astype(np.float64) * wi[idx]  # (rabs < 2^52: exact as a float, as in C)
    x = np.where(((raw >> np.uint64(8)) & _U1).astype(bool), -x, x)
    slow = rabs >= ki[idx]
    # a guard against a numpy whose generator no longer works this way: a few fast-path draws
    # checked against numpy's own; on any difference every state is drawn by numpy
    fast = np.flatnonzero(~slow)[:_GUARD_DRAWS]
    if any(float(x[i]) != normal_from_state(states[i]) for i in fast):
        return np.array([normal_from_state(s) for s in states], dtype=np.float64)
    for i in np.flatnonzero(slow):
        x[i] = normal_from_state(states[i])
    return x
