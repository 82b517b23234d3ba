"""The torch-free encoder: the ONNX graph built from safetensors embeds as the torch model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headway.predict.encoder import OnnxEncoder, build_encoder_onnx

PROMPTS = ["Write a haiku.", "Explain quicksort step by step, with code in Python and its complexity. " * 5, "hi"]


def test_onnx_encoder_matches_torch_mean_pooling(tiny_encoder_3_layers: Path) -> None:
    torch = pytest.importorskip("torch")
    from headway.predict.model import LengthPredictor, load_encoder, pad_batch, tokenize

    enc = OnnxEncoder(tiny_encoder_3_layers, max_length=32, threads=1, batch_size=2)
    got = enc.embed(PROMPTS)
    model, tok = load_encoder(tiny_encoder_3_layers)
    lp = LengthPredictor(model, "mean").eval()
    ids = tokenize(tok, PROMPTS, 32)
    assert ids == enc.token_ids(PROMPTS)
    input_ids, mask = pad_batch(ids, 0)
    with torch.inference_mode():
        want = lp.embed(torch.from_numpy(input_ids), torch.from_numpy(mask)).numpy()
    assert got.shape == (3, 32)
    assert np.allclose(got, want, atol=1e-5)
    assert len(enc.token_ids(PROMPTS)[1]) == 32  # cut to max_length


def test_build_rejects_a_folder_without_weights(tmp_path: Path, tiny_encoder: Path) -> None:
    (tmp_path / "config.json").write_text((tiny_encoder / "config.json").read_text())
    with pytest.raises(ValueError, match=r"no model\.safetensors"):
        build_encoder_onnx(tmp_path, tmp_path / "x.onnx")


def test_build_refuses_more_layers_than_the_weights_have(tmp_path: Path, tiny_encoder_3_layers: Path) -> None:
    from headway.predict._errors import EncoderError

    with pytest.raises(EncoderError, match="4 encoder layers asked for, the weights have 3"):
        build_encoder_onnx(tiny_encoder_3_layers, tmp_path / "x.onnx", num_layers=4)


def test_embed_batches_by_padding_cost_not_by_arrival(tiny_encoder_3_layers: Path) -> None:
    """A few long prompts run in their own pass instead of padding the short ones (the gateway's
    scoring batches mix them), and the vectors are those of one prompt at a time."""
    from headway.predict._chunks import _padding_chunks

    enc = OnnxEncoder(tiny_encoder_3_layers, max_length=32, threads=1, batch_size=32)
    prompts = ["hi there"] * 12 + [PROMPTS[1]] * 2 + ["Write a haiku."] * 12
    widths: list[tuple[int, int]] = []
    run = enc._session.run

    def spy(names, feeds):  # type: ignore[no-untyped-def]
        widths.append(feeds["input_ids"].shape)
        return run(names, feeds)

    enc._session.run = spy  # type: ignore[method-assign]
    got = enc.embed(prompts)
    lengths = sorted(len(t) for t in enc.token_ids(prompts))
    chunks = _padding_chunks(lengths, 32)
    assert len(chunks) > 1  # the two long prompts are not in the short ones' pass
    assert widths == [(b - a, lengths[b - 1]) for a, b in chunks]
    alone = np.concatenate([enc.embed([p]) for p in prompts])
    assert np.allclose(got, alone, atol=1e-5)


def test_torch_encoder_embeds_as_the_onnx_one(tiny_encoder_3_layers: Path) -> None:
    """The frozen torch encoder (for encoders the ONNX builder does not take, such as MPNet) pools as the
    ONNX graph does, whatever the batching: each prompt alone gives its row of the batched call."""
    pytest.importorskip("torch")
    from headway.predict._torch_encoder import TorchEncoder

    onnx_enc = OnnxEncoder(tiny_encoder_3_layers, max_length=32, threads=1, batch_size=2)
    torch_enc = TorchEncoder(tiny_encoder_3_layers, max_length=32, threads=1, batch_size=2)
    got = torch_enc.embed(PROMPTS)
    assert got.shape == (3, 32) and got.dtype == np.float32
    assert np.allclose(got, onnx_enc.embed(PROMPTS), atol=1e-5)
    alone = np.vstack([torch_enc.embed([p]) for p in PROMPTS])
    assert np.allclose(got, alone, atol=1e-5)
    assert torch_enc.embed([]).shape == (0, 32)
    with pytest.raises(ValueError, match="max_length must be >= 2, got 1"):
        TorchEncoder(tiny_encoder_3_layers, max_length=1)
