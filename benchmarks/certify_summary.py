"""Print a certificate's figures as a table an administrator reads: value, interval, verdict, and the share of
the card's datasheet peak and of its published achievable (ddlbench.certify.cards), with checks' findings.

    python benchmarks/certify_summary.py certificate.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: str) -> None:
    certificate = json.loads(Path(path).read_text())
    head = f"{certificate['system']}:{certificate['partition']} {certificate.get('suite')}"
    print(f"{head}: device {certificate['device']}, card {certificate['card']}, passed {certificate['passed']}, "
          f"counts {certificate['counts']}")  # fmt: skip
    for entry in certificate["figures"]:
        card = entry.get("card") or {}
        value = "—" if entry["value"] is None else f"{entry['value']:.4g}"
        interval = "" if entry["ci_low"] is None else f" [{entry['ci_low']:.4g}, {entry['ci_high']:.4g}]"
        shares = ""
        if card:
            shares = f" = {100 * card['share_of_peak']:.1f} % of peak"
            if card.get("share_of_achievable") is not None:
                shares += f", {100 * card['share_of_achievable']:.1f} % of achievable"
        note = entry.get("finding") or entry.get("why_missing") or ""
        print(f"  {entry['name']:<50} {value}{interval} {entry['unit']} n={entry['n']} {entry['status']}{shares}"
              f"{'  ' + note if note else ''}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
