"""Dataflow Flex Template entry point: the template's parameters become `beam-etl convert` flags.

The launcher (FLEX_TEMPLATE_PYTHON_PY_FILE in the `etl` image) runs
`python main.py --input=gs://... --output=gs://... --runner=DataflowRunner --project=... ...`.
Every parameter is passed as `--name=value`, so a boolean flag of `convert` (argparse
store_true, e.g. --overwrite) arrives as `--overwrite=true`; this turns it back into the
bare flag. Everything else goes to `beam_etl.cli` unchanged: the `convert` flags to its
parser, the rest to Beam's PipelineOptions.
"""

import argparse
import os
import sys

TRUE = ("true", "1", "yes")
FALSE = ("false", "0", "no", "")


def boolean_flags() -> set:
    """The store_true flags of the real `convert` parser."""
    from beam_etl import cli

    convert = cli._convert_parser(argparse.ArgumentParser().add_subparsers())
    return {opt for action in convert._actions if isinstance(action, argparse._StoreTrueAction) for opt in action.option_strings}


def template_args(argv) -> list:
    """Template parameters (`--name=value`) to `beam-etl convert` arguments."""
    booleans = boolean_flags()
    out = ["convert"]
    for arg in argv:
        name, eq, value = arg.partition("=")
        if name in booleans and eq:
            if value.strip().lower() in TRUE:
                out.append(name)
            elif value.strip().lower() not in FALSE:
                raise SystemExit(f"beam-etl: error: {name} takes true or false, got {value!r}")
        else:
            out.append(arg)
    return out


if __name__ == "__main__":
    from beam_etl import cli

    code = cli.main(template_args(sys.argv[1:]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the `beam-etl` console script: see beam_etl.cli.run
