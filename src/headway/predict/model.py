"""The length predictor: a Hugging Face encoder and a linear score head, plus its checkpoint format.

Score = ``Linear(hidden, 1)`` on the [CLS] embedding, passed through the model's pooler where it has one
(``pooling="auto"``); ``"cls"``, ``"pooler"`` and ``"mean"`` (masked mean of the last layer) can be chosen.

A checkpoint is a directory::

    predictor.json       settings, provenance, metrics, and the SHA-256 of every weight file
    model.safetensors    head.* (always) and encoder.* (when the encoder was fine-tuned)
    encoder/config.json  the encoder's config (fine-tuned checkpoints)
    tokenizer/           the tokenizer files

A frozen-encoder checkpoint stores only the head and names its encoder (``"default"`` for the bundled
MiniLM, else a path). Loading verifies hashes, keys, shapes and finiteness: a corrupt checkpoint raises
:class:`CheckpointError`, never loads silently.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from headway._help import unwritable
from headway.predict._errors import CheckpointError, EncoderError
from headway.predict._finetune_recipe import TRUNCATIONS
from headway.predict._paths import encoder_path, file_sha256, packaged_encoder_name, set_offline

__all__ = [
    "CHECKPOINT_FORMAT",
    "POOLINGS",
    "LengthPredictor",
    "LoadedPredictor",
    "check_checkpoint_target",
    "checkpoint_max_length",
    "encoder_config",
    "load_checkpoint",
    "load_encoder",
    "mean_pool",
    "position_limit",
    "save_checkpoint",
    "tokenize",
]

CHECKPOINT_FORMAT = "headway-predictor"
CHECKPOINT_VERSION = 1
POOLINGS: tuple[str, ...] = ("auto", "cls", "pooler", "mean")
_META = "predictor.json"
_WEIGHTS = "model.safetensors"

_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
_NOT_ENCODER_ARCH = ("CausalLM", "LMHeadModel", "ConditionalGeneration", "Seq2SeqLM")
_OFFSET_POSITIONS = (
    "camembert", "data2vec-text", "ibert", "longformer", "mpnet", "roberta", "roberta-prelayernorm", "xlm-roberta",
    "xmod",
)  # fmt: skip
"""Encoders whose position ids start after the padding id (``pad_token_id + 1``), as RoBERTa's do."""


def position_limit(config: Any) -> int | None:
    """The most tokens (special tokens included) an encoder with this config (a transformers config or
    its ``config.json`` as a dict) can take: its ``max_position_embeddings``, less the ``pad_token_id + 1``
    positions that RoBERTa-like encoders (MPNet too) skip. None when the config does not say."""
    if isinstance(config, dict):
        n, kind, pad = config.get("max_position_embeddings"), config.get("model_type"), config.get("pad_token_id")
    else:
        n = getattr(config, "max_position_embeddings", None)
        kind, pad = getattr(config, "model_type", None), getattr(config, "pad_token_id", None)
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return None
    if kind in _OFFSET_POSITIONS:
        n -= (pad if isinstance(pad, int) and not isinstance(pad, bool) else 1) + 1
    return n if n > 0 else None


def _quiet_transformers() -> Any:
    set_offline()
    transformers: Any = importlib.import_module("transformers")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _check_encoder_config(path: Path, config: Any) -> None:
    archs = [str(a) for a in (getattr(config, "architectures", None) or [])]
    if (
        getattr(config, "is_decoder", False)
        or getattr(config, "is_encoder_decoder", False)
        or any(marker in a for a in archs for marker in _NOT_ENCODER_ARCH)
    ):
        raise EncoderError(
            f"{path}: not an encoder (model_type={getattr(config, 'model_type', '?')!r}, "
            f"architectures={archs}); give a BERT-like encoder directory"
        )
    if not isinstance(getattr(config, "hidden_size", None), int):
        raise EncoderError(f"{path}: config has no integer hidden_size; not a supported encoder")


