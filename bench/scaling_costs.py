"""SCALING.md's cost tables: ImageNet and 100M images on Dataflow, for each shard writer, from named constants.

    python bench/scaling_costs.py

Arithmetic, not a Dataflow run: per-core rates and request counts measured on this project's
machine (docs/BENCHMARKS.md §1, §10), Dataflow and Cloud Storage list prices as constants.
"""

import math

# Prices, us-central1 batch list prices as last seen; check the price pages before budgeting.
VCPU_HOUR = 0.056  # Dataflow batch vCPU-hour
GB_HOUR = 0.003557  # Dataflow batch memory GB-hour
SHUFFLE_GB = 0.011  # Dataflow Shuffle, per GB processed (batch)
CLASS_A = 0.005 / 1000  # Cloud Storage Class A operation: an upload request, a copy, a list
CLASS_B = 0.0004 / 1000  # Cloud Storage Class B operation: a download or metadata request

# Measured here.
# img/s, validate and pass through, 80 KB photos: 420 in the encode DoFn with a full decode (BENCHMARKS §1),
# times 1.62 for the 1/8-scale JPEG validation with the cheaper Example encoder and statistics
# (bench/validate_bench.py against the full decode, no pool malloc as on a Beam worker; BENCHMARKS §16).
PASS_THROUGH_PER_CORE = 420 * 1.62
UPLOAD_PART_MB = 8.4  # Beam's GCS writer: 164 MB written in 19.5 upload requests (BENCHMARKS §10)
READ_BLOCK_MB = 16  # the staged shard writer's read block with up to 8 ranges (sharding.READ_BUDGET / ranges, at most 16 MB)
RANGES_PER_SHARD = 64  # the chunks of one group (sharding.MAX_CHUNKS_PER_GROUP)
CHUNK_MB = 80  # a chunk per bundle and split; Dataflow bundles of ~1,000 images (sizes vary; at most 256 MB)
REF_AND_FACTS_BYTES = 400  # what every image sends through the shuffle whichever the writer: its reference and its facts
DESCRIPTOR_BYTES = 120  # a chunk descriptor or a shard task's range, pickled
SHARD_MB = 256
VCPU_PER_WORKER, GB_PER_VCPU = 4, 4  # n2-standard-4
IMAGE_FACTOR = {"ImageNet": 1.35, "100M": 1.0}  # decode cost against our 80 KB photos

CASES = {"ImageNet": (1_281_167, 110e3), "100M": (100_000_000, 80e3)}


def costs(images: int, image_bytes: float, factor: float, writer: str) -> dict:
    gb = images * image_bytes / 1e9
    vcpu_h = images * factor / PASS_THROUGH_PER_CORE / 3600
    shards = math.ceil(gb * 1e3 / SHARD_MB)
    reads_in = images  # one GET per input image, both writers
    if writer == "staged":
        chunks = math.ceil(gb * 1e3 / CHUNK_MB)
        shuffle_gb = images * REF_AND_FACTS_BYTES / 1e9 + (chunks + shards * RANGES_PER_SHARD) * DESCRIPTOR_BYTES / 1e9
        class_a = chunks * (1 + math.ceil(CHUNK_MB / UPLOAD_PART_MB)) + shards * (2 + math.ceil(SHARD_MB / UPLOAD_PART_MB))
        class_b = reads_in + chunks + shards * max(RANGES_PER_SHARD, math.ceil(SHARD_MB / READ_BLOCK_MB))
        written_gb, read_gb = 2 * gb, gb
    else:
        shuffle_gb = gb + images * REF_AND_FACTS_BYTES / 1e9
        class_a = shards * (2 + math.ceil(SHARD_MB / UPLOAD_PART_MB))
        class_b = reads_in + shards * math.ceil(SHARD_MB / 16)  # each shard read back (16 MB blocks) to describe it
        written_gb, read_gb = gb, gb
    memory_gb_h = vcpu_h * GB_PER_VCPU
    bill = {
        "compute": vcpu_h * VCPU_HOUR + memory_gb_h * GB_HOUR,
        "shuffle": shuffle_gb * SHUFFLE_GB,
        "requests": class_a * CLASS_A + class_b * CLASS_B,
    }
    return {"gb": gb, "vcpu_h": vcpu_h, "shuffle_gb": shuffle_gb, "class_a": class_a, "class_b": class_b, "shards": shards,
            "written_gb": written_gb, "read_gb": read_gb, **bill, "total": sum(bill.values())}


def main():
    for name, (images, size) in CASES.items():
        print(f"\n### {name}: {images:,} images of {size / 1e3:.0f} KB ({images * size / 1e9:,.0f} GB)\n")
        print("| writer | vCPU-hours | shuffle GB | Class A ops | Class B ops | GB written / read in the bucket | compute $ | shuffle $ | requests $ | total $ |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for writer in ("staged", "tfrecordio"):
            c = costs(images, size, IMAGE_FACTOR[name], writer)
            print(f"| {writer} | {c['vcpu_h']:,.1f} | {c['shuffle_gb']:,.1f} | {c['class_a']:,} | {c['class_b']:,} | "
                  f"{c['written_gb']:,.0f} / {c['read_gb']:,.0f} | {c['compute']:,.2f} | {c['shuffle']:,.2f} | {c['requests']:,.2f} | "
                  f"**{c['total']:,.2f}** |")
    per_gb_requests = (1 + math.ceil(CHUNK_MB / UPLOAD_PART_MB)) * 1e3 / CHUNK_MB * CLASS_A + 1e3 / READ_BLOCK_MB * CLASS_B
    print(f"\nbreak-even: 1 GB through the shuffle costs ${SHUFFLE_GB}, the price of {SHUFFLE_GB / CLASS_A:,.0f} Class A "
          f"or {SHUFFLE_GB / CLASS_B:,.0f} Class B requests; the staged writer spends ${per_gb_requests:.5f} of requests per GB "
          f"staged ({SHUFFLE_GB / per_gb_requests:,.0f}x less than the shuffle it avoids).")


if __name__ == "__main__":
    main()
