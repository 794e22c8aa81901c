"""Old shards to a new one: their live records interleaved and shuffled, read once, never decoded. No Beam.

beam_etl/compact.py plans which old shards go together; each group is one task here, run on
a process per core when there is enough to copy (a task reads, checks CRCs, hashes, writes).
"""

from beam_etl import objstore, records, sharding, workpool

POOL_BYTES = 512 << 20  # below this a pool's start (~1 s per process) costs more than it saves


def pack(shards: list, count: int) -> list:
    """Old shards [dict with "bytes"] dealt into `count` groups of about equal bytes (largest first, to the lightest)."""
    groups = [[] for _ in range(count)]
    weight = [0] * count
    for shard in sorted(shards, key=lambda s: (-s["bytes"], s["file"])):
        i = min(range(count), key=lambda j: (weight[j], j))
        groups[i].append(shard)
        weight[i] += shard["bytes"]
    return [g for g in groups if g]


def rewrite_shard(output: str, group: list, dropped: set, dest: str, seed: str, schema_name: str) -> dict:
    """Write the live records of old shards `group` (dataset.json entries) to `dest`; returns counts and sha256.

    The shard writer's own (sharding.write_shard), each old shard one whole range: read in
    blocks, CRCs and counts checked, interleaved and shuffled. dropped: (generation, key) of
    the records the version excludes; only records of a generation that has some are parsed
    for their key. Returns {"examples", "bytes", "sha256", "skipped"}.
    """
    ranges = [(objstore.join(output, shard["file"]), 0, shard["bytes"], shard["examples"]) for shard in group]
    generation_of = {path: shard.get("generation", 1) for (path, *_), shard in zip(ranges, group)}
    with_drops = {g for g, _ in dropped}
    skipped = 0

    def keep(record: bytes, source) -> bool:
        nonlocal skipped
        generation = generation_of[source[0]]
        if generation in with_drops and (generation, records.key_of(record, schema_name)) in dropped:
            skipped += 1
            return False
        return True

    examples, nbytes, digest = sharding.write_shard(ranges, 0, 1, dest, seed=seed, keep=keep)
    return {"examples": examples, "bytes": nbytes, "sha256": digest, "skipped": skipped}


def task(args) -> dict:
    """rewrite_shard() of one planned group, with its DALI index where the dataset has them."""
    output, group, dropped, dest, seed, schema_name, indexed, flags = args
    objstore.configure_for(output, flags)  # once per process: S3's endpoint and keys
    done = rewrite_shard(output, group, dropped, dest, seed, schema_name)
    if indexed:  # --write_index: a DALI index beside each new shard too
        from beam_etl.index import index_name, write_index

        write_index(dest, index_name(dest), check=False)
    return done


def run(tasks: list, nbytes: int) -> list:
    """task() of each, in order: on a process per core when there are several and `nbytes` to copy is enough."""
    processes = min(workpool.cores(), len(tasks)) if nbytes >= POOL_BYTES else 1
    if processes <= 1:
        return [task(t) for t in tasks]
    import concurrent.futures

    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=workpool._context()) as pool:
        return list(pool.map(task, tasks))
