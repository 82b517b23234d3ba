"""Fixtures for predictor tests: the shared data, a tiny random BERT encoder, synthetic learnable data."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir(data_dir: Path) -> Path:
    """The shared data folder (tests/conftest.py), which the predictor tests need with alpaca_eval."""
    if not (data_dir / "alpaca_eval").is_dir():
        msg = f"shared data folder {data_dir} has no alpaca_eval (set HEADWAY_DATA_DIR to run real-data tests)"
        pytest.skip(msg)
    return data_dir


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep checkpoints and embedding caches of tests out of the user's ~/.cache."""
    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "headway-cache"))


def make_tiny_encoder(out: Path, layers: int = 1) -> Path:
    """A random BERT (32 wide, ``layers`` layers) with the bundled MiniLM's uncased WordPiece tokenizer."""
    transformers = pytest.importorskip("transformers")
    import torch

    from headway.predict import default_encoder_path

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    transformers.BertModel(config).save_pretrained(str(out))
    src = default_encoder_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / name, out / name)
    return out


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer, 32-wide random BERT with the bundled MiniLM's uncased WordPiece tokenizer."""
    pytest.importorskip("torch")
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_encoder_3_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same with 3 layers (for cutting layers)."""
    pytest.importorskip("torch")
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny-bert-3"), layers=3)


TOPICS = [
    "the ocean",
    "a cat",
    "climate policy",
    "medieval castles",
    "quantum physics",
    "baking bread",
    "the stock market",
    "a rainy day",
    "jazz music",
    "mountain hiking",
    "the moon",
    "old trains",
    "coffee",
    "a lighthouse",
    "volcanoes",
    "chess openings",
    "ancient rome",
    "gardening",
    "robots",
    "the desert",
    "friendship",
    "electric cars",
    "bees",
    "snow",
    "libraries",
    "tea ceremonies",
    "football",
    "rivers",
    "painting",
    "birds",
    "cities at night",
    "the internet",
    "honey",
    "glaciers",
    "pirates",
    "mathematics",
    "a small village",
    "dinosaurs",
    "recycling",
    "the piano",
]


def synthetic_records(n: int = 120, seed: int = 0) -> list[dict[str, object]]:
    """Prompts whose output length is driven by their wording (learnable from the text)."""
    rng = random.Random(seed)
    templates = [
        ("Answer with one word: is {} nice?", 3),
        ("Give a yes or no answer about {}.", 4),
        ("Write a short sentence about {}.", 20),
        ("Write a detailed essay about {} with many sections and examples.", 600),
        ("Write a long story about {}, in several chapters.", 900),
    ]
    out = []
    for i in range(n):
        template, base = templates[i % len(templates)]
        topic = TOPICS[(i // len(templates)) % len(TOPICS)]
        length = max(1, int(base * rng.uniform(0.7, 1.3)))
        out.append({"prompt": template.format(topic) + f" ({i})", "output_tokens": length, "model": "synth"})
    return out


@pytest.fixture
def synthetic_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "synthetic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records()))
    return path
