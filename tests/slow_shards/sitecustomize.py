"""Put on PYTHONPATH by tests/test_flink.py for the SDK workers of its cluster, so that a test can
kill the worker that writes a shard: each shard that beam_etl.sharding.write_shard writes stays
unpublished (as its temp file) for $BEAM_ETL_TEST_SHARD_PAUSE seconds more, beside a DEST.writing
file that its worker holds open; WriteToTFRecord's sink pauses 1/100 of that per record, with its
temp file open. A few MB of test images are otherwise written in milliseconds, faster than any
outside look can land a kill mid-write."""

import os
import time

_PAUSE = float(os.environ.get("BEAM_ETL_TEST_SHARD_PAUSE") or 0)


def _slow(module) -> None:
    real = module.write_shard

    def slow(chunks, index, count, dest, *args, **kwargs):
        result = real(chunks, index, count, dest, *args, **kwargs)
        with open(dest + ".writing", "w"):  # open while it pauses: it names who writes
            time.sleep(_PAUSE)
        os.remove(dest + ".writing")
        return result

    module.write_shard = slow


def _slow_sink(module) -> None:
    real = module._TFRecordSink.write_encoded_record

    def slow(self, file_handle, value):
        time.sleep(_PAUSE / 100)
        return real(self, file_handle, value)

    module._TFRecordSink.write_encoded_record = slow


if _PAUSE > 0:
    from tests.import_hook import on_import  # PYTHONPATH has the checkout too

    on_import("beam_etl.sharding", _slow)
    on_import("apache_beam.io.tfrecordio", _slow_sink)
