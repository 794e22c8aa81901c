"""A local Flink session cluster for `convert`: JobManager, TaskManager, Beam's job server and an SDK worker pool.

`beam-etl flink up` fetches pinned jars into a cache (checksums checked), writes a config sized
for a small machine, starts the four processes on 127.0.0.1, each in a session of its own, and
records them in DIR/cluster.json; `beam-etl flink down` stops every one of them. The same code
is the tests' session fixture. Flink's own jars come from PyPI's apache-flink-libraries sdist
(Flink publishes no flink-dist to Maven); Beam's Flink runner and its runtime classpath come
from Maven Central through `mvn`, and its class FlinkJobServerDriver is the job server.
"""

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

from beam_etl import flinkrest

FLINK_VERSION = "1.19.3"
FLINK_SDIST = "apache-flink-libraries"
FLINK_SDIST_SHA256 = "4a58e3a1fb7d83340bc96b6c080624c6d792d69fae5d294b96224775204a9c60"
# Only what a session cluster runs on; the sdist's table and connector jars are left out.
FLINK_JARS = (f"flink-dist-{FLINK_VERSION}.jar", "log4j-1.2-api-2.17.1.jar", "log4j-api-2.17.1.jar",
              "log4j-core-2.17.1.jar", "log4j-slf4j-impl-2.17.1.jar")
# Beam's newest Flink runner whose whole runtime classpath Maven Central serves here (2.70.0
# needs beam-runners-java-job-service:2.70.0, which is not served). Beam 2.77's Python SDK runs on it.
BEAM_RUNNER = ("org.apache.beam", "beam-runners-flink-1.19", "2.62.0")
JOB_SERVER_LOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flink_jobserver.lock")
JOB_SERVER_MAIN = "org.apache.beam.runners.flink.FlinkJobServerDriver"
WORKER_POOL = ["-m", "beam_etl.sdk_pool"]  # templates/flink's sidecar: Beam's pool, restarting early deaths

# Flink's env.java.opts.all default for Java 17 (its conf/config.yaml): the modules it reflects into.
JAVA_OPENS = (
    "--add-exports=java.base/sun.net.util=ALL-UNNAMED --add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED "
    "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED --add-opens=java.base/java.lang=ALL-UNNAMED "
    "--add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED "
    "--add-opens=java.base/java.nio=ALL-UNNAMED --add-opens=java.base/sun.nio.ch=ALL-UNNAMED "
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.text=ALL-UNNAMED "
    "--add-opens=java.base/java.time=ALL-UNNAMED --add-opens=java.base/java.util=ALL-UNNAMED "
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED "
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED "
    "--add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED"
).split()

# What a convert needs of the cluster (measured; docs/BENCHMARKS.md):
# - about 190 vertices deploy at once, so network memory of 512 MB and 64 sort-shuffle buffers
#   (128 MB failed: "Insufficient number of network buffers: required 512, but only 410 available");
# - a batch job restarts only with a restart strategy in the cluster's config, and only a full
#   restart lets Beam drop the environment of an SDK worker that died (per-region failover spent
#   its attempts in 0.4 s on the same dead worker).
CONFIG = {
    "jobmanager.memory.process.size": "1024m",
    "taskmanager.memory.process.size": "4096m",
    "taskmanager.memory.network.min": "512m",
    "taskmanager.memory.network.max": "512m",
    # Beam's data plane to the SDK workers is gRPC on Netty's direct buffers, outside Flink's
    # network memory: a shard's group of 2,000 photos failed with "OutOfMemoryError: Direct
    # buffer memory" at the default of 0 (measured, bench/flink_bench.py).
    "taskmanager.memory.task.off-heap.size": "768m",
    "taskmanager.memory.managed.fraction": "0.2",
    "taskmanager.network.sort-shuffle.min-buffers": "64",
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": "10",
    # Not sooner: Beam lets go of a dead worker's environment only after the failed attempt's
    # tasks have released it and its worker was stopped (the pool waits up to 10 s for that).
    # At 2 s, 10 restarts in 20 s all reused the dead environment and the job FAILED (seen in CI).
    "restart-strategy.fixed-delay.delay": "15 s",
    "jobmanager.execution.failover-strategy": "full",
    # A TaskManager that is killed is declared lost after this, and the job restarts on a new one.
    "heartbeat.timeout": "20000",
}
# Under the restart delay above: a restarted attempt then never gets an environment made before
# the failure. Seen in CI: after an SDK worker was killed inside WriteToTFRecord, the TaskManager
# kept that worker's environment cached for the job (its tasks never released it), and each of the
# 10 restarts failed at once on its cancelled control call ("CANCELLED: call already cancelled").
# Stages release their environments within seconds anyway, so few new workers start because of it.
ENVIRONMENT_EXPIRATION_MS = 10_000
LOG4J = """rootLogger.level = INFO
rootLogger.appenderRef.file.ref = MainAppender
appender.main.name = MainAppender
appender.main.type = File
appender.main.fileName = ${sys:log.file}
appender.main.layout.type = PatternLayout
appender.main.layout.pattern = %d{yyyy-MM-dd HH:mm:ss,SSS} %-5p %-60c %x - %m%n
logger.pekko.name = org.apache.pekko
logger.pekko.level = WARN
"""
PROCESSES = ("jobmanager", "taskmanager", "jobserver", "workerpool")
STATE = "cluster.json"


