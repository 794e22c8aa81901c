"""The summary printed at the end of a conversion."""

from beam_etl import metadata


def summary_lines(document: dict, elapsed: float) -> list:
    """Per split its examples, shards and MB; rejects by reason; time and rate."""
    lines = [f"{'split':<12}{'examples':>10}{'shards':>8}{'MB':>10}"]
    written = 0
    for name, split in document["splits"].items():
        written += split["examples"]
        lines.append(f"{name:<12}{split['examples']:>10}{len(split['shards']):>8}{split['bytes'] / 1e6:>10.1f}")
    rejected = document["rejected"]
    reasons = ", ".join(f"{reason} {n}" for reason, n in rejected["by_reason"].items()) or "none"
    lines.append(f"rejected: {rejected['total']} ({reasons})")
    leakage = document.get("leakage", {}).get("images", 0)
    if leakage:
        lines.append(f"leakage: {leakage} images stored in more than one split; their keys are in dataset.json")
    rate = document["inputs"] / elapsed if elapsed > 0 else 0.0
    lines.append(f"{document['inputs']} inputs in {elapsed:.1f} s: {rate:.0f} images/s")
    return lines


def print_summary(output: str, elapsed: float) -> None:
    document = metadata.read(output)
    print(f"wrote {output}")
    for line in summary_lines(document, elapsed):
        print(line)
