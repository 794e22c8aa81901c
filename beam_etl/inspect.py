"""`beam-etl inspect`: what a dataset holds, read from dataset.json and the shards themselves."""

import collections
import io
import statistics
import struct

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_etl import metadata, schema, tfrecord

BAR_WIDTH = 40
CELL = 84  # preview thumbnail box, pixels: MNIST's 28 px shown at 3x
_SPLIT_ORDER = ("train", "validation", "test")


class NotADataset(ValueError):
    """The directory has no dataset.json: not a finished `beam-etl convert` output."""


# --- the scan -------------------------------------------------------------------------


def _spread(values) -> dict:
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _split_order(names):
    return sorted(names, key=lambda n: (_SPLIT_ORDER.index(n) if n in _SPLIT_ORDER else len(_SPLIT_ORDER), n))


def _open_shard(path: str, compression: str):
    ctype = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    return FileSystems.open(path, compression_type=ctype)


def build_report(data_dir: str, preview_per_class: int = 0) -> dict:
    """Everything `inspect` shows, as a dict; with preview_per_class, also that many encoded images per class."""
    data_dir = data_dir.rstrip("/")
    if not metadata.is_complete(data_dir):
        raise NotADataset(f"{data_dir}: no {metadata.DATASET_JSON}; pass the directory `beam-etl convert --output` wrote (a failed or running conversion has none)")
    document = metadata.read(data_dir)
    names = {role: f["name"] for role, f in document["features"].items()}
    label_names = document["label_names"]
    hash_count = collections.Counter()  # sha256 -> records
    hash_splits = collections.defaultdict(set)  # sha256 -> splits it is in
    sizes = collections.Counter()  # (height, width) -> records
    preview = {i: [] for i in range(len(label_names))}
    splits = {}
    for split_name in _split_order(document["splits"]):
        split = document["splits"][split_name]
        labels = collections.Counter()
        records = 0
        for shard in split["shards"]:
            path = FileSystems.join(data_dir, shard["file"])
            with _open_shard(path, document.get("compression", "none")) as f:
                for offset, _, record in tfrecord.iter_framed(f, path):
                    try:
                        example = schema.decode_example(record)
                        label = example[names["label"]][0]
                        digest = example[names["sha256"]][0]
                        size = (example[names["height"]][0], example[names["width"]][0])
                    except (ValueError, struct.error, KeyError, IndexError) as e:
                        raise tfrecord.CorruptRecord(f"{path}: the record at byte {offset} is not one of this dataset's Examples ({e})") from None
                    records += 1
                    labels[label] += 1
                    hash_count[digest] += 1
                    hash_splits[digest].add(split_name)
                    sizes[size] += 1
                    if preview_per_class and label in preview and len(preview[label]) < preview_per_class:
                        preview[label].append({"split": split_name, "image": example[names["image"]][0]})
        splits[split_name] = {
            "examples": split["examples"],
            "records_read": records,
            "shards": len(split["shards"]),
            "shard_bytes": _spread([s["bytes"] for s in split["shards"]]),
            "label_counts": {(label_names[i] if 0 <= i < len(label_names) else f"<id {i}>"): labels[i] for i in sorted(labels)},
            "index": bool(split.get("index")),
        }
    report = {
        "dir": data_dir,
        "schema": document["schema"],
        "label_names": label_names,
        "channels": document["channels"],
        "image_format": document.get("image_format"),
        "compression": document.get("compression", "none"),
        "splits": splits,
        "image_sizes": _sizes(sizes),
        "rejected": {"total": document["rejected"]["total"], "by_reason": document["rejected"]["by_reason"]},
        # Counted from the shards as they are now; what the conversion recorded, where it did, rides along.
        "duplicates": dict(_duplicates(hash_count), recorded=document.get("duplicates")),
        "leakage": dict(_leakage(hash_splits), recorded=_recorded_leakage(document.get("leakage"))),
    }
    if preview_per_class:
        report["preview"] = preview
    return report


def _weighted_spread(counts: collections.Counter) -> dict:
    """min / median / max of values given as value -> how many times it occurs."""
    if not counts:
        return _spread([])
    ordered = sorted(counts.items())
    total, seen, median = sum(counts.values()), 0, None
    for value, n in ordered:
        seen += n
        if seen * 2 >= total:
            median = value
            break
    return {"min": ordered[0][0], "median": median, "max": ordered[-1][0]}


def _sizes(sizes: collections.Counter) -> dict:
    heights, widths = collections.Counter(), collections.Counter()
    for (h, w), n in sizes.items():
        heights[h] += n
        widths[w] += n
    return {
        "height": _weighted_spread(heights),
        "width": _weighted_spread(widths),
        "distinct": len(sizes),
        "most_common": [{"height": h, "width": w, "records": n} for (h, w), n in sizes.most_common(5)],
    }


def _duplicates(hash_count: collections.Counter) -> dict:
    """Records whose stored bytes (sha256) another record also has."""
    groups = [n for n in hash_count.values() if n > 1]
    return {"images": len(groups), "extra_records": sum(n - 1 for n in groups), "source": "shards"}


def _recorded_leakage(leakage):
    """dataset.json's leakage without its list of groups (keys of up to 100 images): the count is what a report needs."""
    return {k: v for k, v in leakage.items() if k != "groups"} if isinstance(leakage, dict) else leakage


def _leakage(hash_splits: dict) -> dict:
    """Images (by sha256) in more than one split: evaluation on them measures memory, not generalisation."""
    pairs = collections.Counter()
    leaked = 0
    for found in hash_splits.values():
        if len(found) > 1:
            leaked += 1
            ordered = _split_order(found)
            for i, a in enumerate(ordered):
                for b in ordered[i + 1 :]:
                    pairs[f"{a}/{b}"] += 1
    return {"images": leaked, "by_pair": dict(sorted(pairs.items())), "source": "shards"}


