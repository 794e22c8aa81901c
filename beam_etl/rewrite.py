"""Old shards to a new one: their live records interleaved and shuffled, read once, never decoded. No Beam.

beam_etl/compact.py plans which old shards go together; each group is one task here, run on
a process per core when there is enough to copy (a task reads, checks CRCs, hashes, writes).
"""

import hashlib
import random

from beam_etl import localio, objstore, records, sharding, tfrecord, workpool

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


def _framed_records(path: str):
    with objstore.open_read(path) as f:
        for _, framed, _ in tfrecord.iter_framed(f, path):  # CRCs checked
            yield framed


def interleaved(sources, rng: random.Random):
    """(tag, record) from several (tag, iterator, count) sources, picked at random in proportion to what each has left."""
    live = [(tag, iter(it), n) for tag, it, n in sources if n]
    left = [n for _, _, n in live]
    while live:
        i = rng.choices(range(len(live)), weights=left)[0]
        tag, it, _ = live[i]
        record = next(it, None)
        if record is None:  # fewer than the document said: counted (and refused) by the caller
            del live[i], left[i]
            continue
        left[i] -= 1
        yield tag, record
        if left[i] <= 0:
            if next(it, None) is not None:
                raise tfrecord.CorruptRecord(f"{tag[1]}: more records than dataset.json lists")
            del live[i], left[i]


def rewrite_shard(output: str, group: list, dropped: set, dest: str, seed: str, schema_name: str) -> dict:
    """Write the live records of old shards `group` (dataset.json entries) to `dest`; returns counts and sha256.

    dropped: (generation, key) of the records the version excludes; only records of a
    generation that has some are parsed for their key. Returns {"examples", "bytes",
    "sha256", "skipped"}, skipped counting the excluded records left out.
    """
    rng = random.Random(seed)
    paths = [objstore.join(output, shard["file"]) for shard in group]
    sources = [((shard.get("generation", 1), path), _framed_records(path), shard["examples"]) for shard, path in zip(group, paths)]
    with_drops = {g for g, _ in dropped}
    digest, nbytes, examples, skipped, seen = hashlib.sha256(), 0, 0, 0, {}

    def live():
        nonlocal skipped
        for (generation, path), framed in interleaved(sources, rng):
            seen[path] = seen.get(path, 0) + 1
            if generation in with_drops and (generation, records.key_of(framed[12:-4], schema_name)) in dropped:
                skipped += 1
                continue
            yield framed

    with localio.DirectWriter(dest) if localio.is_local(dest) else objstore.create(dest) as out:
        for framed in sharding._shuffled(live(), rng, sharding.SHUFFLE_BUFFER):
            out.write(framed)
            digest.update(framed)
            nbytes += len(framed)
            examples += 1
    for shard, path in zip(group, paths):
        if seen.get(path, 0) != shard["examples"]:
            raise tfrecord.CorruptRecord(f"{path}: {seen.get(path, 0)} records read, dataset.json lists {shard['examples']}; "
                                         f"run `beam-etl verify {output}`")
    return {"examples": examples, "bytes": nbytes, "sha256": digest.hexdigest(), "skipped": skipped}


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
