#!/usr/bin/env bash
# Installs the pinned environment if needed, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/env.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=2
# The Flink tests' jars (Flink's from PyPI, Beam's job server via mvn), checked and cached once.
python -m beam_etl flink fetch
python -m pytest "$@"