class FlinkError(RuntimeError):
    """The cluster cannot be fetched, started or found; the text says what to do."""


def cache_root() -> str:
    """Where fetched jars are kept: $BEAM_ETL_CACHE, else ~/.cache/beam-etl."""
    return os.environ.get("BEAM_ETL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "beam-etl")


def default_dir() -> str:
    """The cluster's folder (config, logs, cluster.json) when `up` and `down` are given none."""
    return os.path.join(cache_root(), "flink-cluster")


def flink_home() -> str:
    return os.path.join(cache_root(), f"flink-{FLINK_VERSION}")


def job_server_home() -> str:
    return os.path.join(cache_root(), f"{BEAM_RUNNER[1]}-{BEAM_RUNNER[2]}")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _need(tool: str, why: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise FlinkError(f"`{tool}` is not on PATH; {why} (Debian: apt-get install openjdk-17-jre-headless maven)")
    return found


def _run(command: list, what: str, cwd=None) -> None:
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise FlinkError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


def _publish(tmp: str, final: str) -> None:
    """Move a fully fetched folder into place; another process that won the race is kept."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def fetch_flink() -> str:
    """Flink's jars from the pinned sdist (pip checks its sha256), cached; returns the folder."""
    home = flink_home()
    if os.path.isfile(os.path.join(home, "lib", FLINK_JARS[0])):
        return home
    os.makedirs(cache_root(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".flink-", dir=cache_root())
    try:
        requirement = os.path.join(tmp, "requirements.txt")
        with open(requirement, "w") as f:
            f.write(f"{FLINK_SDIST}=={FLINK_VERSION} --hash=sha256:{FLINK_SDIST_SHA256}\n")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--require-hashes",
              "--quiet", "-r", requirement, "-d", tmp], f"pip download {FLINK_SDIST}=={FLINK_VERSION}")
        sdist = os.path.join(tmp, f"{FLINK_SDIST}-{FLINK_VERSION}.tar.gz")
        if _sha256(sdist) != FLINK_SDIST_SHA256:  # pip checked it; so does this, should pip's cache lie
            raise FlinkError(f"{sdist}: sha256 differs from the pinned {FLINK_SDIST_SHA256}")
        prefix = f"{FLINK_SDIST}-{FLINK_VERSION}/deps/"
        wanted = {prefix + "lib/" + name: os.path.join("lib", name) for name in FLINK_JARS}
        wanted[prefix + "bin/bash-java-utils.jar"] = os.path.join("bin", "bash-java-utils.jar")
        staged = os.path.join(tmp, "home")
        with tarfile.open(sdist) as archive:
            for member in archive:
                if member.name in wanted:
                    target = os.path.join(staged, wanted.pop(member.name))
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with archive.extractfile(member) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if wanted:
            raise FlinkError(f"{sdist} lacks {sorted(wanted)}")
        _publish(staged, home)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home


def _lock() -> dict:
    """The job server's jars as pinned: file name -> sha256."""
    with open(JOB_SERVER_LOCK) as f:
        return {name: digest for digest, name in (line.split() for line in f if line.strip() and not line.startswith("#"))}


def fetch_job_server() -> str:
    """Beam's Flink runner and its runtime classpath via mvn, each jar checked against the lock."""
    home = job_server_home()
    if os.path.isfile(os.path.join(home, ".checked")):
        return home
    mvn = _need("mvn", "it fetches Beam's Flink job server jars")
    os.makedirs(cache_root(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".jobserver-", dir=cache_root())
    try:
        group, artifact, version = BEAM_RUNNER
        with open(os.path.join(tmp, "pom.xml"), "w") as f:
            f.write(f"""<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
  <groupId>beam-etl</groupId><artifactId>flink-job-server</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies><dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version></dependency></dependencies>
</project>
""")
        jars = os.path.join(tmp, "jars")
        # -C: fail on a checksum that differs from the repository's.
        _run([mvn, "-q", "-B", "-C", "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={jars}"],
             f"mvn dependency:copy-dependencies of {group}:{artifact}:{version}", cwd=tmp)
        expected = _lock()
        got = {name: _sha256(os.path.join(jars, name)) for name in os.listdir(jars)}
        wrong = sorted(n for n in set(expected) | set(got) if expected.get(n) != got.get(n))
        if wrong:
            raise FlinkError(f"the job server's jars differ from {JOB_SERVER_LOCK} in {len(wrong)}: {', '.join(wrong[:5])}")
        open(os.path.join(jars, ".checked"), "w").close()
        _publish(jars, home)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home


def fetch() -> tuple:
    """Both sets of jars, cached; (flink_home, job_server_home)."""
    _need("java", "Flink and Beam's job server run on Java 17")
    return fetch_flink(), fetch_job_server()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_or_free(port: int) -> int:
    """The given port when nothing listens there, else a free one (so a second cluster can start)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            return free_port()


DEFAULT_PORTS = {"rest": 8081, "rpc": 6123, "blob": 6124, "job": 8099, "artifact": 8098, "expansion": 8097, "pool": 50000}


def write_config(folder: str, ports: dict, slots: int, extra: dict) -> str:
    """DIR/conf with flink-conf.yaml (the flat form that 1.19 reads) and log4j; returns the conf folder."""
    conf = os.path.join(folder, "conf")
    os.makedirs(conf, exist_ok=True)
    settings = dict(CONFIG)
    settings.update({
        "jobmanager.rpc.address": "127.0.0.1", "jobmanager.bind-host": "127.0.0.1",
        "jobmanager.rpc.port": str(ports["rpc"]), "blob.server.port": str(ports["blob"]),
        "rest.address": "127.0.0.1", "rest.bind-address": "127.0.0.1", "rest.port": str(ports["rest"]),
        "taskmanager.host": "127.0.0.1", "taskmanager.bind-host": "127.0.0.1",
        "taskmanager.numberOfTaskSlots": str(slots), "parallelism.default": str(slots),
        "io.tmp.dirs": os.path.join(folder, "tmp"),
    })
    settings.update({k: str(v) for k, v in extra.items()})
    os.makedirs(settings["io.tmp.dirs"], exist_ok=True)
    with open(os.path.join(conf, "flink-conf.yaml"), "w") as f:
        f.writelines(f"{key}: {value}\n" for key, value in settings.items())
    with open(os.path.join(conf, "log4j.properties"), "w") as f:
        f.write(LOG4J)
    return conf


def _resource_params(home: str, conf: str, which: str) -> tuple:
    """Flink's own memory arithmetic (what bin/config.sh runs): (JVM flags, -D options for the main class)."""
    classpath = os.path.join(home, "bin", "bash-java-utils.jar") + os.pathsep + os.path.join(home, "lib", "*")
    proc = subprocess.run(["java", "-cp", classpath, "org.apache.flink.runtime.util.bash.BashJavaUtils", which,
                           "--configDir", conf], capture_output=True, text=True)
    lines = [line.split(":", 1)[1] for line in proc.stdout.splitlines() if line.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")]
    if proc.returncode != 0 or len(lines) < 2:
        raise FlinkError(f"Flink rejected the memory settings in {conf}/flink-conf.yaml: {proc.stdout.strip().splitlines()[-1:]}")
    return lines[0].split(), lines[1].split()


def _java(home_jars: str, conf: str, log: str, memory: list, main: str, args: list) -> list:
    return ["java", *JAVA_OPENS, *memory, f"-Dlog.file={log}", f"-Dlog4j.configurationFile=file:{conf}/log4j.properties",
            "-cp", home_jars, main, *args]


def _pool_python(folder: str) -> str:
    """A `python` for the pool's PATH that runs this interpreter, so its workers have the project."""
    bin_dir = os.path.join(folder, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    python = os.path.join(bin_dir, "python")
    with open(python, "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    os.chmod(python, 0o755)
    return bin_dir


def _stat(pid: int):
    """The fields of /proc/PID/stat after the command name (None when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int):
    """The kernel's start time of `pid` (None when gone): guards `down` against a reused pid."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _alive(pid: int, started) -> bool:
    fields = _stat(pid)
    return started is not None and fields is not None and int(fields[19]) == started and fields[0] != "Z"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Cluster:
    """The processes of one local cluster, as recorded in DIR/cluster.json."""

    def __init__(self, folder: str, state: dict):
        self.folder, self.state = folder, state
        self.popen = {}  # name -> Popen, in the process that started them

    @property
    def ports(self) -> dict:
        return self.state["ports"]

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.ports['rest']}"

    def flags(self) -> list:
        """What `convert` needs to run here: the job server, the pool, and the parallelism."""
        slots = self.state["slots"]
        return ["--runner=PortableRunner", f"--job_endpoint=127.0.0.1:{self.ports['job']}",
                "--environment_type=EXTERNAL", f"--environment_config=127.0.0.1:{self.ports['pool']}",
                f"--flink_master=127.0.0.1:{self.ports['rest']}", f"--parallelism={slots}",
                f"--sdk_worker_parallelism={slots}", f"--environment_expiration_millis={ENVIRONMENT_EXPIRATION_MS}"]

    def log(self, name: str) -> str:
        return os.path.join(self.folder, "log", f"{name}.log")

    def _save(self) -> None:
        tmp = os.path.join(self.folder, STATE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.state, f, indent=2)
        os.replace(tmp, os.path.join(self.folder, STATE))

    def _spawn(self, name: str, command: list, env=None) -> None:
        log = open(self.log(name) + ".out", "ab")
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=self.folder, env=env, start_new_session=True)
        log.close()
        self.popen[name] = proc
        self.state["processes"][name] = {"pid": proc.pid, "started": _start_time(proc.pid)}
        self._save()

    def start_taskmanager(self) -> None:
        """A TaskManager (again, after one died): the cluster's slots come from it."""
        home, conf = self.state["flink_home"], os.path.join(self.folder, "conf")
        memory, dynamic = _resource_params(home, conf, "GET_TM_RESOURCE_PARAMS")
        self._spawn("taskmanager", _java(os.path.join(home, "lib", "*"), conf, self.log("taskmanager"), memory,
                                         "org.apache.flink.runtime.taskexecutor.TaskManagerRunner",
                                         ["--configDir", conf, *dynamic]))

    def pid(self, name: str) -> int:
        return self.state["processes"][name]["pid"]

    def running(self) -> list:
        """The names of this cluster's processes that are still alive."""
        return [name for name, p in self.state["processes"].items() if _alive(p["pid"], p["started"])]

    def overview(self) -> dict:
        return flinkrest.check(self.rest)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the JobManager counts every slot, and the job server and the pool listen."""
        deadline = time.monotonic() + timeout
        waiting = "the JobManager"
        while time.monotonic() < deadline:
            gone = [name for name in self.popen if self.popen[name].poll() is not None]
            if gone:
                raise FlinkError(f"the {gone[0]} exited at start (exit {self.popen[gone[0]].returncode}); see {self.log(gone[0])}*")
            try:
                if self.overview().get("slots-total", 0) < self.state["slots"]:
                    waiting = "the TaskManager's slots"
                    raise OSError
                for name, port in (("job server", "job"), ("worker pool", "pool")):
                    if not _listening(self.ports[port]):
                        waiting = f"the {name} on port {self.ports[port]}"
                        raise OSError
                return
            except (OSError, ValueError):
                time.sleep(0.5)
        raise FlinkError(f"the cluster in {self.folder} was not ready within {timeout:.0f} s: waited for {waiting}; see {self.folder}/log")

    def stop(self, timeout: float = 20.0) -> list:
        """SIGTERM each process group, SIGKILL what is left; returns the names that had to be killed."""
        killed = []
        processes = self.state.get("processes", {})
        for name, p in processes.items():
            if _alive(p["pid"], p["started"]):
                _signal_group(p["pid"], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, p in processes.items():
            while _alive(p["pid"], p["started"]) and time.monotonic() < deadline:
                self._reap(name)
                time.sleep(0.1)
            if _alive(p["pid"], p["started"]):
                killed.append(name)
            # The group too: the pool's SDK workers, and anything a JVM forked.
            _signal_group(p["pid"], signal.SIGKILL)
            self._reap(name)
        return killed

    def _reap(self, name: str) -> None:
        proc = self.popen.get(name)
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)  # each process leads its own session: start_new_session
    except (ProcessLookupError, PermissionError):
        pass


def load(folder: str = None) -> Cluster:
    """The cluster recorded in `folder`; FlinkError when there is none."""
    folder = os.path.abspath(folder or default_dir())
    try:
        with open(os.path.join(folder, STATE)) as f:
            return Cluster(folder, json.load(f))
    except FileNotFoundError:
        raise FlinkError(f"no cluster recorded in {folder}: start one with `beam-etl flink up`") from None


def up(folder: str = None, slots: int = 2, env: dict = None, config: dict = None, any_ports: bool = False) -> Cluster:
    """Fetch what is missing and start the cluster in `folder`; returns it when every slot is ready."""
    folder = os.path.abspath(folder or default_dir())
    try:
        running = load(folder).running()
    except FlinkError:
        running = []
    if running:
        raise FlinkError(f"a cluster recorded in {folder} is still running ({', '.join(running)}): "
                         "`beam-etl flink down` first, or pass another --dir")
    if slots < 1:
        raise FlinkError(f"--slots must be 1 or more, got {slots}")
    flink, job_server = fetch()
    for sub in ("log", "artifacts"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    ports = {name: free_port() if any_ports else _port_or_free(port) for name, port in DEFAULT_PORTS.items()}
    conf = write_config(folder, ports, slots, config or {})
    cluster = Cluster(folder, {"ports": ports, "slots": slots, "flink_home": flink, "job_server_home": job_server,
                               "processes": {}, "flink_version": FLINK_VERSION, "beam_runner": ":".join(BEAM_RUNNER)})
    cluster._save()
    env = dict(os.environ if env is None else env)
    try:
        memory, dynamic = _resource_params(flink, conf, "GET_JM_RESOURCE_PARAMS")
        cluster._spawn("jobmanager", _java(os.path.join(flink, "lib", "*"), conf, cluster.log("jobmanager"), memory,
                                           "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint",
                                           ["--configDir", conf, *dynamic]))
        cluster.start_taskmanager()
        cluster._spawn("jobserver", _java(os.path.join(job_server, "*"), conf, cluster.log("jobserver"), ["-Xmx512m"],
                                          JOB_SERVER_MAIN, [
                                              f"--flink-master=127.0.0.1:{ports['rest']}", "--job-host=127.0.0.1",
                                              f"--job-port={ports['job']}", f"--artifact-port={ports['artifact']}",
                                              f"--expansion-port={ports['expansion']}",
                                              f"--artifacts-dir={os.path.join(folder, 'artifacts')}",
                                              f"--flink-conf-dir={conf}"]))
        pool_env = dict(env, PATH=_pool_python(folder) + os.pathsep + env.get("PATH", os.defpath))
        pool_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        cluster._spawn("workerpool", [sys.executable, *WORKER_POOL, f"--service_port={ports['pool']}"], env=pool_env)
        cluster.wait_ready()
    except BaseException:
        cluster.stop(timeout=5)
        raise
    return cluster


def down(folder: str = None) -> Cluster:
    """Stop every process of the cluster in `folder`; FlinkError if one outlives SIGKILL."""
    cluster = load(folder)
    cluster.stop()
    left = cluster.running()
    if left:
        raise FlinkError(f"still running after SIGKILL: {', '.join(f'{n} (pid {cluster.pid(n)})' for n in left)}")
    return cluster
