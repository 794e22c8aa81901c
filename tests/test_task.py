"""trainer train end to end on the real MNIST conversion: accuracy, export, resume after SIGKILL, strategies."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer import models
from trainer.dataset import DatasetInfo
from trainer.task import TrainConfig, choose_strategy, eval_dataset, is_chief

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# MNIST at its own size: no flips (mirrored digits are other digits), mild crops, no centre crop.
MNIST_FLAGS = ["--image_size", "28", "--min_crop_area", "0.8", "--no_flip", "--central_fraction", "1.0", "--seed", "1"]


def trainer_command(*args):
    return [sys.executable, "-m", "trainer", *map(str, args)]


def trainer_env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def run_trainer(*args, **env):
    proc = subprocess.run(trainer_command(*args), capture_output=True, text=True, env=trainer_env(**env), cwd=ROOT)
    assert proc.returncode == 0, f"trainer {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def progress(job_dir):
    with open(os.path.join(job_dir, "progress.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def trained(mnist_dataset, tmp_path_factory):
    """small_cnn trained on MNIST through the CLI, as a user would run it."""
    job = tmp_path_factory.mktemp("job")
    run_trainer("train", "--data_dir", mnist_dataset, "--job_dir", job, "--model", "small_cnn", "--epochs", 8,
                "--batch_size", 64, "--learning_rate", 0.003, *MNIST_FLAGS)
    return job


def test_small_cnn_reaches_95_percent_validation_accuracy(trained, mnist_dataset):
    metrics = json.load(open(trained / "metrics.json"))
    print("e2e metrics:", {k: metrics[k] for k in ("val_accuracy", "val_loss", "train_seconds", "final_step")})
    assert metrics["val_accuracy"] >= 0.95
    assert metrics["eval_examples"] == DatasetInfo.load(str(mnist_dataset)).examples("validation")
    assert metrics["final_step"] == 8 * (DatasetInfo.load(str(mnist_dataset)).examples("train") // 64)
    assert (trained / "checkpoints" / "epoch-008.weights.h5").exists()
    assert not (trained / "backup").exists()  # a finished run leaves no backup to resume from


def test_export_predicts_like_the_evaluation_path(trained, mnist_dataset):
    info = DatasetInfo.load(str(mnist_dataset))
    config = TrainConfig(data_dir=str(mnist_dataset), job_dir=str(trained), image_size=28, central_fraction=1.0)
    # The evaluation path: the tf.data pipeline and the trained Keras model. cycle_length=1
    # reads the shards one after another, the same order as the raw reader below.
    model = keras.models.load_model(trained / "model.keras")
    ds = eval_dataset(info, config, 64, 0, cycle_length=1)
    eval_probabilities = np.concatenate([model(x, training=False).numpy() for x, _ in ds])
    # The serving path: the exported SavedModel given the stored image bytes.
    spec = {info.name("image"): tf.io.FixedLenFeature([], tf.string)}
    raw = [tf.io.parse_single_example(r, spec)[info.name("image")] for r in tf.data.TFRecordDataset(info.shard_paths("validation"), info.compression)]
    serve = tf.saved_model.load(str(trained / "export")).signatures["serving_default"]
    out = serve(image_bytes=tf.stack(raw))
    assert out["class_id"].shape == (info.examples("validation"),)
    np.testing.assert_array_equal(out["class_id"].numpy(), eval_probabilities.argmax(-1))
    np.testing.assert_allclose(out["probabilities"].numpy(), eval_probabilities, atol=1e-4)
    assert [s.decode() for s in out["label"].numpy()] == [info.label_names[i] for i in out["class_id"].numpy()]
    np.testing.assert_allclose(out["probabilities"].numpy().sum(-1), 1.0, atol=1e-4)


def test_killed_run_resumes_from_its_checkpoint(mnist_dataset, tmp_path):
    job = tmp_path / "job"
    steps, epochs = 8, 12
    args = ["train", "--data_dir", mnist_dataset, "--job_dir", job, "--epochs", epochs, "--steps_per_epoch", steps,
            "--batch_size", 32, *MNIST_FLAGS]
    metadata = job / "backup" / "training_metadata.json"
    first = subprocess.Popen(trainer_command(*args), env=trainer_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600  # a guard against hanging, not a timing assertion
        while first.poll() is None and time.monotonic() < deadline:
            if metadata.exists() and json.loads(metadata.read_text() or "{}").get("epoch", 0) >= 2:
                break
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        _, stderr = first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL, f"the first run was not killed mid-run (rc {first.returncode}):\n{stderr[-3000:]}"
    saved_epoch = json.loads(metadata.read_text())["epoch"]
    assert 2 <= saved_epoch < epochs

    run_trainer(*args)
    records = progress(job)
    starts = [r for r in records if r["event"] == "start"]
    assert len(starts) == 2 and starts[0]["step"] == 0 and starts[0]["pid"] != starts[1]["pid"]
    resumed = starts[1]
    assert resumed["epoch"] == saved_epoch and resumed["step"] == saved_epoch * steps  # the step count continues
    second_epochs = [r["epoch"] for r in records if r["event"] == "epoch" and r["pid"] == resumed["pid"]]
    assert second_epochs == list(range(saved_epoch + 1, epochs + 1))
    assert [r for r in records if r["event"] == "end"][-1]["step"] == epochs * steps
    assert json.load(open(job / "metrics.json"))["final_step"] == epochs * steps


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_tf_config_selects_multi_worker_strategy(mnist_dataset, tmp_path):
    tf_config = json.dumps({"cluster": {"worker": [f"localhost:{_free_port()}"]}, "task": {"type": "worker", "index": 0}})
    proc = run_trainer("train", "--data_dir", mnist_dataset, "--job_dir", tmp_path, "--epochs", 1, "--steps_per_epoch", 2,
                       "--batch_size", 32, "--image_size", 28, TF_CONFIG=tf_config)
    metrics = json.load(open(tmp_path / "metrics.json"))
    assert metrics["strategy"] in ("CollectiveAllReduceStrategy", "MultiWorkerMirroredStrategy"), proc.stdout[-2000:]
    assert metrics["final_step"] == 2


def test_default_strategy_without_tf_config_or_gpus(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    if len(tf.config.list_physical_devices("GPU")) > 1:
        pytest.skip("several GPUs: MirroredStrategy is the right choice here")
    strategy = choose_strategy()
    assert strategy.num_replicas_in_sync == 1
    assert not isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy))


@pytest.mark.parametrize(
    "tf_config, chief",
    [
        (None, True),
        ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}, True),
        ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}, False),
        ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}, False),
        ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, True),
    ],
)
def test_only_the_chief_writes_shared_outputs(monkeypatch, tf_config, chief):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert is_chief() is chief


@pytest.mark.parametrize("name", sorted(models.MODELS))
@pytest.mark.parametrize("channels", [1, 3])
def test_models_build_and_give_probabilities(name, channels):
    model = models.build(name, 32, channels, 5)
    x = np.random.default_rng(0).normal(size=(2, 32, 32, channels)).astype(np.float32)
    p = model(x, training=False).numpy()
    assert p.shape == (2, 5)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match="unknown --model 'vgg'"):
        models.build("vgg", 32, 3, 10)
    with pytest.raises(ValueError, match="--image_size 16 is too small for resnet50"):
        models.build("resnet50", 16, 3, 10)
    with pytest.raises(ValueError, match="--epochs must be at least 1, got 0"):
        TrainConfig(data_dir="d", job_dir="j", epochs=0)


def test_cli_reports_a_bad_data_dir(tmp_path):
    proc = subprocess.run(trainer_command("train", "--data_dir", tmp_path / "nope", "--job_dir", tmp_path / "job"),
                          capture_output=True, text=True, env=trainer_env(), cwd=ROOT)
    assert proc.returncode == 2
    assert "nope/dataset.json not found" in proc.stderr and "beam-etl convert --output" in proc.stderr
