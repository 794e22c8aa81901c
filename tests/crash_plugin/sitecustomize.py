"""Put on PYTHONPATH by tests/test_limits.py: in every Python process of a run, a Pillow format for
tests/bombs.crash_file, whose decode sends its own process the signal the file names (SIGKILL, as
the OOM killer would; SIGSEGV, as a crash in a native decoder would), or, for HANG, sleeps for an
hour without returning to anything that could check a clock. With $BEAM_ETL_TEST_SHARD_PAUSE
set, it also slows shard writes as tests/slow_shards does."""

import os
import runpy
import signal
import time

_MAGIC = b"BEAMETL-CRASH:"  # tests/bombs.CRASH_MAGIC


def _register(Image) -> None:
    from PIL import ImageFile

    class CrashFile(ImageFile.ImageFile):
        format, format_description = "BEAMETLCRASH", "a test file whose decode kills its process"

        def _open(self):
            self.how = self.fp.read(64)[len(_MAGIC):].split(b"\n")[0].decode("ascii")
            self._size, self._mode, self.tile = (8, 8), "RGB", []

        def load(self):
            if self.how == "HANG":  # as a C call that never returns to Python would
                time.sleep(3600)
            os.kill(os.getpid(), getattr(signal, self.how))

    Image.register_open(CrashFile.format, CrashFile, lambda prefix: prefix.startswith(_MAGIC))


if os.environ.get("BEAM_ETL_TEST_CRASH_PLUGIN"):
    from tests.import_hook import on_import  # PYTHONPATH has the checkout too

    on_import("PIL.Image", _register)
    if os.environ.get("BEAM_ETL_TEST_SHARD_PAUSE"):
        runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(__file__)), "slow_shards", "sitecustomize.py"))
