"""`python -m beam_etl` is `beam-etl`."""

from beam_etl.cli import run

run()
