#!/usr/bin/env bash
# Installs the benchmark peer, PyTorch 2.x from PyPI, into a virtual environment (.venv-peer by
# default, or $PEER_VENV) for tools/bench_train.sh and tools/bench_amp.sh. The wheel imports only
# with its CUDA libraries installed (about 5 GB, also on a CPU-only machine). Debian's PyTorch
# 1.13 runs gpt-mini 3-5x slower than 2.x, so it is no peer for throughput.
# Usage: tools/install_peer.sh; then .venv-peer/bin/python -c 'import torch'
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PEER_VENV:-.venv-peer}
version=${TORCH_VERSION:-2.15.0}
if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" \
    2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet "torch==$version" numpy
fi
"$venv/bin/python" -c "import torch; print('peer: PyTorch', torch.__version__, '(' + '$venv' + ')')"