def encoder_config(path: str | Path | None = None, num_layers: int | None = None) -> tuple[Path, Any]:
    """The directory and transformers config of a local encoder (as :func:`load_encoder` resolves
    ``path``), its ``num_hidden_layers`` set to ``num_layers`` if given; reads no weights, so a command
    can check its encoder and layer count before it reads any data.

    Raises :class:`EncoderError` as :func:`load_encoder` does for the path, the config and
    ``num_layers``.
    """
    transformers = _quiet_transformers()
    try:
        p = encoder_path(path)
    except (ModuleNotFoundError, ValueError) as exc:
        raise EncoderError(f"encoder {path}: {exc}") from None
    if not p.exists():
        raise EncoderError(f"{p}: encoder path does not exist")
    if not p.is_dir():
        raise EncoderError(f"{p}: not a directory; an encoder is a Hugging Face model directory")
    if not (p / "config.json").is_file():
        raise EncoderError(f"{p}: not a Hugging Face model directory (no config.json)")
    try:
        config = transformers.AutoConfig.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:
        raise EncoderError(f"{p}: unreadable config.json ({exc})") from exc
    _check_encoder_config(p, config)
    if num_layers is not None:
        total = getattr(config, "num_hidden_layers", None)
        if not isinstance(total, int):
            raise EncoderError(f"{p}: config has no integer num_hidden_layers; its layers cannot be cut")
        if not 1 <= num_layers <= total:
            raise EncoderError(f"{p}: encoder layers must be 1..{total} (its layer count), got {num_layers}")
        config.num_hidden_layers = num_layers
    return p, config


