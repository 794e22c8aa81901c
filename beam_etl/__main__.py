"""`python -m beam_etl` is `beam-etl`."""

from beam_etl.cli import main

raise SystemExit(main())
