"""Put on PYTHONPATH by tests: in every Python process of a run, count calls into Beam's credential
lookup with retries (the ~25 s stall). Writes 'armed PID' when the tripwire is set in a process and
'entered PID' on each call, to the file named by $BEAM_ETL_TRIPWIRE_LOG."""

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "apache_beam.internal.gcp.auth"
_LOG = os.environ.get("BEAM_ETL_TRIPWIRE_LOG")


def _note(what: str) -> None:
    with open(_LOG, "a") as f:
        f.write(f"{what} {os.getpid()}\n")


class _ArmOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            real = module._Credentials._get_credentials_with_retrys

            def counted(*args, **kwargs):
                _note("entered")
                return real(*args, **kwargs)

            module._Credentials._get_credentials_with_retrys = staticmethod(counted)
            _note("armed")

        spec.loader.exec_module = exec_module
        return spec


if _LOG:
    sys.meta_path.insert(0, _ArmOnImport())