def load_encoder(path: str | Path | None = None, num_layers: int | None = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` of a local Hugging Face encoder (default: the bundled MiniLM-L6;
    ``"minilm"`` and ``"mpnet"`` name the packaged encoders, see :func:`encoder_path`).

    ``num_layers`` keeps only the encoder's first layers (its embeddings and layers 1..n): a
    predictor fine-tuned on them scores in about n/N of the time.

    Raises :class:`EncoderError`, naming the path, when it is missing, not a model directory, a decoder
    or an encoder-decoder, or its weights or tokenizer cannot be loaded, or ``num_layers`` is not
    between 1 and its layer count. Never downloads.
    """
    transformers = _quiet_transformers()
    p, config = encoder_config(path, num_layers)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = transformers.AutoModel.from_pretrained(str(p), config=config, local_files_only=True)
    except Exception as exc:
        raise EncoderError(f"{p}: cannot load encoder weights ({type(exc).__name__}: {exc})") from exc
    if not any((p / name).is_file() for name in _TOKENIZER_FILES):
        raise EncoderError(f"{p}: cannot load a tokenizer (none of {', '.join(_TOKENIZER_FILES)})")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:
        raise EncoderError(f"{p}: cannot load a tokenizer ({type(exc).__name__}: {exc})") from exc
    if len(tokenizer) < 100:
        raise EncoderError(f"{p}: cannot load a tokenizer (only {len(tokenizer)} tokens found)")
    if not getattr(tokenizer, "is_fast", False):  # pragma: no cover - all supported encoders ship one
        raise EncoderError(f"{p}: needs a fast (Rust) tokenizer (tokenizer.json)")
    return model, tokenizer


def tokenize(tokenizer: Any, prompts: Sequence[str], max_length: int, truncation: str = "head") -> list[list[int]]:
    """Token ids per prompt (with special tokens, at most ``max_length``), unpadded. A longer prompt
    keeps, as ``truncation`` says (:data:`~headway.predict._finetune_recipe.TRUNCATIONS`), its first
    tokens (``head``, the tokenizer's own truncation) or its first and last halves (``head-tail``,
    :func:`head_tail`)."""
    if truncation == "head":
        enc = tokenizer(list(prompts), truncation=True, max_length=max_length, padding=False)
        return [list(ids) for ids in enc["input_ids"]]
    if truncation != "head-tail":
        raise ValueError(f"unknown truncation {truncation!r}; choose one of {', '.join(TRUNCATIONS)}")
    enc = tokenizer(list(prompts), truncation=False, padding=False, verbose=False)
    return [head_tail(list(ids), max_length) for ids in enc["input_ids"]]


def head_tail(ids: list[int], max_length: int) -> list[int]:
    """``ids`` (special tokens at both ends) cut to ``max_length``: the first token, the first half of
    the ``max_length - 2`` inner tokens kept, the last half, the last token."""
    if len(ids) <= max_length:
        return ids
    inner = max_length - 2
    head = (inner + 1) // 2
    tail = inner - head
    return ids[: 1 + head] + ids[len(ids) - 1 - tail :]


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Pad to the longest sequence of this batch (dynamic padding): ``(input_ids, attention_mask)``."""
    width = max(len(x) for x in ids)
    input_ids = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for row, seq in enumerate(ids):
        input_ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return input_ids, mask


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The attention-masked mean of ``hidden`` ``(batch, seq, dim)`` over its tokens (a row without
    tokens gives zeros)."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


class LengthPredictor(nn.Module):
    """Encoder + linear head; ``forward(input_ids, attention_mask)`` returns one score per row."""

    def __init__(self, encoder: nn.Module, pooling: str = "auto") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        has_pooler = getattr(encoder, "pooler", None) is not None
        if pooling == "auto":
            pooling = "pooler" if has_pooler else "cls"
        if pooling == "pooler" and not has_pooler:
            raise ValueError("pooling='pooler' but the encoder has no pooler")
        self.encoder = encoder
        self.pooling = pooling
        hidden = int(cast(Any, encoder).config.hidden_size)
        self.head = nn.Linear(hidden, 1)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    @property
    def hidden_size(self) -> int:
        return int(self.head.in_features)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Pooled features ``(batch, hidden)`` that the head scores."""
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        if self.pooling == "pooler":
            return cast(torch.Tensor, out.pooler_output)
        hidden = cast(torch.Tensor, out.last_hidden_state)
        if self.pooling == "cls":
            return hidden[:, 0]
        return mean_pool(hidden, attention_mask)

    def score_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.head(embeddings)).squeeze(-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.score_embeddings(self.embed(input_ids, attention_mask))


# ---------------------------------------------------------------------------------------------------------
# Checkpoints


@dataclass
class LoadedPredictor:
    """A checkpoint in memory: the model (eval mode), its tokenizer and its settings."""

    model: LengthPredictor
    tokenizer: Any
    meta: dict[str, Any]
    path: Path
    files_sha256: dict[str, str] = field(default_factory=dict)

    @property
    def max_length(self) -> int:
        """The checkpoint's ``max_length``, capped at what its encoder's positions cover (a checkpoint
        may ask for more, e.g. one trained on short prompts only)."""
        limit = position_limit(cast(Any, self.model.encoder).config)
        length = int(self.meta.get("max_length", 128))
        return length if limit is None else min(length, limit)


def _encoder_ref(encoder: str | Path | None, num_layers: int | None) -> dict[str, Any]:
    root = encoder_path(encoder).resolve()
    name = packaged_encoder_name(root)
    if name == "minilm":
        ref: dict[str, Any] = {"source": "default", "path": str(root)}
    elif name is not None:
        ref = {"source": "packaged", "name": name, "path": str(root)}
    else:
        ref = {"source": "path", "path": str(root)}
    if num_layers is not None:
        ref["num_layers"] = num_layers
    return ref


def check_checkpoint_target(out_dir: str | Path) -> Path:
    """``out_dir`` resolved, where :func:`save_checkpoint` may write a checkpoint: a new path, an empty
    directory or an existing checkpoint (which is replaced). Anything else raises :class:`CheckpointError`
    naming it, so that no file or directory that is not a checkpoint is ever deleted; so does a path
    whose nearest existing parent is not a writable directory. Training checks this before it starts."""
    out = Path(out_dir).expanduser().resolve()
    if out.exists():
        if not out.is_dir():
            raise CheckpointError(f"{out}: exists and is not a directory; a checkpoint would replace it")
        if not (out / _META).is_file() and any(out.iterdir()):
            raise CheckpointError(
                f"{out}: exists and is not a predictor checkpoint (no {_META}); a checkpoint would replace "
                "the directory and all it holds: choose a new or empty directory"
            )
    problem = unwritable(out.parent)
    if problem is not None:
        parent, why = problem
        raise CheckpointError(f"{out}: {parent} is not a directory" if why == "is not a directory" else
                              f"{out}: cannot write into {parent}")  # fmt: skip
    return out


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _make_readable(root: Path) -> None:
    """Give a checkpoint written under ``mkdtemp`` (0700) and by writers that make 0600 files the
    modes a directory and files made normally get (0777 and 0666 less the umask)."""
    mask = _umask()
    root.chmod(0o777 & ~mask)
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _swap_into_place(new: Path, out: Path) -> None:
    """Rename the directory ``new`` to ``out``. An existing ``out`` is first renamed aside, and deleted
    only once ``new`` is in place (put back if that fails): a failure never loses the old checkpoint."""
    if not out.exists():
        os.replace(new, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    os.replace(out, old)  # onto the empty directory just made
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(
    model: LengthPredictor,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    fine_tuned: bool,
    encoder_path: str | Path | None = None,
    encoder_layers: int | None = None,
    max_length: int = 128,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory atomically (a temporary sibling renamed into place). An existing
    checkpoint there is replaced; any other existing path is refused (:func:`check_checkpoint_target`).
    Weights that are not finite are refused (:class:`CheckpointError`): they would not load."""
    from safetensors.torch import save_file

    out = check_checkpoint_target(out_dir)
    tensors = {f"head.{k}": v.detach().clone().contiguous() for k, v in model.head.state_dict().items()}
    if fine_tuned:
        for k, v in model.encoder.state_dict().items():
            tensors[f"encoder.{k}"] = v.detach().clone().contiguous()
    for name, value in tensors.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{out}: not saved: tensor {name!r} has NaN or infinite values")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if fine_tuned:
            cast(Any, model.encoder).config.save_pretrained(str(tmp / "encoder"))
        save_file(tensors, str(tmp / _WEIGHTS), metadata={"format": CHECKPOINT_FORMAT})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer.save_pretrained(str(tmp / "tokenizer"))
        info: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "pooling": model.pooling,
            "hidden_size": model.hidden_size,
            "max_length": max_length,
            "encoder": {
                **_encoder_ref(encoder_path, encoder_layers),
                "fine_tuned": fine_tuned,
            },
            **(meta or {}),
            "files": {_WEIGHTS: file_sha256(tmp / _WEIGHTS)},
        }
        (tmp / _META).write_text(json.dumps(info, indent=2, sort_keys=False, default=str) + "\n")
        _make_readable(tmp)
        check_checkpoint_target(out)  # still nothing else there
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """``predictor.json`` of a checkpoint, validated for format and version."""
    p = Path(path).expanduser()
    if not p.is_dir():
        what = "is a file, not a checkpoint directory" if p.exists() else "checkpoint directory does not exist"
        raise CheckpointError(f"{p}: {what}")
    meta_path = p / _META
    if not meta_path.is_file():
        raise CheckpointError(f"{p}: not a predictor checkpoint (no {_META})")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{meta_path}: corrupt settings file ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{meta_path}: not a {CHECKPOINT_FORMAT} settings file")
    if meta.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{meta_path}: unsupported checkpoint version {meta.get('version')!r}")
    for key in ("pooling", "hidden_size", "encoder", "files"):
        if key not in meta:
            raise CheckpointError(f"{meta_path}: missing {key!r}")
    for key in ("hidden_size", "max_length"):
        value = meta.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{meta_path}: {key!r} must be a positive integer, got {value!r}")
    if not isinstance(meta["pooling"], str):
        raise CheckpointError(f"{meta_path}: 'pooling' must be a string, got {meta['pooling']!r}")
    return meta


def checkpoint_max_length(path: str | Path, meta: dict[str, Any]) -> int:
    """The ``max_length`` of a checkpoint (``meta``: its :func:`read_checkpoint_meta`) without loading it,
    capped as :attr:`LoadedPredictor.max_length` caps it, by the ``config.json`` of its encoder (its own
    when fine-tuned, else the frozen one's; uncapped when that cannot be read)."""
    length = int(meta.get("max_length", 128))
    enc = meta.get("encoder")
    enc = enc if isinstance(enc, dict) else {}
    config_file = Path(path) / "encoder" / "config.json"
    if not enc.get("fine_tuned"):
        try:  # a packaged encoder by the path it was found at (never unpacked here)
            root = encoder_path("minilm") if enc.get("source") == "default" else Path(str(enc.get("path")))
        except ModuleNotFoundError:
            return length
        config_file = root / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return length
    limit = position_limit(config) if isinstance(config, dict) else None
    return length if limit is None else min(length, limit)


def verify_checkpoint_files(path: str | Path, meta: dict[str, Any]) -> dict[str, str]:
    """Check every file listed in ``meta['files']`` against its SHA-256; return the hashes."""
    p = Path(path)
    files = meta.get("files")
    if not isinstance(files, dict) or _WEIGHTS not in files:
        raise CheckpointError(f"{p / _META}: no hash recorded for {_WEIGHTS}")
    for name, expected in files.items():
        f = p / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing checkpoint file")
        actual = file_sha256(f)
        if actual != expected:
            raise CheckpointError(
                f"{f}: SHA-256 mismatch (recorded {str(expected)[:12]}…, found {actual[:12]}…): "
                "the file is corrupt or was modified"
            )
    return {str(k): str(v) for k, v in files.items()}


def load_checkpoint(path: str | Path) -> LoadedPredictor:
    """Load a checkpoint written by :func:`save_checkpoint`, verifying it (see the module docstring)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    transformers = _quiet_transformers()
    p = Path(path).expanduser().resolve()
    meta = read_checkpoint_meta(p)
    hashes = verify_checkpoint_files(p, meta)
    try:
        tensors = load_file(str(p / _WEIGHTS))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{p / _WEIGHTS}: unreadable safetensors ({exc})") from exc
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{p / _WEIGHTS}: tensor {name!r} has NaN or infinite values")
    enc = meta["encoder"]
    if not isinstance(enc, dict):
        raise CheckpointError(f"{p / _META}: 'encoder' must be an object")
    fine_tuned = bool(enc.get("fine_tuned"))
    tok_dir = p / "tokenizer"
    tokenizer: Any = None
    if fine_tuned:
        cfg_dir = p / "encoder"
        if not (cfg_dir / "config.json").is_file():
            raise CheckpointError(f"{cfg_dir}: missing encoder config.json")
        try:
            config = transformers.AutoConfig.from_pretrained(str(cfg_dir), local_files_only=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                encoder = transformers.AutoModel.from_config(config)
        except Exception as exc:
            raise CheckpointError(f"{cfg_dir}: cannot build the encoder ({exc})") from exc
        enc_state = {k[len("encoder.") :]: v for k, v in tensors.items() if k.startswith("encoder.")}
        try:
            result = encoder.load_state_dict(enc_state, strict=False)
        except RuntimeError as exc:
            raise CheckpointError(f"{p / _WEIGHTS}: encoder weights do not fit ({exc})") from exc
        persistent = set(encoder.state_dict())
        missing = [k for k in result.missing_keys if k in persistent]
        if missing or result.unexpected_keys:
            raise CheckpointError(
                f"{p / _WEIGHTS}: encoder weights incomplete or foreign "
                f"(missing {missing[:3]}, unexpected {list(result.unexpected_keys)[:3]})"
            )
    else:
        source = enc.get("source")
        src = "minilm" if source == "default" else str(enc.get("name") if source == "packaged" else enc.get("path"))
        layers = enc.get("num_layers")
        if layers is not None and not isinstance(layers, int):
            raise CheckpointError(f"{p / _META}: encoder 'num_layers' must be an integer, got {layers!r}")
        try:
            encoder, tokenizer = load_encoder(src, layers)
        except EncoderError as exc:
            raise CheckpointError(f"{p}: its frozen encoder cannot be loaded: {exc}") from exc
    if tok_dir.is_dir():
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
        except Exception as exc:
            raise CheckpointError(f"{tok_dir}: cannot load the tokenizer ({exc})") from exc
    elif tokenizer is None:
        raise CheckpointError(f"{tok_dir}: missing tokenizer")
    try:
        model = LengthPredictor(encoder, pooling=str(meta["pooling"]))
    except ValueError as exc:
        raise CheckpointError(f"{p / _META}: {exc}") from exc
    if model.hidden_size != int(meta["hidden_size"]):
        raise CheckpointError(f"{p}: encoder hidden size {model.hidden_size} != checkpoint's {meta['hidden_size']}")
    head_state = {k[len("head.") :]: v for k, v in tensors.items() if k.startswith("head.")}
    try:
        model.head.load_state_dict(head_state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{p / _WEIGHTS}: head weights missing or wrong shape ({exc})") from exc
    model.eval()
    return LoadedPredictor(model, tokenizer, meta, p, hashes)
