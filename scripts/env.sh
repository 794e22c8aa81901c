#!/usr/bin/env bash
# Creates .venv (Python 3.11) with the pinned versions, once; later calls only activate it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3.11 || command -v python3)
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import beam_etl, trainer, apache_beam, tensorflow_transform, mlxtend" 2>/dev/null; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  # constraints.txt pins every package of the tested set, so a fresh install resolves the same.
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
fi
