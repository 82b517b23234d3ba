"""Engine-step times of a Llama-3-8B-shaped decoder on one GPU (plain PyTorch, random weights).

Builds a decoder of Llama-3-8B's shape (32 layers, hidden 4096, 32 query / 8 KV heads, SwiGLU
intermediate 14336, vocabulary 128256, RMSNorm, RoPE) with random weights, and times with CUDA
events (warm-up runs, then the median of several) the three kinds of step vLLM V1 runs:

- ``prefill``: a chunk of N prompt tokens, from the prompt's start or after ``prefix`` tokens of it
  already in the KV cache (causal attention over the prefix and its own tokens);
- ``decode``: B sequences generating one token each, attending over a KV cache of C tokens
  (the new one included), with ``torch.nn.functional.scaled_dot_product_attention``;
- ``mixed``: such a prefill chunk plus B decodes at context C in one step, as vLLM V1's chunked
  prefill builds a step (the linear layers run on all tokens at once).

Every step ends as an engine step does: logits for the last token of each sequence and a greedy
pick, then a device synchronization (vLLM reads the sampled tokens back each step). Steps of at
most ``--graph-max-tokens`` tokens are captured and replayed as CUDA graphs, as vLLM does up to its
``max_cudagraph_capture_size`` (512 by default); larger ones run eagerly. What is timed is the
model's forward pass and the pick only: the engine's CPU work (scheduling, input preparation,
detokenizing) is not in it.

Each point is written with its composition in the simulator's terms (``num_tokens``,
``num_seqs``, ``num_kv_tokens``: the context after the step's tokens), so that
``headway calibrate --from-timings FILE`` fits the simulator's step-time model to it and compares
it with the built-in preset. Needs only python3 and torch (no headway): it is meant to be copied
to a machine with a GPU and run once::

    python3 benchmarks/bench_gpu_steps.py --out $OUT/gpu_steps.json --budget-s 300

``--budget-s`` stops adding points once that much time has passed since the start (the points not
run are listed in the file); the JSON is rewritten after every point, so a run cut short keeps
what it measured; a step that fails (out of memory) is listed as skipped and the run goes on. With
``--device cpu`` and a tiny shape (``--layers 2 --hidden 128 ...``) it runs on a CPU in seconds, for
tests. The attention kernels are torch's (SDPA; a chunk after cached prompt tokens with torch's
lower-right causal bias, which its fused kernels run, where torch has it), not vLLM's, and the
elementwise operations are not fused as in vLLM's compiled model.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

FORMAT = "headway-gpu-step-times/1"

try:  # torch >= 2.3: a chunk's causal mask after its cached prefix, run by SDPA's fused kernels
    from torch.nn.attention.bias import causal_lower_right as _causal_lower_right
except ImportError:  # pragma: no cover - older torch: a boolean mask
    _causal_lower_right = None


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder's dimensions (the defaults are Llama-3-8B's)."""

    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    vocab: int = 128256
    rope_theta: float = 500000.0
    eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"--hidden {self.hidden} must split into {self.heads} heads of an even size")
        if self.heads % self.kv_heads:
            raise ValueError(f"--heads {self.heads} must be a multiple of --kv-heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def params(self) -> int:
        """Parameters: embedding, LM head, and per layer the attention and MLP projections and two norms."""
        d = self.head_dim
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * d + self.heads * d * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return 2 * self.vocab * self.hidden + self.layers * (attn + mlp + 2 * self.hidden) + self.hidden

    def kv_bytes_per_token(self, element_size: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element_size


@dataclass(frozen=True)
class Step:
    """One engine step: ``batch`` decoding sequences at ``context`` tokens plus a prefill ``chunk`` of a
    prompt whose first ``prefix`` tokens are in the KV cache already."""

    kind: str
    batch: int
    context: int
    chunk: int
    prefix: int = 0

    @property
    def num_tokens(self) -> int:
        return self.batch + self.chunk

    @property
    def num_seqs(self) -> int:
        return self.batch + (1 if self.chunk else 0)

    @property
    def num_kv_tokens(self) -> int:
        """KV tokens the step's attention reads: each sequence's context after the step's tokens."""
        return self.batch * self.context + (self.prefix + self.chunk if self.chunk else 0)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "batch": self.batch, "context": self.context, "chunk": self.chunk,
            "prefix": self.prefix, "num_tokens": self.num_tokens, "num_seqs": self.num_seqs,
            "num_kv_tokens": self.num_kv_tokens,
        }  # fmt: skip

    def label(self) -> str:
        return (f"{self.kind:7} batch {self.batch:4} context {self.context:5} chunk {self.chunk:5} "
                f"prefix {self.prefix:5}")  # fmt: skip


def plan(
    prefill: Sequence[int], batches: Sequence[int], contexts: Sequence[int], mixed_chunks: Sequence[int],
    mixed_batches: Sequence[int], mixed_context: int, prefixes: Sequence[int] = (0,),
) -> list[Step]:  # fmt: skip
    """The steps to time, the three kinds interleaved (small first) so that a run stopped by its
    budget still has some of each."""
    kinds = [
        [Step("prefill", 0, 0, n, p) for p in sorted(prefixes) for n in sorted(prefill)],
        [Step("decode", b, c, 0) for c in sorted(contexts) for b in sorted(batches)],
        [
            Step("mixed", b, mixed_context, n, p)
            for p in sorted(prefixes)
            for n in sorted(mixed_chunks)
            for b in sorted(mixed_batches)
        ],
    ]
    out: list[Step] = []
    for i in range(max(len(k) for k in kinds)):
        out += [k[i] for k in kinds if i < len(k)]
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x`` [tokens, heads, head_dim]; cos, sin [tokens, 1, half]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Decoder:
    """Random-weight Llama-style decoder with a KV cache of ``kv_tokens`` tokens per layer."""

    def __init__(
        self, shape: ModelShape, device: torch.device, dtype: torch.dtype, kv_tokens: int, max_pos: int, seed: int
    ):
        self.shape, self.device, self.dtype = shape, device, dtype
        gen = torch.Generator(device=device).manual_seed(seed)
        s, d = shape, shape.head_dim

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, device=device, dtype=dtype, generator=gen).mul_(cols**-0.5)

        self.embed = weight(s.vocab, s.hidden)
        self.lm_head = weight(s.vocab, s.hidden)
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.layers = [
            {
                "ln1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": weight((s.heads + 2 * s.kv_heads) * d, s.hidden),  # fused, as vLLM's QKVParallelLinear
                "o": weight(s.hidden, s.heads * d),
                "ln2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": weight(2 * s.intermediate, s.hidden),  # fused, as vLLM's MergedColumnParallelLinear
                "down": weight(s.hidden, s.intermediate),
            }
            for _ in range(s.layers)
        ]
        per_layer = kv_tokens * s.kv_heads * d
        self.k_cache = [torch.zeros(per_layer, device=device, dtype=dtype) for _ in range(s.layers)]
        self.v_cache = [torch.zeros(per_layer, device=device, dtype=dtype) for _ in range(s.layers)]
        self.kv_tokens = kv_tokens
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(max_pos, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = ang.cos().to(dtype), ang.sin().to(dtype)

    def _prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
        """Causal attention of a prompt chunk: q [n, heads, d] over k and v [prefix + n, kv_heads, d] ->
        [n, heads * d]; ``mask`` the chunk's causal mask after its prefix (None without a prefix:
        ``is_causal``): torch's lower-right causal bias, which SDPA runs with its flash or memory-efficient
        kernels as an engine's attention runs a chunk after cached tokens, or, on a torch without it, a
        boolean [n, prefix + n] mask (which SDPA runs with slower kernels).

        Each KV head is repeated for its query group (a copy of the chunk's and its prefix's KV, estimated
        at about 1 % of an 8,192-token prefill step, not measured) rather than passed with ``enable_gqa``:
        that takes torch 2.5 or later, and a backend that may fall back to the quadratic-memory math kernel."""
        n, heads, d = q.shape
        group = heads // k.shape[1]
        qt = q.transpose(0, 1).unsqueeze(0)
        kt, vt = (x.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0) for x in (k, v))
        if mask is None:
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
        return o[0].transpose(0, 1).reshape(n, heads * d)

    def forward(self, step: Step, ids: torch.Tensor, pos: torch.Tensor, last: torch.Tensor, mask: Any) -> torch.Tensor:
        """One step: ``ids``/``pos`` [num_tokens] (decodes first, then the chunk), ``last`` [num_seqs] the
        rows whose logits are returned, ``mask`` the chunk's attention mask (:meth:`inputs`)."""
        s, d = self.shape, self.shape.head_dim
        b, c, n, p = step.batch, step.context, step.chunk, step.prefix
        t = step.num_tokens
        group = s.heads // s.kv_heads
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        for i, w in enumerate(self.layers):
            h = _rms_norm(x, w["ln1"], s.eps)
            q, k, v = F.linear(h, w["qkv"]).split([s.heads * d, s.kv_heads * d, s.kv_heads * d], dim=-1)
            q = _rope(q.view(t, s.heads, d), cos, sin)
            k = _rope(k.view(t, s.kv_heads, d), cos, sin)
            v = v.view(t, s.kv_heads, d)
            parts = []
            if b:
                kc = self.k_cache[i][: b * s.kv_heads * c * d].view(b, s.kv_heads, c, d)
                vc = self.v_cache[i][: b * s.kv_heads * c * d].view(b, s.kv_heads, c, d)
                kc[:, :, c - 1] = k[:b]  # the new token's KV joins the cache
                vc[:, :, c - 1] = v[:b]
                qd = q[:b].reshape(b, s.kv_heads, group, d)  # a query group shares its KV head
                parts.append(F.scaled_dot_product_attention(qd, kc, vc).reshape(b, s.heads * d))
            if n:  # the chunk's KV joins its prompt's prefix in the cache, after the decodes'
                off, size = b * c * s.kv_heads * d, (p + n) * s.kv_heads * d
                kp = self.k_cache[i][off : off + size].view(p + n, s.kv_heads, d)
                vp = self.v_cache[i][off : off + size].view(p + n, s.kv_heads, d)
                kp[p:] = k[b:]
                vp[p:] = v[b:]
                parts.append(self._prefill_attention(q[b:], kp, vp, mask))
            a = parts[0] if len(parts) == 1 else torch.cat(parts)
            x = x + F.linear(a, w["o"])
            gate, up = F.linear(_rms_norm(x, w["ln2"], s.eps), w["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["down"])
        return F.linear(_rms_norm(x[last], self.norm, s.eps), self.lm_head)

    def inputs(
        self, step: Step, gen: torch.Generator, *, boolean_mask: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Random token ids, positions, the sampled rows of ``step`` and its chunk's attention mask (query
        ``i`` of the chunk sees the prefix and the chunk up to ``i``; None without a prefix): torch's
        lower-right causal bias where this torch has it and not ``boolean_mask``, else a boolean tensor."""
        dev, p, n = self.device, step.prefix, step.chunk
        ids = torch.randint(0, self.shape.vocab, (step.num_tokens,), device=dev, generator=gen)
        pos = torch.cat([
            torch.full((step.batch,), step.context - 1, device=dev, dtype=torch.long),
            torch.arange(p, p + n, device=dev, dtype=torch.long),
        ])  # fmt: skip
        rows = list(range(step.batch)) + ([step.num_tokens - 1] if n else [])
        mask: Any = None
        if n and p:
            if _causal_lower_right is not None and not boolean_mask:
                mask = _causal_lower_right(n, p + n)
            else:
                mask = torch.arange(p + n, device=dev)[None, :] <= (p + torch.arange(n, device=dev))[:, None]
        return ids, pos, torch.tensor(rows, device=dev, dtype=torch.long), mask


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _capture(fn: Callable[[], torch.Tensor], device: torch.device) -> Callable[[], Any]:
    """``fn`` captured as a CUDA graph (two runs on a side stream first, as torch's docs do); its replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_step(
    fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int
) -> tuple[list[float], list[float]]:
    """(device times, wall times) in seconds of ``repeats`` runs of ``fn`` after ``warmup`` runs; each
    run ends with a synchronization. Device times come from CUDA events on a GPU, else wall time."""
    for _ in range(warmup):
        fn()
        _sync(device)
    times: list[float] = []
    walls: list[float] = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            fn()
            end.record()
            end.synchronize()
            walls.append(time.perf_counter() - t0)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t0)
            times.append(walls[-1])
    return times, walls


def _kv_capacity(shape: ModelShape, device: torch.device, dtype: torch.dtype, want: int, mem_fraction: float) -> int:
    """KV tokens to allocate: ``want``, or on a GPU what fits in ``mem_fraction`` of the memory left
    after the weights (the rest: activations and CUDA graphs)."""
    if device.type != "cuda":
        return want
    elem = torch.tensor([], dtype=dtype).element_size()
    free, _ = torch.cuda.mem_get_info(device)
    room = free * mem_fraction - shape.params * elem
    return max(0, min(want, int(room // shape.kv_bytes_per_token(elem))))


def _ints(text: str, minimum: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= {minimum}, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSON file of the raw timings (rewritten after each point)")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (for tests, with a tiny shape)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--budget-s", type=float, default=420.0, help="add no point after this many seconds")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs of each step first")
    p.add_argument("--repeats", type=int, default=10, help="timed runs of each step (the median is its time)")
    p.add_argument(
        "--graph-max-tokens", type=int, default=512,
        help="replay steps of at most this many tokens as CUDA graphs (vLLM's max_cudagraph_capture_size; 0: none)",
    )  # fmt: skip
    p.add_argument("--mem-fraction", type=float, default=0.85, help="share of free GPU memory for weights + KV")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads of torch (default: its own choice)")
    m = p.add_argument_group("model shape (default: Llama-3-8B)")
    defaults = ModelShape()
    for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"):
        m.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    g = p.add_argument_group("steps")
    g.add_argument("--prefill", type=_ints, default=[128, 256, 512, 1024, 2048, 4096, 8192], help="prompt tokens")
    g.add_argument("--batches", type=_ints, default=[1, 4, 16, 32, 64, 128, 256], help="decode batch sizes")
    g.add_argument("--contexts", type=_ints, default=[256, 1024, 4096, 8192], help="decode context lengths")
    g.add_argument("--mixed-chunks", type=_ints, default=[256, 1024, 4096], help="prefill chunk of a mixed step")
    g.add_argument("--mixed-batches", type=_ints, default=[16, 64, 128], help="decodes in a mixed step")
    g.add_argument("--mixed-context", type=int, default=1024, help="context of a mixed step's decodes")
    g.add_argument(
        "--prefixes", type=lambda t: _ints(t, 0), default=[0, 4096],
        help="prompt tokens already in the KV cache before a prefill or mixed step's chunk (0: its first chunk)",
    )  # fmt: skip
    return p


def _device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"type": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=torch.cuda.get_device_name(device), memory_bytes=int(props.total_memory),
            multiprocessors=int(props.multi_processor_count), cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
        )  # fmt: skip
    else:
        info.update(name=platform.processor() or platform.machine() or "cpu", threads=torch.get_num_threads())
    return info


def run(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Time every planned step within the budget; returns (and keeps writing) the result document,
    which names ``command``."""
    t_start = time.perf_counter()
    for flag in ("warmup", "repeats", "graph_max_tokens"):
        if getattr(args, flag) < (1 if flag == "repeats" else 0):
            raise SystemExit(f"--{flag.replace('_', '-')} must be >= {1 if flag == 'repeats' else 0}")
    if not 0 < args.mem_fraction <= 1:
        raise SystemExit(f"--mem-fraction must be in (0, 1], got {args.mem_fraction}")
    if args.mixed_context < 1:
        raise SystemExit(f"--mixed-context must be >= 1, got {args.mixed_context}")
    try:
        shape = ModelShape(
            **{k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")}
        )
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, args.dtype)
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    steps = plan(
        args.prefill, args.batches, args.contexts, args.mixed_chunks, args.mixed_batches, args.mixed_context,
        args.prefixes,
    )  # fmt: skip
    info = _device_info(device)
    print(f"device: {info['name']} ({device}), torch {torch.__version__}; {len(steps)} steps planned", flush=True)
    elem = torch.tensor([], dtype=dtype).element_size()
    kv_tokens = _kv_capacity(shape, device, dtype, max(s.num_kv_tokens for s in steps), args.mem_fraction)
    max_pos = max(max(s.context, s.prefix + s.chunk) for s in steps)
    model = Decoder(shape, device, dtype, kv_tokens, max_pos, args.seed)
    _sync(device)
    build_s = time.perf_counter() - t_start
    print(f"model: {shape.params / 1e9:.3f} B parameters ({args.dtype}), KV cache {kv_tokens:,} tokens, built in "
          f"{build_s:.1f} s", flush=True)  # fmt: skip
    doc: dict[str, Any] = {
        "format": FORMAT,
        "command": command,
        "device": info,
        "model": {**asdict(shape), "dtype": args.dtype, "params": shape.params,
                  "kv_bytes_per_token": shape.kv_bytes_per_token(elem), "weight_bytes": shape.params * elem},
        "settings": {k: getattr(args, k) for k in ("warmup", "repeats", "graph_max_tokens", "budget_s", "seed",
                                                   "mem_fraction")} | {"kv_cache_tokens": kv_tokens,
            "prefix_mask": "boolean" if _causal_lower_right is None else "causal_lower_right"},
        "build_s": build_s,
        "points": [],
        "skipped": [],
        "not_run": [],
    }  # fmt: skip
    gen = torch.Generator(device=device).manual_seed(args.seed)
    graphs = device.type == "cuda" and args.graph_max_tokens > 0  # off for the rest of the run after a failed capture
    for i, step in enumerate(steps):
        if time.perf_counter() - t_start > args.budget_s:
            doc["not_run"] = [s.describe() for s in steps[i:]]
            print(f"budget of {args.budget_s:.0f} s spent: {len(steps) - i} steps not run", flush=True)
            break
        if step.num_kv_tokens > kv_tokens:
            doc["skipped"].append({**step.describe(), "why": f"needs {step.num_kv_tokens:,} KV tokens, "
                                   f"the cache holds {kv_tokens:,}"})  # fmt: skip
            continue
        try:
            inputs = model.inputs(step, gen)

            def eager(step: Step = step, inputs: tuple[Any, ...] = inputs) -> Any:
                return model.forward(step, *inputs).argmax(dim=-1)  # the greedy pick

            runner: Callable[[], Any] = eager
            graph = graphs and step.num_tokens <= args.graph_max_tokens
            graph_error = None
            if graph:
                try:
                    runner = _capture(eager, device)
                except RuntimeError as exc:  # run it eagerly instead, and say so
                    graph, graphs, graph_error = False, False, f"{type(exc).__name__}: {exc}"[:300]
                    print(f"CUDA graph capture failed ({graph_error}); every step runs eagerly now", flush=True)
                    _sync(device)
            t0 = time.perf_counter()
            times, walls = time_step(runner, device, args.warmup, args.repeats)
            del runner, eager, inputs
        except RuntimeError as exc:  # out of memory (a subclass) or a kernel this GPU lacks: the next point
            doc["skipped"].append({**step.describe(), "why": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"{step.label()}: skipped ({type(exc).__name__})", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        point = {
            **step.describe(), "median_s": statistics.median(times), "min_s": min(times), "times_s": times,
            "wall_median_s": statistics.median(walls), "cuda_graph": graph, "elapsed_s": time.perf_counter() - t0,
        }  # fmt: skip
        if graph_error:
            point["graph_error"] = graph_error
        doc["points"].append(point)
        print(f"{step.label()}: {point['median_s'] * 1e3:9.3f} ms{' (graph)' if graph else ''}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        doc["elapsed_s"] = time.perf_counter() - t_start
        _write(args.out, doc)
    doc["elapsed_s"] = time.perf_counter() - t_start
    _write(args.out, doc)
    print(f"{len(doc['points'])} points in {doc['elapsed_s']:.1f} s ({len(doc['skipped'])} skipped, "
          f"{len(doc['not_run'])} not run): {args.out}", flush=True)  # fmt: skip
    return doc


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def _command(argv: Sequence[str]) -> str:
    """The command line for the result file, the output folder written ``$OUT`` (no machine's path)."""
    words = [shlex.quote(w) for w in argv]
    for i, word in enumerate(argv):
        if word == "--out" and i + 1 < len(argv):
            words[i + 1] = "$OUT/" + shlex.quote(Path(argv[i + 1]).name)
        elif word.startswith("--out="):
            words[i] = "--out=$OUT/" + shlex.quote(Path(word.removeprefix("--out=")).name)
    return " ".join(["python3", "benchmarks/bench_gpu_steps.py", *words])


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    run(build_parser().parse_args(argv), _command(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
