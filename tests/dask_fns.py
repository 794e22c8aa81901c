"""DoFns for tests/test_dask.py, in a module of their own: Dask workers unpickle them by
reference, and importing this costs them nothing (the test module would import TensorFlow)."""

import os

import apache_beam as beam


class Record:
    """A DoFn side effect: one file per element, named by the process that ran it."""

    def __init__(self, folder):
        self.folder = str(folder)

    def __call__(self, x):
        import uuid

        with open(os.path.join(self.folder, f"{os.getpid()}-{x}-{uuid.uuid4().hex}"), "w"):
            pass
        return x


class Tag(beam.DoFn):
    def process(self, x):
        yield beam.pvalue.TaggedOutput("odd", x) if x % 2 else x


class EmitsInFinishBundle(beam.DoFn):
    def start_bundle(self):
        self.n = 0

    def process(self, x):
        self.n += 1
        return []

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue

        yield WindowedValue(self.n, 0, [GlobalWindow()])
