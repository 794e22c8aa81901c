"""trainer bench: both pipelines measured in one run and printed as a table."""

import json
import os
import subprocess
import sys

import pytest

from trainer import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_measures_tfrecord_and_naive_pipelines(mnist_dataset, mnist_folder):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    args = ["bench", "--data_dir", mnist_dataset, "--source_dir", mnist_folder, "--batch_size", 32, "--image_size", 28,
            "--warmup_batches", 2, "--batches", 4]
    proc = subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    results = json.loads(lines[-1])
    assert [r["name"].split()[0] for r in results] == ["tfrecord", "naive"]
    assert all(r["images"] == 4 * 32 and r["images_per_second"] > 0 for r in results)
    header, *rows = lines[:-1]
    assert "images/s" in header and "ratio" in header
    assert len(rows) == 2 and all(row.endswith("x") for row in rows)  # a ratio on each row


def test_source_files_finds_nested_images_and_rejects_empty(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/1.JPG", "a/b/2.png", "a/b/notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert [os.path.relpath(p, tmp_path) for p in bench.source_files(str(tmp_path))] == ["a/1.JPG", "a/b/2.png"]
    with pytest.raises(FileNotFoundError, match="no .jpg/.jpeg/.png files under --source_dir"):
        bench.source_files(str(tmp_path / "a" / "b" / "nothing"))


def test_gpu_check_runs_end_to_end_without_a_gpu_when_allowed(mnist_dataset):
    """bench/gpu_check.py is only run on a lent GPU machine; this keeps its code path alive on CPUs."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    script = os.path.join(ROOT, "bench", "gpu_check.py")
    refused = subprocess.run([sys.executable, script, "--data_dir", mnist_dataset], capture_output=True, text=True, env=env, cwd=ROOT)
    assert refused.returncode == 2 and "sees no GPU" in refused.stderr and "--allow_cpu" in refused.stderr
    args = ["--data_dir", mnist_dataset, "--allow_cpu", "--model", "small_cnn", "--image_size", "28", "--batch_size", "16", "--warmup", "1", "--steps", "2"]
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [row["what"] for row in result["rows"]] == [
        "input pipeline, prefetch to host memory",
        "small_cnn training, synthetic data",
        "small_cnn training, real data",
    ]
    assert all(row["images_per_second"] > 0 for row in result["rows"]) and result["real_over_synthetic"] > 0
    assert "| what | images/s |" in proc.stdout


def _run_bench_script(name, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", name), *map(str, args)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_cpu_timeline_counts_the_children_of_a_command():
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 2.5: pass"
    burn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}], check=True)"
    proc = _run_bench_script("cpu_timeline.py", "--step", "1", "--", sys.executable, "-c", burn)
    assert proc.returncode == 0, proc.stderr[-2000:]
    total = proc.stdout.strip().splitlines()[-1].split("|")
    root, others = float(total[2]) + float(total[3]), float(total[4]) + float(total[5])
    assert others >= 1.0, proc.stdout  # most of the 2.5 s of CPU burnt in the grandchild is seen (up to 1 s, after the last sample, is not)
    assert root < others, proc.stdout


def test_write_cost_compares_buffered_and_direct_writes(tmp_path):
    proc = _run_bench_script("write_cost.py", "--dir", tmp_path, "--mb", 8, "--reps", 2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| buffered") or line.startswith("| O_DIRECT")]
    assert len(rows) == 2, proc.stdout
    assert not list(tmp_path.iterdir())  # its files are removed


def test_ab_trees_runs_two_checkouts_and_the_script_interleaved(tmp_path):
    from tests.corpus import jpeg

    for i in range(12):
        folder = tmp_path / "img" / ("ab"[i % 2])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.jpg").write_bytes(jpeg(40, 30, seed=i))
    scratch = tmp_path / "scratch"
    proc = _run_bench_script("ab_trees.py", "--input", tmp_path / "img", "--old", ROOT, "--reps", 1, "--scratch", scratch)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("# rep")] == ["# rep 1 old", "# rep 1 new", "# rep 1 script"]
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| old", "| new", "| script"))]
    assert len(rows) == 3 and rows[-1].endswith("| 1.00× |"), proc.stdout
    assert not scratch.exists()  # its outputs are removed
