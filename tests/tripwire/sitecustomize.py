"""Put on PYTHONPATH by tests: in every Python process of a run, count calls into Beam's credential
lookup with retries (the ~25 s stall). Writes 'armed PID' when the tripwire is set in a process and
'entered PID' on each call, to the file named by $BEAM_ETL_TRIPWIRE_LOG."""

import os

_LOG = os.environ.get("BEAM_ETL_TRIPWIRE_LOG")


def _note(what: str) -> None:
    with open(_LOG, "a") as f:
        f.write(f"{what} {os.getpid()}\n")


def _arm(module) -> None:
    real = module._Credentials._get_credentials_with_retrys

    def counted(*args, **kwargs):
        _note("entered")
        return real(*args, **kwargs)

    module._Credentials._get_credentials_with_retrys = staticmethod(counted)
    _note("armed")


if _LOG:
    from tests.import_hook import on_import  # PYTHONPATH has the checkout too

    on_import("apache_beam.internal.gcp.auth", _arm)
