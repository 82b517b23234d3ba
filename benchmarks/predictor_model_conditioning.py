"""Does a predictor conditioned on the served model rank that model's answers better than one for all?

PARS claims one predictor serves many models. The alternative the issue names is one predictor
conditioned on the model: on its identity (which cannot reach a model it never saw) or on a few
calibration statistics measured from that model's completions. This measures the second on models
the heads never trained on:

- **Data.** alpaca_eval's 805 instructions answered by its 227 models (log cl100k tokens, each model's
  lengths z-scored over the training prompts). The prompt-disjoint split of the cross-source tables
  (154 test prompts, which the default predictor never trained on); 48 held-out models (the four
  2023-era models of the tables and 44 drawn at random with ``--seed``), the other 179 to train on.
- **Features.** The default predictor's pooled embedding (what the online learner reads), standardized.
- **Heads**, ridge with one penalty (``--alpha`` per model and prompt), trained on the training prompts
  of the training models:
  one head for every model; the same with the features crossed with the model's statistics (mean and
  standard deviation of its log lengths on ``K`` calibration prompts); and rank-``r`` model factors (the
  training matrix's leading singular vectors: a head maps text to prompt factors, and an unseen
  model's factors are fitted to its ``K`` calibration lengths, shrunk toward the training models'
  factors as a Gaussian prior).
- **Calibration.** ``K`` completions of the held-out model on training prompts, drawn ``--draws``
  times; tau_b on the test prompts, the mean over draws and models.

The same heads are then calibrated on ``K`` completions of arena_hard_v2's two reasoning-era models
(its training split) and scored on its 72 test prompts.

    python benchmarks/predictor_model_conditioning.py   # writes benchmarks/results/predictor_model_conditioning.md
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
from scipy import stats

from headway.predict.crosssource import ALPACA_EVAL_MODELS, load_source
from headway.predict.data import load_alpaca_eval
from headway.workload import find_data_dir

F64 = npt.NDArray[np.float64]
UNCALIBRATED = ("the default predictor's score", "one head for every model")
STATS = "crossed with the model's mean and sd of log length"
NOISE = 0.5  # the factor model's residual variance per z-scored log length (about 1 - the first factor's share)


def tau(scores: F64, lengths: F64) -> float:
    ok = ~np.isnan(lengths)
    return float(stats.kendalltau(scores[ok], lengths[ok]).statistic)


def zscore(y: F64, mask: npt.NDArray[np.bool_]) -> F64:
    v = y[mask & ~np.isnan(y)]
    return (y - v.mean()) / v.std()


def fit_crossed(x: F64, targets: Sequence[F64], conds: Sequence[F64], alpha: float) -> F64:
    """Ridge on features ``x`` crossed with each model's condition vector (``kron(c, x)``), every
    model's targets on the same prompts (NaN: no answer). Returns the weights, one row per condition
    component: a model's head is ``c @ W``."""
    q, d = len(conds[0]), x.shape[1]
    a = np.zeros((q * d, q * d))
    b = np.zeros(q * d)
    gram = x.T @ x
    for y, c in zip(targets, conds, strict=True):
        ok = ~np.isnan(y)
        g = gram if ok.all() else x[ok].T @ x[ok]
        a += np.kron(np.outer(c, c), g)
        b += np.kron(c, x[ok].T @ y[ok])
    a += alpha * len(targets) * np.eye(q * d)
    return np.linalg.solve(a, b).reshape(q, d)


class Factors:
    """Rank-``r`` model factors of the training models' z-scored lengths, a text head for the prompt
    factors, and the Gaussian prior an unseen model's factors are shrunk toward."""

    def __init__(self, z: F64, x: F64, rank: int, alpha: float) -> None:
        u, s, vt = np.linalg.svd(np.nan_to_num(z), full_matrices=False)
        n = len(z)
        prompt_factors = vt[:rank].T * s[:rank] / math.sqrt(n)
        model_factors = u[:, :rank] * math.sqrt(n)
        self.head = np.linalg.solve(x.T @ x + alpha * len(x) * np.eye(x.shape[1]), x.T @ prompt_factors)
        self.mean = model_factors.mean(0)
        self.precision = np.linalg.inv(np.atleast_2d(np.cov(model_factors.T)) + 1e-6 * np.eye(rank))

    def model(self, x_calib: F64, y_calib: F64) -> F64:
        """The factors of a model from its z-scored log lengths on some prompts (MAP under the prior)."""
        v = x_calib @ self.head
        lhs = v.T @ v / NOISE + self.precision
        return np.asarray(np.linalg.solve(lhs, v.T @ y_calib / NOISE + self.precision @ self.mean))


