"""The results file the end-to-end scripts share (``python.json``, the format of
``bench/results/*.json``, family ``python``): each script adds its rows and notes to what is
there, replacing only its own rows (those of the kernels it measures) and its own notes (by
prefix), so the scripts can run in any order into one file."""

import datetime
import json
import os
import subprocess

import torch


def driver_version() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[0]
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        return f"unknown ({e})"


def write_results(path: str, commit: str, rows: list, notes: list, note_prefix: str) -> None:
    """Merge ``rows`` and ``notes`` into the results file at ``path``: rows of the same
    ``kernel`` names and notes starting with ``note_prefix`` are replaced, everything else is
    kept; the header (device, driver, commit, date) is this run's, and every row carries the
    device, driver, commit and date of the run that measured it (kept rows without them take
    the old header's)."""
    old = {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = {}
    kernels = {r["kernel"] for r in rows}
    stamp = ("device", "driver", "commit", "date")
    kept_rows = [
        {**{k: old.get(k) for k in stamp}, **r}
        for r in old.get("rows", []) if r.get("kernel") not in kernels
    ]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    device, driver = torch.cuda.get_device_name(), driver_version()
    rows = [{**r, "device": device, "driver": driver, "commit": commit, "date": date} for r in rows]
    kept_notes = [n for n in old.get("notes", []) if not n.startswith(note_prefix)]
    result = {
        "device": device,
        "driver": driver,
        "commit": commit,
        "date": date,
        "family": "python",
        "ptx_target": "",
        "notes": kept_notes + [note_prefix + n for n in notes],
        "rows": kept_rows + rows,
    }
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, path)
