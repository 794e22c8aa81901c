"""The distribution: `python -m build`, Beam's --setup_file staging, and a clean-venv install.

The clean-venv test installs the wheel exactly as the Dockerfile's final stages do
(`pip install -c constraints.txt WHEEL`) and runs both console scripts; it takes about
2.5 minutes with a warm pip cache (TensorFlow is most of it).
"""

import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.conftest import ROOT

EXTRAS = {"gcp", "aws", "dask", "dev"}


def _name(requirement):
    return re.split(r"[\[=<>!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def _constraints():
    pins = {}
    for line in open(os.path.join(ROOT, "constraints.txt")):
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[_name(name)] = version
    return pins


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """`python -m build` as a user runs it: an sdist and a wheel."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), ROOT], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sdist,) = out.glob("beam_image_etl-*.tar.gz")
    (wheel,) = out.glob("beam_image_etl-*-py3-none-any.whl")
    return sdist, wheel


def _metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return z.read(name).decode()


def test_wheel_holds_both_packages_and_console_scripts(dist):
    _, wheel = dist
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
        scripts = z.read(entry_points).decode()
    assert "beam_etl/cli.py" in names and "trainer/cli.py" in names
    assert not any(n.startswith("tests/") for n in names)
    assert "beam-etl = beam_etl.cli:run" in scripts and "trainer = trainer.cli:main" in scripts


def test_sdist_holds_setup_py_and_both_packages(dist):
    sdist, _ = dist
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"setup.py", "beam_etl/cli.py", "beam_etl/pipeline.py", "trainer/cli.py", "trainer/task.py"} <= names


def test_every_requirement_is_pinned_to_the_tested_version(dist):
    """Requires-Dist (base and every extra) pins with ==, to the version constraints.txt holds."""
    _, wheel = dist
    metadata = _metadata(wheel)
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    assert extras == EXTRAS
    requirements = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    pins = _constraints()
    for requirement in requirements:
        spec = requirement.split(";")[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[\w,]+\])?\s*==\s*([\w.]+)", spec)
        assert m, f"not pinned with ==: {requirement}"
        assert pins.get(_name(m.group(1))) == m.group(3), f"{spec} is not the version constraints.txt pins ({pins.get(_name(m.group(1)))})"


def test_installed_versions_are_the_pinned_ones():
    """Each distribution constraints.txt pins is installed here at that version (the tested set); no pin twice."""
    from importlib.metadata import distributions

    pins = _constraints()
    lines = [line.split("==")[0] for line in open(os.path.join(ROOT, "constraints.txt")) if "==" in line and not line.startswith("#")]
    assert len(lines) == len({_name(n) for n in lines}), "a package is pinned twice"
    for dist in distributions():
        name = _name(dist.metadata["Name"])
        if name in pins and name != "beam-image-etl":
            assert pins[name] == dist.version, f"{name}: constraints.txt {pins[name]}, installed {dist.version}"


def test_setup_py_works_as_beams_setup_file(tmp_path):
    """What Dataflow does with --setup_file: Beam's stager builds workflow.tar.gz, workers pip install it."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.stager import Stager

    options = PipelineOptions(["--setup_file", os.path.join(ROOT, "setup.py"), "--sdk_location", "container", "--temp_location", str(tmp_path / "tmp")])
    staging = tmp_path / "staging"
    staging.mkdir()
    resources = Stager.create_job_resources(options, str(staging), log_submission_env_dependencies=False)
    staged = {name for _, name, _ in Stager.extract_staging_tuple_iter(resources)}
    assert "workflow.tar.gz" in staged, staged
    (tarball,) = [path for path, name, _ in Stager.extract_staging_tuple_iter(resources) if name == "workflow.tar.gz"]
    # A worker installs it with pip; --no-deps keeps this to the package itself.
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--target", str(target), tarball], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (target / "beam_etl" / "pipeline.py").exists() and (target / "trainer" / "task.py").exists()


def test_wheel_installs_into_a_clean_venv_and_both_commands_run(dist, tmp_path):
    """The Dockerfile's install step, in a fresh venv: the wheel with the pinned set, then --help."""
    _, wheel = dist
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-compile", "-c", os.path.join(ROOT, "constraints.txt"), str(wheel)],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for command, expected in (("beam-etl", "usage: beam-etl"), ("trainer", "usage: trainer")):
        out = subprocess.run([str(venv / "bin" / command), "--help"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert out.returncode == 0 and expected in out.stdout, out.stdout + out.stderr[-2000:]
    # It is the wheel's code, not this checkout's.
    where = subprocess.run([str(python), "-c", "import beam_etl; print(beam_etl.__file__)"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert str(venv) in where.stdout
