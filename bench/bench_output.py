"""The --json and --csv outputs of the Python benchmarks (compare_linear, compare_attention,
compare_adaln): one JSON document, and the rows as CSV with every key any row has."""

from __future__ import annotations

import csv
import json


def write_outputs(document: dict, json_path: str | None, csv_path: str | None) -> None:
    """Writes ``document`` (its "rows": a list of dicts) as JSON to ``json_path`` and its
    rows as CSV to ``csv_path``, each where given."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(document, f, indent=2)
    rows = document.get("rows", [])
    if csv_path and rows:
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=sorted({key for r in rows for key in r}))
            writer.writeheader()
            writer.writerows(rows)
