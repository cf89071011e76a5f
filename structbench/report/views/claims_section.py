"""The report's "Papers' claims" section: the latest verdict of each paper's claim at each scale, from the stores'
claims tables (`structbench claims`), beside the paper's own number.

One row per (paper, claim, scale): the most recently checked. A verdict is "holds", "does not hold at this scale"
(the numbers say by how much) or "not testable here" (with the reason). The same table is printed by the `claims`
command and rendered in the terminal, Markdown and HTML reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from structbench.report.views import tables
from structbench.store import write as store

TITLE = "Papers' claims"
TONES = {"holds": "good", "does not hold at this scale": "bad", "not testable here": "muted"}
CAPTION = (
    "Each paper's claim checked at small scale by `structbench claims`; the latest check per claim and scale. "
    "Training verdicts are paired over seeds (exact Wilcoxon signed-rank p < 0.05 and a 95% bootstrap CI excluding "
    "0, or inside the paper's gap); below 5 seeds a training claim is not testable ('too few seeds'). "
    "docs/claims.md describes each test."
)


def load(stores: Sequence[Path]) -> pd.DataFrame:
    """The latest row per (paper, claim, scale) over the stores (unreadable claim files are left out; `doctor`
    lists them)."""
    frames = []
    for out in stores:
        frame, _ = store.load_claims(out)
        if not frame.empty:
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=store.CLAIMS_SCHEMA.names)
    frame = pd.concat(frames, ignore_index=True).sort_values("started_at")
    latest = frame.drop_duplicates(["paper", "claim_id", "scale"], keep="last")
    return latest.sort_values(["paper", "claim_id", "scale"], kind="stable").reset_index(drop=True)


def claims_table(frame: pd.DataFrame) -> tables.Table | None:
    if frame.empty:
        return None
    columns = [
        tables.Column("claim", left=True),
        tables.Column("statement (paper)", left=True, prose=True),
        tables.Column("paper's number", left=True, prose=True),
        tables.Column("ours", left=True, prose=True),
        tables.Column("verdict", left=True),
        tables.Column("scale · seeds · budget", left=True, prose=True),
    ]
    rows = []
    for row in frame.itertuples(index=False):
        verdict = tables.Cell(row.verdict, sub=row.reason or "", tone=TONES.get(row.verdict, ""))
        rows.append(
            [
                tables.Cell(f"{row.paper}/{row.claim_id}"),
                tables.Cell(row.statement, sub=row.source),
                tables.Cell(row.paper_value),
                tables.Cell(row.summary),
                verdict,
                tables.Cell(f"{row.scale} · {row.seeds}", sub=f"{row.budget}; {row.tuning}".strip("; ")),
            ]
        )
    return tables.Table(TITLE, columns, rows, caption=CAPTION, key="claims")
