"""``python -m headway.predict ...``: help, eval on generic JSONL, clear errors."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from headway.predict._cli import main


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["matrix"], ["export-onnx"]])
def test_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["predictor", *command, "--help"])
    assert info.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["train", "matrix"])
def test_help_states_each_default_once(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["predictor", command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "pair-set size (default 10000)" in text
    assert not re.search(r"\(default[^)]*\) \(default", text)


def test_eval_on_generic_jsonl_and_bad_input(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint

    encoder, tokenizer = load_encoder(tiny_encoder)
    ck = save_checkpoint(LengthPredictor(encoder), tokenizer, tmp_path / "ck", fine_tuned=True)
    assert main(["predictor", "eval", "--model", str(ck), "--data", str(synthetic_jsonl)]) == 0
    out = capsys.readouterr().out
    assert "Kendall tau_b" in out and "Spearman" in out and "pair accuracy" in out
    assert "tokens (as given)" in out and "|a-b|/max(a,b) >= 0.2" in out

    assert main(["predictor", "eval", "--model", str(ck), "--data", str(synthetic_jsonl), "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["all"]["n"] == 120

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok", "output_tokens": 3}\n{"prompt": "x", "output_tokens": 0}\n')
    assert main(["predictor", "eval", "--model", str(ck), "--data", str(bad)]) == 2
    assert f"{bad}:2: 'output_tokens' must be positive" in capsys.readouterr().err

    assert main(["predictor", "eval", "--model", str(tmp_path / "nope"), "--data", str(synthetic_jsonl)]) == 2
    assert "checkpoint directory does not exist" in capsys.readouterr().err

    not_encoder = tmp_path / "not-an-encoder"
    not_encoder.mkdir()
    code = main(
        [
            "predictor",
            "train",
            "--data",
            str(synthetic_jsonl),
            "--encoder",
            str(not_encoder),
            "--out",
            str(tmp_path / "x"),
            "--no-progress",
        ]
    )
    assert code == 2
    assert f"{not_encoder}: not a Hugging Face model directory" in capsys.readouterr().err


def test_eval_on_a_log_of_several_models_says_the_headline_is_pooled_and_gives_the_mean_per_model(
    tmp_path: Path, tiny_encoder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint

    from .conftest import synthetic_records

    encoder, tokenizer = load_encoder(tiny_encoder)
    ck = save_checkpoint(LengthPredictor(encoder), tokenizer, tmp_path / "ck", fine_tuned=True)
    base = synthetic_records(40)  # the same prompts answered by two models, one ten times longer
    records = [{**r, "model": "short"} for r in base]
    records += [{**r, "model": "long", "output_tokens": 10 * int(str(r["output_tokens"]))} for r in base]
    log = tmp_path / "two-models.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["predictor", "eval", "--model", str(ck), "--data", str(log), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "[all], the 2 models' answers pooled (pairs across models too; per model below):" in out
    taus = [float(t) for t in re.findall(r"^  (?:short|long) .* tau_b (-?[0-9.]+)", out, flags=re.M)]
    mean = re.search(r"^  mean over the 2 models +tau_b (-?[0-9.]+)  Spearman", out, flags=re.M)
    assert len(taus) == 2 and mean is not None
    assert float(mean.group(1)) == pytest.approx(sum(taus) / 2, abs=1e-4)


def test_eval_on_the_training_data_says_all_counts_the_training_prompts(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    ck = tmp_path / "ck"
    assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--out", str(ck)) == 0
    capsys.readouterr()
    note = "--split all counts the prompts it trained on; --split test scores only those it held out"
    assert main(["predictor", "eval", "--model", str(ck), "--data", str(synthetic_jsonl), "--no-progress"]) == 0
    assert f"note: {ck} was trained on a data set named synthetic.jsonl: {note}" in capsys.readouterr().out
    eval_test = ["predictor", "eval", "--model", str(ck), "--data", str(synthetic_jsonl), "--split", "test"]
    assert main([*eval_test, "--no-progress"]) == 0
    assert note not in capsys.readouterr().out  # held-out prompts only: nothing to warn of


def test_training_another_encoder_needs_a_checkpoint_name(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["predictor", "train", "--data", str(synthetic_jsonl), "--encoder", str(tiny_encoder), "--no-progress"])
    assert code == 2
    assert "name the checkpoint with --name or --out" in capsys.readouterr().err


def test_training_on_other_data_needs_a_checkpoint_name(
    synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headway.predict._paths import DEFAULT_PREDICTOR_NAME, default_predictor_dir

    default = default_predictor_dir(DEFAULT_PREDICTOR_NAME)
    existed = default.exists()
    code = main(["predictor", "train", "--data", str(synthetic_jsonl), "--mode", "frozen", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--data {synthetic_jsonl}: name the checkpoint with --name or --out" in err
    assert "pars.scorer=default" in err
    assert default.exists() == existed  # refused before anything was written


def _train(tmp_path: Path, data: Path, encoder: Path, *extra: str) -> int:
    base = ["train", "--data", str(data), "--encoder", str(encoder), "--mode", "frozen", "--epochs", "2"]
    return main([*base, "--max-length", "32", "--no-progress", "--threads", "1", *extra])


def test_standalone_main_takes_the_commands_with_or_without_predictor(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0 and "usage: python -m headway.predict train" in capsys.readouterr().out
    for prefix in ([], ["predictor"]):  # benchmark reports record the older form
        code = main([*prefix, "train", "--data", str(synthetic_jsonl), "--epochs", "0", "--out", str(tmp_path / "x")])
        assert code == 2
        assert capsys.readouterr().err == "headway: error: --epochs must be >= 1, got 0\n"
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--partners", "0"], "--partners must be >= 1, got 0"),
        (["--pairs-from", "global", "--max-pairs", "0"], "--max-pairs must be >= 1, got 0"),
        (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
        (["--head-lr", "-1"], "--head-lr must be a finite number > 0, got -1.0"),
        (["--margin", "-1"], "--margin must be a finite number >= 0, got -1.0"),
        (["--seed", "-1"], "--seed must be in 0..4294967295, got -1"),
        (["--max-length", "600"], "max_length 600 is more than the encoder"),
        (["--encoder-layers", "0"], "--encoder-layers must be >= 1, got 0"),
        (["--test-frac", "1"], "--test-frac and --val-frac must be in [0, 1) and sum below 1, got 1.0 and 0.1"),
    ],
)
def test_train_options_that_would_harm_are_errors(
    tmp_path: Path,
    tiny_encoder: Path,
    synthetic_jsonl: Path,
    capsys: pytest.CaptureFixture[str],
    option: list[str],
    message: str,
) -> None:
    assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--out", str(tmp_path / "ck"), *option) == 2
    err = capsys.readouterr().err
    assert err.startswith("headway: error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "ck").exists()


def test_train_never_replaces_what_is_not_a_checkpoint(
    tmp_path: Path,
    tiny_encoder: Path,
    synthetic_jsonl: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    precious, a_file = tmp_path / "precious", tmp_path / "afile"
    precious.mkdir()
    (precious / "thesis.tex").write_text("keep me")
    a_file.write_text("keep me")
    for out in (precious, a_file):
        assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--out", str(out)) == 2
        assert capsys.readouterr().err.startswith(f"headway: error: --out {out}: {out}: exists and is not a ")
    monkeypatch.chdir(precious)
    assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--out", ".") == 2
    assert "exists and is not a predictor checkpoint" in capsys.readouterr().err
    assert [f.name for f in precious.iterdir()] == ["thesis.tex"] and a_file.read_text() == "keep me"
    assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--out", str(tmp_path / "ck")) == 0
    assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--out", str(tmp_path / "ck"), "--epochs", "1") == 0
    assert json.loads((tmp_path / "ck" / "predictor.json").read_text())["training"]["epochs"] == 1  # replaced


def test_training_the_cache_default_says_it_replaces_the_shipped_predictor(
    tmp_path: Path,
    tiny_encoder: Path,
    synthetic_jsonl: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from headway.predict._paths import DEFAULT_PREDICTOR_NAME, default_predictor_dir
    from headway.predict.score import default_scorer
    from headway.predict.shipped import ShippedPredictor

    monkeypatch.setenv("HEADWAY_CACHE_DIR", str(tmp_path / "cache"))  # (the session's cache keeps the shipped one)
    assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--out", str(tmp_path / "elsewhere")) == 0
    assert "instead of the predictor shipped" not in capsys.readouterr().out
    assert isinstance(default_scorer("onnx", threads=1), ShippedPredictor)
    assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--name", DEFAULT_PREDICTOR_NAME) == 0
    out = capsys.readouterr().out
    assert "--scorer default and pars.scorer=default now load this checkpoint instead of the predictor shipped" in out
    assert f"remove {default_predictor_dir(DEFAULT_PREDICTOR_NAME)} to go back" in out
    assert not isinstance(default_scorer("onnx", threads=1), ShippedPredictor)  # as it says


@pytest.mark.parametrize("name", ["..", ".", "", "../../x", "/abs"])
def test_train_name_must_be_a_plain_name(
    tmp_path: Path, tiny_encoder: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert _train(tmp_path, synthetic_jsonl, tiny_encoder, "--name", name) == 2
    assert capsys.readouterr().err.startswith(f"headway: error: --name: predictor name {name!r} must be a plain")


@pytest.fixture
def checkpoint(tmp_path: Path, tiny_encoder: Path) -> Path:
    torch = pytest.importorskip("torch")
    from headway.predict.model import LengthPredictor, load_encoder, save_checkpoint

    torch.manual_seed(0)
    encoder, tokenizer = load_encoder(tiny_encoder)
    model = LengthPredictor(encoder, "mean")
    torch.nn.init.normal_(model.head.weight, std=1.0)  # scores that spread, as a trained head's
    return save_checkpoint(model, tokenizer, tmp_path / "ck", fine_tuned=True, max_length=32)


def test_eval_checks_delta_and_shows_progress(
    checkpoint: Path, synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for delta in ("5", "-1", "1"):
        assert main(["eval", "--model", str(checkpoint), "--data", str(synthetic_jsonl), "--delta", delta]) == 2
        assert f"headway: error: --delta must be in [0, 1), got {float(delta)}" in capsys.readouterr().err
    assert main(["eval", "--model", str(checkpoint), "--data", str(synthetic_jsonl), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["all"]["n"] == 120 and captured.err == ""  # no bar in a log file
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # stderr a terminal: the bar
    assert main(["eval", "--model", str(checkpoint), "--data", str(synthetic_jsonl), "--json"]) == 0
    assert "scoring" in capsys.readouterr().err
    assert main(["eval", "--model", str(checkpoint), "--data", str(synthetic_jsonl), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_training_bars_show_on_a_terminal_only(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tqdm")
    from headway.predict._embed import progress_bar

    def run() -> str:
        bar = progress_bar(3, "train pairwise/full", True)
        for _ in range(3):
            bar.update(1)
        bar.close()
        return capsys.readouterr().err

    assert run() == ""  # stderr to a file or pipe: no carriage-return bars piling up in it
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert "train pairwise/full" in run()


def test_export_onnx_errors_and_int8_beside_out(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxruntime")
    for opset in ("0", "9", "99"):
        assert main(["export-onnx", "--model", str(checkpoint), "--opset", opset]) == 2
        err = capsys.readouterr().err
        assert re.fullmatch(rf"headway: error: opset must be 14\.\.\d+ \(.*\), got {opset}\n", err)
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    assert main(["export-onnx", "--model", str(checkpoint), "--out", str(a_dir)]) == 2
    assert f"headway: error: {a_dir}: is a directory" in capsys.readouterr().err
    assert list(a_dir.iterdir()) == [] and sorted(f.name for f in tmp_path.iterdir()) == ["a-dir", "ck"]
    files = sorted(f.name for f in checkpoint.iterdir())
    out = tmp_path / "exports" / "tiny.onnx"
    assert main(["export-onnx", "--model", str(checkpoint), "--out", str(out), "--int8"]) == 0
    assert f"quantized {tmp_path / 'exports' / 'tiny.int8.onnx'}" in capsys.readouterr().out
    assert sorted(f.name for f in out.parent.iterdir()) == ["tiny.int8.onnx", "tiny.onnx"]
    assert sorted(f.name for f in checkpoint.iterdir()) == files  # nothing written into the checkpoint


def test_matrix_refuses_a_checkpoint_for_a_loss_it_does_not_train(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["matrix", "--losses", "pairwise", "--use-checkpoint", f"pointwise={tmp_path}", "--no-progress"])
    assert code == 2
    assert capsys.readouterr().err.startswith("headway: error: --use-checkpoint pointwise=...: pointwise is not among")


@pytest.mark.parametrize("command", ["matrix", "cross-source", "cross-source-finetune"])
def test_a_table_file_that_cannot_be_written_is_refused_before_the_run(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr("headway.predict.evaluate.cross_model_matrix", no_run)
    monkeypatch.setattr("headway.predict.crosssource.load_source", no_run)
    (tmp_path / "file").write_text("")
    for out, message in [
        (tmp_path, f"--out {str(tmp_path)!r}: is a folder; give the Markdown file's path"),
        (tmp_path / "file" / "t.md", f"--out {tmp_path / 'file' / 't.md'}: {tmp_path / 'file'} is not a directory"),
    ]:
        assert main([command, "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"headway: error: {message}\n"


def test_matrix_refuses_empty_losses(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("headway.predict.evaluate.cross_model_matrix", lambda *a, **k: pytest.fail("it ran"))
    assert main(["matrix", "--losses", ",", "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("headway: error: --losses names no loss (',')")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--features", "text,bogus"], "--features: unknown feature set 'bogus'"),
        (["--alphas", "1,x"], "--alphas: comma-separated numbers, got '1,x'"),
        (["--alphas", "0"], "--alphas: positive numbers, got '0'"),
        (["--weightings", "equal,cube"], "--weightings: unknown weighting 'cube'; choose from equal, sqrt"),
        (["--heads", "ridge,gbdt"], "--heads: unknown 'gbdt'; choose from ridge, ranknet, mlp"),
        (["--targets", ","], "--targets: choose at least one of rank, zlog"),
        (["--encoder", "mpnet", "--save-head", "x.npz"], "cannot be packed with the shipped predictor's MiniLM"),
        (["--sharegpt-extra", "-1"], "--sharegpt-extra: a count >= 0, got -1"),
        (["--mlp-decays", "0.01,-1"], "--mlp-decays: positive numbers, got '0.01,-1'"),
    ],
)
def test_cross_source_names_bad_options(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cross-source", *args]) == 2
    assert message in capsys.readouterr().err


def test_cross_source_packed_checkpoint_resolves_packaged_names_and_names_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headway.predict._cli_common import _packed_file
    from headway.predict.shipped import ALPACA_PREDICTOR, shipped_predictor_path

    assert _packed_file(ALPACA_PREDICTOR) == shipped_predictor_path(ALPACA_PREDICTOR)
    own = tmp_path / ALPACA_PREDICTOR  # a file of that name here is taken as given
    own.write_bytes(b"")
    assert _packed_file(str(own)) == own
    missing = tmp_path / "nope.npz"
    # the error comes before any source is loaded or embedded
    assert main(["predictor", "cross-source", "--checkpoint", str(missing), "--data-dir", str(tmp_path)]) == 2
    assert f"--checkpoint {missing}: no such packed predictor" in capsys.readouterr().err
    assert main(["predictor", "cross-source", "--checkpoint", str(own), "--data-dir", str(tmp_path)]) == 2
    assert f"{own}: not a packed predictor" in capsys.readouterr().err  # an empty file, refused as early


def test_eval_takes_the_default_the_shipped_and_a_packed_predictor(
    synthetic_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the default predictor (nothing trained into this test's cache: the shipped one), by the names
    # pars.scorer=default and cross-source --checkpoint use; its figures are its own scores' figures
    from headway.predict.data import load_dataset
    from headway.predict.evaluate import rank_metrics
    from headway.predict.shipped import ShippedPredictor

    shipped = ShippedPredictor()
    data = load_dataset(str(synthetic_jsonl), "tokens")
    want = rank_metrics(shipped.score(data.prompts()), data.lengths(), 0.2, data.unit_label).kendall_tau_b
    for model in ("default", "shipped", "pars-minilm-default.npz"):  # (the shipped pack, by its name)
        argv = ["predictor", "eval", "--model", model, "--data", str(synthetic_jsonl), "--json", "--no-progress"]
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["all"]["kendall_tau_b"] == pytest.approx(want, abs=1e-6)
    assert main(["predictor", "eval", "--model", "shipped", "--data", str(synthetic_jsonl), "--no-progress"]) == 0
    sources = ", ".join(shipped.trained_on)
    assert f"predictor shipped (trained on {sources}, backend onnx (packed))" in capsys.readouterr().out
    # a packed predictor has no prompt split to evaluate on; a missing pack is named
    assert main(["predictor", "eval", "--model", "shipped", "--data", str(synthetic_jsonl), "--split", "test"]) == 2
    assert "--split test needs a checkpoint directory's prompt split" in capsys.readouterr().err
    assert main(["predictor", "eval", "--model", "nope.npz", "--data", str(synthetic_jsonl)]) == 2
    assert "--model nope.npz: no such packed predictor" in capsys.readouterr().err


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_command_ends_with_one_line_and_the_conventional_status(sig: str) -> None:
    # as `headway predictor` does: Ctrl-C is 130, SIGTERM unwinds the command (its cleanup runs) and then
    # ends the process by the signal; one line either way, no traceback
    import signal
    import subprocess

    from headway.integrations._server import headway_src_dir

    code = (
        "import os, signal, sys, time\n"
        "import headway.predict._cli as cli\n"
        "def run(args):\n"
        f"    os.kill(os.getpid(), signal.{sig})\n"
        "    time.sleep(30)\n"
        "    return 0\n"
        "cli._cmd_train = run\n"
        "sys.exit(cli.main(['train']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(headway_src_dir()), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    want = (130, "headway: interrupted") if sig == "SIGINT" else (-signal.SIGTERM, "headway: terminated")
    assert (done.returncode, done.stderr.strip()) == want, done.stderr
