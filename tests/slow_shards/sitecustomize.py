"""Put on PYTHONPATH by tests/test_flink.py for the SDK workers of its cluster: each shard that
beam_etl.sharding.write_shard writes stays unpublished (as its temp file) for $BEAM_ETL_TEST_SHARD_PAUSE
seconds more, so that a test can kill the worker that writes it. A few MB of test images are
otherwise written in milliseconds, faster than any outside look can land a kill mid-write."""

import importlib.abc
import importlib.util
import os
import sys
import time

_TARGET = "beam_etl.sharding"
_PAUSE = float(os.environ.get("BEAM_ETL_TEST_SHARD_PAUSE") or 0)


class _SlowOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            real = module.write_shard

            def slow(chunks, index, count, dest, *args, **kwargs):
                result = real(chunks, index, count, dest, *args, **kwargs)
                with open(dest + ".writing", "w"):  # open while it pauses: it names who writes
                    time.sleep(_PAUSE)
                os.remove(dest + ".writing")
                return result

            module.write_shard = slow

        spec.loader.exec_module = exec_module
        return spec


if _PAUSE > 0:
    sys.meta_path.insert(0, _SlowOnImport())
