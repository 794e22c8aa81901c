"""`beam-etl flink up|down|status|fetch`: a local Flink cluster for `convert` (beam_etl/flink.py)."""

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("flink", help="start or stop a local Flink cluster for convert",
                       description="A Flink session cluster on 127.0.0.1 (JobManager, TaskManager, Beam's job "
                                   "server, an SDK worker pool), started and stopped in one command.")
    actions = p.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="fetch what is missing, start the cluster, print the flags for convert")
    up.add_argument("--slots", type=int, default=2, help="task slots of the TaskManager, the jobs' parallelism and SDK workers per job")
    up.add_argument("--any_ports", action="store_true", help="free ports instead of Flink's and Beam's defaults (8081, 8099, 50000, ...)")
    for name, text in (("down", "stop every process that `up` started"), ("status", "which processes run, and the flags for convert")):
        actions.add_parser(name, help=text)
    actions.add_parser("fetch", help="only fetch and check the jars (Flink's from PyPI, Beam's job server via mvn)")
    for action in actions.choices.values():
        action.add_argument("--dir", help="the cluster's folder: config, logs, cluster.json (default ~/.cache/beam-etl/flink-cluster)")


def main(args) -> int:
    from beam_etl import flink

    try:
        if args.action == "fetch":
            homes = flink.fetch()
            print(f"Flink {flink.FLINK_VERSION}: {homes[0]}\njob server {':'.join(flink.BEAM_RUNNER)}: {homes[1]}")
            return 0
        if args.action == "up":
            cluster = flink.up(args.dir, slots=args.slots, any_ports=args.any_ports)
            print(f"Flink {flink.FLINK_VERSION} is up in {cluster.folder}: web UI {cluster.rest}, {args.slots} slots; "
                  "`beam-etl flink down` stops it. Convert on it with:", file=sys.stderr)
            print(" ".join(cluster.flags()))
            return 0
        if args.action == "down":
            cluster = flink.down(args.dir)
            print(f"stopped the cluster in {cluster.folder}: {', '.join(cluster.state['processes'])}", file=sys.stderr)
            return 0
        cluster = flink.load(args.dir)
        running = cluster.running()
        for name in flink.PROCESSES:
            state = "running" if name in running else "stopped"
            print(f"{name}: {state} (pid {cluster.pid(name)})" if name in cluster.state["processes"] else f"{name}: never started", file=sys.stderr)
        print(" ".join(cluster.flags()))
        return 0 if len(running) == len(flink.PROCESSES) else 1
    except flink.FlinkError as e:
        print(f"beam-etl flink {args.action}: {e}", file=sys.stderr)
        return 1
