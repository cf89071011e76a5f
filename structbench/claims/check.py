"""Run registered claims at a scale and store each verdict as soon as it is known."""

from __future__ import annotations

import json
import math
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from structbench import heap, measure
from structbench.claims.base import UNTESTABLE, ClaimDef, Context, Outcome, untestable
from structbench.errors import MissingDataError
from structbench.store import write as store


def check_claims(
    claims: Sequence[ClaimDef],
    scale: str,
    context: Context,
    out: Path | None,
    on_claim: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Each claim's row (store.CLAIMS_SCHEMA), written to `out` (when given) as soon as its verdict is known.

    On CPU the claims run single-threaded (their models are small, and a shared machine's cores then do not
    slow each other down). What is alive before the first run is frozen out of the garbage collector, whose full
    collections (two per training run, for the memory probe) would otherwise dominate the small runs' time.

    A claim whose experiment raises is recorded as not testable, with the error's last line as the reason and
    `error` set in its row (the command exits non-zero then): one broken experiment does not lose the others."""
    threads = torch.get_num_threads()
    if context.device.type == "cpu":
        torch.set_num_threads(1)
    try:
        with heap.frozen():
            return _check(claims, scale, context, out, on_claim)
    finally:
        torch.set_num_threads(threads)


def _check(
    claims: Sequence[ClaimDef],
    scale: str,
    context: Context,
    out: Path | None,
    on_claim: Callable[[dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    batch = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    environment = measure.environment(context.device)
    rows = []
    for claim in claims:
        started = datetime.now(UTC)
        clock = time.perf_counter()
        error = None
        try:
            if scale == "gpu" and context.device.type != "cuda":
                outcome = untestable(f"scale gpu needs a CUDA device; this run has {context.device.type}")
            else:
                outcome = claim.run(scale, context)
        except MissingDataError as exc:  # this machine lacks the data: a verdict about the machine, not an error
            outcome = untestable(exc.summary)
        except Exception:
            error = traceback.format_exc().strip().splitlines()[-1]
            outcome = Outcome(UNTESTABLE, {}, f"the experiment failed: {error}", reason=f"error: {error}")
        row = {
            "claim_row_id": f"{batch}-{claim.paper}-{claim.claim_id}",
            "schema_version": store.SCHEMA_VERSION,
            "paper": claim.paper,
            "claim_id": claim.claim_id,
            "statement": claim.statement,
            "source": claim.source,
            "paper_value": claim.paper_value,
            "scale": scale,
            "seeds": outcome.seeds,
            "numbers": json.dumps({k: _finite_or_none(v) for k, v in outcome.numbers.items()}, sort_keys=True),
            "summary": outcome.summary,
            "verdict": outcome.verdict,
            "reason": outcome.reason,
            "budget": outcome.budget,
            "tuning": outcome.tuning,
            "wall_s": time.perf_counter() - clock,
            "started_at": started,
            "device": environment.get("device"),
            "structbench_version": environment.get("structbench_version"),
            "git_commit": environment.get("git_commit"),
        }
        if out is not None:
            store.write_claim(out, row)
        row["error"] = error
        rows.append(row)
        if on_claim is not None:
            on_claim(row)
    return rows


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