# --- output ---------------------------------------------------------------------------


def to_json(report: dict) -> dict:
    """The report without the preview's image bytes."""
    return {k: v for k, v in report.items() if k != "preview"}


def _mb(n) -> str:
    return f"{n / 1e6:.2f}" if n is not None else "-"


def text_lines(report: dict) -> list:
    """The report as a person reads it."""
    channels = "1 channel (grayscale)" if report["channels"] == 1 else f"{report['channels']} channels"
    lines = [f"{report['dir']}: {len(report['label_names'])} classes, {channels}, {report['image_format']}, compression {report['compression']}, schema {report['schema']}", ""]
    lines.append(f"{'split':<12}{'examples':>10}{'shards':>8}   shard MB min / median / max{'':4}index")
    for name, s in report["splits"].items():
        spread = s["shard_bytes"]
        lines.append(f"{name:<12}{s['examples']:>10}{s['shards']:>8}   {_mb(spread['min']):>6} / {_mb(spread['median']):>6} / {_mb(spread['max']):>6}{'':9}{'yes' if s['index'] else 'no'}")
        if s["records_read"] != s["examples"]:
            lines.append(f"  WARNING: the shards hold {s['records_read']} records, dataset.json says {s['examples']}")
    for name, s in report["splits"].items():
        counts = s["label_counts"]
        lines += ["", f"classes in {name} ({s['records_read']} records)"]
        top = max(counts.values(), default=0)
        width = max((len(label) for label in counts), default=5)
        for label in report["label_names"] + [k for k in counts if k not in report["label_names"]]:
            n = counts.get(label, 0)
            bar = "#" * round(BAR_WIDTH * n / top) if top else ""
            lines.append(f"  {label:<{width}} {n:>7} {100 * n / max(s['records_read'], 1):5.1f}%  {bar}")
    sizes = report["image_sizes"]
    total = sum(m["records"] for m in sizes["most_common"]) if sizes["most_common"] else 0
    lines += ["", f"image sizes: {sizes['distinct']} distinct; height min/median/max {sizes['height']['min']} / {sizes['height']['median']} / {sizes['height']['max']}, width {sizes['width']['min']} / {sizes['width']['median']} / {sizes['width']['max']}"]
    everything = sum(s["records_read"] for s in report["splits"].values()) or 1
    for m in sizes["most_common"]:
        lines.append(f"  {m['height']}x{m['width']} (h x w) {m['records']:>8} {100 * m['records'] / everything:5.1f}%")
    if sizes["distinct"] > len(sizes["most_common"]):
        lines.append(f"  ... and {everything - total} records in {sizes['distinct'] - len(sizes['most_common'])} other sizes")
    rejected = report["rejected"]
    reasons = ", ".join(f"{reason} {n}" for reason, n in rejected["by_reason"].items()) or "none"
    dup, leak = report["duplicates"], report["leakage"]
    pairs = ", ".join(f"{pair} {n}" for pair, n in leak.get("by_pair", {}).items())
    removed = (dup.get("recorded") or {}).get("removed")
    lines += [
        "",
        f"rejected: {rejected['total']} ({reasons})",
        f"duplicates: {dup['images']} images stored more than once, {dup['extra_records']} extra records (sha256 of the stored bytes)"
        + (f"; --dedup removed {removed} at conversion" if removed else ""),
        f"split leakage: {leak['images']} images in more than one split{f' ({pairs})' if pairs else ''}",
    ]
    return lines


def _fit(image, box: int):
    """Scale into a box x box square: small images up by whole pixels, so they stay sharp; large ones down."""
    from PIL import Image

    scale = min(box / image.width, box / image.height)
    if scale >= 1:
        factor = max(int(scale), 1)
        return image.resize((image.width * factor, image.height * factor), Image.NEAREST)
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.LANCZOS)


def write_preview(report: dict, path: str, cell: int = CELL) -> None:
    """A contact sheet: one row per class, its name on the left, then its images; written atomically."""
    import os

    from PIL import Image, ImageDraw, ImageFont, UnidentifiedImageError

    font = ImageFont.load_default(size=14)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    names = report["label_names"]
    label_width = int(max((measure.textlength(n, font=font) for n in names), default=0)) + 16
    per_class = max((len(v) for v in report["preview"].values()), default=0)
    pad = 4
    title_height = 24
    width = label_width + max(per_class, 1) * (cell + pad) + pad
    height = title_height + len(names) * (cell + pad) + pad
    sheet = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(sheet)
    draw.text((pad, 4), f"{report['dir'].rstrip('/').split('/')[-1]}: {per_class} per class, from the shards", fill="black", font=font)
    for row, name in enumerate(names):
        top = title_height + row * (cell + pad) + pad
        draw.text((pad, top + cell // 2 - 8), name, fill="black", font=font)
        for col, item in enumerate(report["preview"].get(row, [])):
            left = label_width + col * (cell + pad)
            draw.rectangle([left - 1, top - 1, left + cell, top + cell], outline=(200, 200, 200))
            try:
                with Image.open(io.BytesIO(item["image"])) as im:
                    thumb = _fit(im.convert("RGB"), cell)
            except (UnidentifiedImageError, OSError):  # a record whose bytes do not decode: show it, do not hide it
                draw.line([left, top, left + cell, top + cell], fill="red", width=2)
                draw.line([left, top + cell, left + cell, top], fill="red", width=2)
                continue
            sheet.paste(thumb, (left + (cell - thumb.width) // 2, top + (cell - thumb.height) // 2))
    temp = f"{path}.tmp.png"
    sheet.save(temp, format="PNG")
    os.replace(temp, path)