def standardize(emb: F64, train: npt.NDArray[np.bool_]) -> Callable[[F64], F64]:
    mu, sd = emb[train].mean(0), emb[train].std(0) + 1e-6
    return lambda e: np.hstack([(e - mu) / sd, np.ones((len(e), 1))])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", default="10,25,100", help="K values, comma-separated")
    ap.add_argument("--draws", type=int, default=5, help="calibration draws per model and K")
    ap.add_argument("--random-models", type=int, default=44, help="held-out models beyond the four 2023-era ones")
    ap.add_argument("--alpha", type=float, default=1000.0, help="ridge penalty per model and prompt")
    ap.add_argument(
        "--ranks",
        default="3,5",
        help="ranks of the model-factor heads (rank 1 orders prompts as one head does: one scalar cannot reorder them)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/predictor_model_conditioning.md")
    args = ap.parse_args()
    ks = [int(k) for k in args.calibration.split(",")]
    ranks = [int(r) for r in args.ranks.split(",")]
    from headway.predict.shipped import ShippedPredictor

    t0 = time.perf_counter()
    root = find_data_dir()
    predictor = ShippedPredictor(threads=args.threads)
    src = load_source("alpaca_eval", root)
    prompts, test = list(src.prompts), np.asarray(src.test)
    train = ~test
    where = {p: i for i, p in enumerate(prompts)}
    lengths: dict[str, F64] = {}
    for ex in load_alpaca_eval("all", data_dir=root).examples:
        assert ex.model is not None
        lengths.setdefault(ex.model, np.full(len(prompts), np.nan))[where[ex.prompt]] = math.log(ex.length)
    rng = np.random.default_rng(args.seed)
    others = sorted(m for m in lengths if m not in ALPACA_EVAL_MODELS)
    drawn = [others[i] for i in sorted(rng.choice(len(others), args.random_models, replace=False))]
    held = [*ALPACA_EVAL_MODELS, *drawn]
    fit_models = [m for m in sorted(lengths) if m not in held]
    emb = predictor.embed(prompts).astype(np.float64)
    default_score = np.asarray(predictor.score_embeddings(emb.astype(np.float32)))
    feats = standardize(emb, train)
    x = feats(emb)
    z = {m: zscore(lengths[m], train) for m in lengths}
    ztrain = np.array([z[m][train] for m in fit_models])
    share = np.linalg.svd(np.nan_to_num(ztrain), compute_uv=False) ** 2
    share /= share.sum()

    def calib_stats(y: F64, idx: npt.NDArray[np.intp]) -> F64:
        return np.array([y[idx].mean(), y[idx].std()])

    # the statistics a training model is conditioned on: from all its training prompts (its calibration
    # statistics converge to these as K grows), standardized over the training models
    full = np.array([calib_stats(lengths[m], np.flatnonzero(train & ~np.isnan(lengths[m]))) for m in fit_models])
    s_mu, s_sd = full.mean(0), full.std(0)

    def cond(st: F64) -> F64:
        return np.concatenate([[1.0], (st - s_mu) / s_sd])

    targets = [z[m][train] for m in fit_models]
    one = fit_crossed(x[train], targets, [np.ones(1)] * len(fit_models), args.alpha)[0]
    crossed = fit_crossed(x[train], targets, [cond(s) for s in full], args.alpha)
    factors = {r: Factors(ztrain, x[train], r, args.alpha) for r in ranks}

    def scores(
        xs: F64, score: F64, y: F64, test_: npt.NDArray[np.bool_], k: int
    ) -> dict[tuple[str, int | None], float]:
        """tau_b of every head on one model's test prompts (features ``xs``, the default's ``score``,
        log lengths ``y``), the calibrated heads calibrated on ``k`` of its other prompts per draw."""
        out = {
            (UNCALIBRATED[0], None): tau(score[test_], y[test_]),
            (UNCALIBRATED[1], None): tau(xs[test_] @ one, y[test_]),
        }
        for r, f in factors.items():
            out[(f"rank-{r} model factors at the training models' mean", None)] = tau(
                xs[test_] @ f.head @ f.mean, y[test_]
            )
        pool = np.flatnonzero(~test_ & ~np.isnan(y))
        drawn_: dict[str, list[float]] = {}
        for _ in range(args.draws):
            idx = rng.choice(pool, min(k, len(pool)), replace=False)
            drawn_.setdefault(STATS, []).append(tau(xs[test_] @ (cond(calib_stats(y, idx)) @ crossed), y[test_]))
            zc = (y[idx] - y[idx].mean()) / (y[idx].std() + 1e-9)
            for r, f in factors.items():
                w = f.head @ f.model(xs[idx], zc)
                drawn_.setdefault(f"rank-{r} model factors fitted to the model", []).append(
                    tau(xs[test_] @ w, y[test_])
                )
        out.update({(name, k): float(np.mean(v)) for name, v in drawn_.items()})
        return out

    def table(cells: dict[tuple[str, int | None], list[float]], cols: Sequence[str]) -> list[str]:
        lines = [f"| head | K | {' | '.join(cols)} |", "|---|---:|" + "---:|" * len(cols)]
        for (name, k), values in cells.items():
            lines.append(f"| {name} | {'-' if k is None else k} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
        return lines

    def gather(
        per_model: list[dict[tuple[str, int | None], float]], groups: Sequence[Sequence[int]]
    ) -> dict[tuple[str, int | None], list[float]]:
        cells: dict[tuple[str, int | None], list[float]] = {}
        for key in per_model[0]:
            cells[key] = [float(np.mean([per_model[i][key] for i in g])) for g in groups]
        return cells

    def run(
        xs: F64, score: F64, ys: Sequence[F64], test_: npt.NDArray[np.bool_]
    ) -> list[dict[tuple[str, int | None], float]]:
        per_model: list[dict[tuple[str, int | None], float]] = [{} for _ in ys]
        for k in ks:
            for i, y in enumerate(ys):
                for key, v in scores(xs, score, y, test_, k).items():
                    per_model[i].setdefault(key, v)
        return per_model

    alpaca = gather(
        run(x, default_score, [lengths[m] for m in held], test),
        [range(len(ALPACA_EVAL_MODELS)), range(len(held))],
    )
    arena_src = load_source("arena_hard_v2", root)
    aprompts, atest = list(arena_src.prompts), np.asarray(arena_src.test)
    aemb = predictor.embed(aprompts).astype(np.float64)
    ascore = np.asarray(predictor.score_embeddings(aemb.astype(np.float32)))
    amodels = sorted(arena_src.evals)
    arena = gather(
        run(feats(aemb), ascore, [np.log(arena_src.evals[m]) for m in amodels], atest),
        [[i] for i in range(len(amodels))],
    )
    lines = [
        "# A predictor conditioned on the served model",
        "",
        "Command:",
        "",
        "```",
        shlex.join(["python", *sys.argv]),
        "```",
        "",
        f"- features: the default predictor's pooled embedding ({predictor.path.name}), standardized; ridge "
        f"penalty {args.alpha:g} per model and prompt for every head",
        f"- alpaca_eval: {len(prompts)} instructions, {int(test.sum())} in the prompt-disjoint test split "
        f"(never trained on by the default predictor nor by these heads); {len(fit_models)} models to train "
        f"on, {len(held)} held out (the four 2023-era models {', '.join(ALPACA_EVAL_MODELS)} and "
        f"{args.random_models} drawn with seed {args.seed})",
        f"- K: completions of the unseen model on training prompts that calibrate it, drawn {args.draws} "
        "times (cells: the mean tau_b over draws and models)",
        "- variance of the training models' z-scored log lengths by singular vector: "
        + ", ".join(f"{v:.1%}" for v in share[:6])
        + " (the first: the ranking the models share)",
        "",
        "## alpaca_eval's test prompts, models never trained on",
        "",
        *table(alpaca, ("four 2023-era models", f"all {len(held)} held-out models")),
        "",
        f"## arena_hard_v2's test prompts ({int(atest.sum())}), calibrated on its training split",
        "",
        *table(arena, amodels),
        "",
        f"Wall time: {time.perf_counter() - t0:.0f} s.",
    ]
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    from headway._proc import run_interruptible

    # Ctrl-C or SIGTERM: what it started is stopped, then one line and status 130 (or death by SIGTERM)
    raise SystemExit(run_interruptible(main, "predictor_model_conditioning"))
