"""The report's selection of a setting among an optimizer's settings, and its Sweeps section, on hand-built stores.

The selection must never use the test split (`final_eval_*`, the eval curves, time to target): it uses the
validation metric where the runs record one, else the final training loss. Every expected value below is worked
out by hand from the numbers written into the store.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from structbench.report import build
from structbench.report.figures import plots, render
from structbench.report.figures.figure_file import optimizer_looks
from structbench.report.views import tables
from structbench.store import write as store
from tests.support.store import write_run

U = 2.0**-53  # float64 unit roundoff
# A median of two stored decimals, (a + b) / 2, against the decimal literal: a's, b's and the literal's
# representation errors and the sum's rounding, all relative (positive terms): 4 u. Another setting's or seed's
# value, or the mean over the grid, is off by >= 0.05.
MEDIAN_OF_TWO = 4 * U / (1 - 4 * U)

LRS = (0.01, 0.02, 0.04)

# Three seeds per learning rate. Each quantity favours a different learning rate:
#   test accuracy (final_eval_metric, higher is better): 0.04 (medians 0.81, 0.86, 0.91);
#   validation accuracy (final_val_metric, higher is better): 0.02 (medians 0.70, 0.78, 0.74);
#   training loss (final_train_loss, lower is better): 0.01 (medians 0.31, 0.40, 0.50; lr 0.04 has the lowest
#   single seed, 0.20, but not the lowest median);
#   time to the loss target 0.5 (eval curve): 0.04 crosses it before step 10, the others after.
TEST_ACCURACY = {0.01: (0.80, 0.81, 0.82), 0.02: (0.85, 0.86, 0.87), 0.04: (0.90, 0.91, 0.92)}
VAL_ACCURACY = {0.01: (0.69, 0.70, 0.71), 0.02: (0.77, 0.78, 0.80), 0.04: (0.70, 0.74, 0.79)}
TRAIN_LOSS = {0.01: (0.31, 0.30, 0.35), 0.02: (0.40, 0.38, 0.45), 0.04: (0.50, 0.20, 0.60)}
LOSS_AT_10 = {0.01: 0.9, 0.02: 0.8, 0.04: 0.3}


def set_columns(out: Path, run_id: str, **columns: float) -> None:
    """Give a stored run row extra float columns (as a store written by a newer runner would hold them)."""
    path = out / "runs" / f"{run_id}.parquet"
    table = pq.read_table(path)
    for name, value in columns.items():
        column = pa.array([value], pa.float64())
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, column)
        else:
            table = table.append_column(name, column)
    pq.write_table(table, path)


def sweep_run(
    out: Path,
    optim: str,
    hparams: dict,
    seed: int,
    *,
    train_loss: float,
    test_accuracy: float = 0.5,
    loss_at_10: float = 0.9,
    status: str = "ok",
    suite: str = "hand",
    target: dict | None = None,
    **columns: float,
) -> str:
    run_id = ("" if suite == "hand" else f"{suite}-") + f"{optim}-"
    run_id += "-".join(f"{k}{v}" for k, v in hparams.items()) + f"-s{seed}"
    evals = [(0, 0.0, 2.0, 0.1), (10, 1.0, loss_at_10, 0.3), (20, 2.0, 0.2, test_accuracy)]
    if status != "ok":
        evals = evals[:2]
    write_run(
        out,
        run_id,
        optim,
        seed,
        evals,
        suite=suite,
        status=status,
        hparams=hparams,
        target=target,
        final_train_loss=train_loss if status == "ok" else None,
    )
    if columns:
        set_columns(out, run_id, **columns)
    return run_id


def write_three_way_store(out: Path, validation: bool) -> None:
    store.prepare(out)
    for lr in LRS:
        for seed in range(3):
            sweep_run(
                out,
                "sgd",
                {"lr": lr},
                seed,
                train_loss=TRAIN_LOSS[lr][seed],
                test_accuracy=TEST_ACCURACY[lr][seed],
                loss_at_10=LOSS_AT_10[lr],
                target={"metric": "loss", "value": 0.5},
                **({"final_val_metric": VAL_ACCURACY[lr][seed]} if validation else {}),
            )


def by_median(values: dict[float, tuple[float, ...]], best) -> float:
    """The learning rate whose median over seeds is best (`best` is min or max)."""
    medians = {lr: statistics.median(v) for lr, v in values.items()}
    return best(medians, key=medians.__getitem__)


def test_the_hand_numbers_favour_three_different_settings():
    assert by_median(TEST_ACCURACY, max) == 0.04
    assert by_median(VAL_ACCURACY, max) == 0.02
    assert by_median(TRAIN_LOSS, min) == 0.01
    assert min(min(v) for v in TRAIN_LOSS.values()) in TRAIN_LOSS[0.04]  # the best single seed is not the pick


def test_validation_metric_selects_when_the_runs_record_one(tmp_path, cli):
    out = tmp_path / "results"
    write_three_way_store(out, validation=True)
    [suite] = build.build_report(out).suites
    assert suite.selected["sgd"].label == "sgd lr=0.02"
    selection = suite.selections["sgd"]
    assert selection.criterion.describe() == "selected on validation accuracy"
    chosen = selection.score_of(suite.selected["sgd"].variant)
    assert (chosen.median, chosen.lo, chosen.hi, chosen.n) == (0.78, 0.77, 0.80, 3)
    assert any("selected on validation accuracy" in note for note in suite.notes)
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    assert "selected on validation accuracy" in " ".join(result.stdout.split())
    assert "validation accuracy ↑" in result.stdout  # the sweep table's metric column
    # The old rule would have picked lr 0.04 here: fastest to the target and best on the test split.
    fastest = min(suite.variants, key=lambda v: v.seconds_to_target.median)
    assert fastest.label == "sgd lr=0.04"


def test_without_validation_the_training_loss_selects_not_the_test_metric(tmp_path, cli):
    out = tmp_path / "results"
    write_three_way_store(out, validation=False)
    [suite] = build.build_report(out).suites
    assert suite.selected["sgd"].label == "sgd lr=0.01"
    assert suite.selections["sgd"].criterion.describe() == "selected on training loss (no validation split)"
    best_test = max(suite.variants, key=lambda v: v.final_metric.median)
    assert best_test.label == "sgd lr=0.04"
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "selected on training loss (no validation split)" in text
    assert "sgd lr=0.01 represents it" in text


def test_validation_recorded_for_only_some_settings_falls_back_to_training_loss(tmp_path):
    out = tmp_path / "results"
    write_three_way_store(out, validation=False)
    for seed in range(3):
        set_columns(out, f"sgd-lr0.02-s{seed}", final_val_metric=VAL_ACCURACY[0.02][seed])
    [suite] = build.build_report(out).suites
    assert suite.selections["sgd"].criterion.describe() == "selected on training loss (no validation split)"
    assert suite.selected["sgd"].label == "sgd lr=0.01"


def test_a_setting_with_a_diverged_seed_is_never_selected_over_one_without(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    # lr 0.1: two ok seeds with training loss 0.05 (the best median over ok seeds) and one diverged seed.
    # lr 0.01: three ok seeds, median 0.3. lr 1.0: every seed diverged.
    for seed, loss in enumerate((0.3, 0.2, 0.4)):
        sweep_run(out, "sgd", {"lr": 0.01}, seed, train_loss=loss)
    sweep_run(out, "sgd", {"lr": 0.1}, 0, train_loss=0.05)
    sweep_run(out, "sgd", {"lr": 0.1}, 1, train_loss=0.05)
    sweep_run(out, "sgd", {"lr": 0.1}, 2, train_loss=0.0, status="diverged")
    for seed in range(3):
        sweep_run(out, "sgd", {"lr": 1.0}, seed, train_loss=0.0, status="diverged")
    [suite] = build.build_report(out).suites
    assert suite.selected["sgd"].label == "sgd lr=0.01"
    [sweep] = suite.sweeps
    table = tables.sweep_table(sweep)
    rows = {row[0].text: row for row in table.rows}
    assert rows["lr=0.1"][1].text == "2" and "1 diverged" in rows["lr=0.1"][1].sub
    assert rows["lr=0.1"][2].text == "0.05"
    assert rows["lr=1"][2].text == "-"
    assert rows["lr=0.01"][4].text == "◀ selected"
    # 0.01 is the smallest lr run: the edge warning names it.
    assert sweep.warnings == ["sgd: best lr 0.01 is at the lower edge of the grid [0.01, 1]: widen the grid"]


def write_grid(out: Path, losses: dict[float, tuple[float, ...]], optim: str = "sgd", suite: str = "hand") -> None:
    for lr, per_seed in losses.items():
        for seed, loss in enumerate(per_seed):
            sweep_run(out, optim, {"lr": lr}, seed, train_loss=loss, suite=suite)


def test_edge_warning_when_the_best_lr_is_the_largest_and_none_when_in_the_middle(tmp_path, cli):
    out = tmp_path / "results"
    store.prepare(out)
    # Suite "edge": medians 0.5, 0.4, 0.3 -> lr 0.04, the largest, is best.
    write_grid(out, {0.01: (0.5, 0.6, 0.4), 0.02: (0.4, 0.35, 0.45), 0.04: (0.3, 0.25, 0.35)}, suite="edge")
    # Suite "middle": medians 0.5, 0.2, 0.4 -> lr 0.02 is best.
    write_grid(out, {0.01: (0.5, 0.6, 0.4), 0.02: (0.2, 0.1, 0.3), 0.04: (0.4, 0.35, 0.45)}, suite="middle")
    report = build.build_report(out)
    suites = {s.name: s for s in report.suites}
    [edge] = suites["edge"].sweeps
    [middle] = suites["middle"].sweeps
    warning = "sgd: best lr 0.04 is at the upper edge of the grid [0.01, 0.04]: widen the grid"
    assert edge.warnings == [warning]
    assert middle.warnings == []
    assert suites["middle"].selected["sgd"].label == "sgd lr=0.02"
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert warning in text
    assert text.count("edge of the grid") == 1
    # The compact table: seeds, median and min-max of the training loss per setting, the selected one marked.
    rows = {row[0].text: row for row in tables.sweep_table(edge).rows}
    assert [c.text for c in rows["lr=0.04"][1:]] == ["3", "0.3", "0.25 – 0.35", "◀ selected"]
    assert [c.text for c in rows["lr=0.01"][1:]] == ["3", "0.5", "0.4 – 0.6", ""]


def test_two_swept_keys_hold_the_others_at_the_selected_setting(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    # lr x weight_decay; two seeds each. Median training loss = the mean of the two seeds here:
    #   wd 0.0: lr 0.01 -> 0.60, 0.02 -> 0.50, 0.04 -> 0.55;  wd 0.1: lr 0.01 -> 0.45, 0.02 -> 0.30, 0.04 -> 0.40.
    # Best: lr 0.02, wd 0.1 (in the lr middle; at the upper edge of the wd grid [0, 0.1]).
    losses = {
        (0.01, 0.0): (0.55, 0.65),
        (0.02, 0.0): (0.45, 0.55),
        (0.04, 0.0): (0.50, 0.60),
        (0.01, 0.1): (0.40, 0.50),
        (0.02, 0.1): (0.25, 0.35),
        (0.04, 0.1): (0.35, 0.45),
    }
    for (lr, wd), per_seed in losses.items():
        for seed, loss in enumerate(per_seed):
            sweep_run(out, "adamw", {"lr": lr, "weight_decay": wd}, seed, train_loss=loss)
    [suite] = build.build_report(out).suites
    assert suite.selected["adamw"].label == "adamw lr=0.02, weight_decay=0.1"
    [sweep] = suite.sweeps
    assert sweep.names == ["lr", "weight_decay"]
    lr_axis, wd_axis = sweep.axes
    assert [p.value for p in lr_axis.points] == [0.01, 0.02, 0.04] and dict(lr_axis.fixed) == {"weight_decay": 0.1}
    assert [p.score.median for p in lr_axis.points] == pytest.approx([0.45, 0.30, 0.40], rel=MEDIAN_OF_TWO)
    assert [p.value for p in wd_axis.points] == [0.0, 0.1] and dict(wd_axis.fixed) == {"lr": 0.02}
    assert [p.score.median for p in wd_axis.points] == pytest.approx([0.50, 0.30], rel=MEDIAN_OF_TWO)
    assert sweep.warnings == [
        "adamw: best weight_decay 0.1 is at the upper edge of the grid [0, 0.1]: widen the grid (with lr=0.02)"
    ]
    figure = plots.sweeps_figure([sweep], optimizer_looks(["adamw"]))
    lr_ax, wd_ax = figure.axes  # one panel per swept key
    assert lr_ax.get_xscale() == "log"  # a learning rate
    assert wd_ax.get_xscale() == "linear"  # 0 is not positive
    assert "weight_decay=0.1" in lr_ax.get_xlabel()
    assert "held at the selected setting" in tables.sweep_table(sweep).caption


def test_other_keys_are_log_only_when_positive_and_wider_than_a_factor_10(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    # adamw over eps 1e-8 .. 1e-4 (positive, a factor 1e4): log. sgd over momentum 0.8 .. 0.95 (a factor 1.19): linear.
    for eps, loss in ((1e-8, 0.3), (1e-6, 0.2), (1e-4, 0.4)):
        for seed in range(2):
            sweep_run(out, "adamw", {"lr": 0.01, "eps": eps}, seed, train_loss=loss)
    for momentum, loss in ((0.8, 0.5), (0.9, 0.4), (0.95, 0.45)):
        for seed in range(2):
            sweep_run(out, "sgd", {"lr": 0.01, "momentum": momentum}, seed, train_loss=loss)
    [suite] = build.build_report(out).suites
    adamw, sgd = suite.sweeps
    assert (adamw.names, sgd.names) == (["eps"], ["momentum"])  # lr did not vary
    eps_ax, momentum_ax = plots.sweeps_figure(suite.sweeps, optimizer_looks(["adamw", "sgd"])).axes
    assert eps_ax.get_xscale() == "log" and momentum_ax.get_xscale() == "linear"
    # Both best values are in the middle of their grids: no warning.
    assert suite.selected["adamw"].label == "adamw eps=1e-06" and suite.selected["sgd"].label == "sgd momentum=0.9"
    assert adamw.warnings == [] and sgd.warnings == []


def test_markdown_and_html_carry_the_sweep_table_and_figure_with_a_log_lr_axis(tmp_path, cli, monkeypatch):
    out = tmp_path / "results"
    store.prepare(out)
    write_grid(out, {0.001: (0.9, 0.8), 0.01: (0.4, 0.5), 0.1: (0.6, 0.7)})
    sweep_run(out, "adamw", {"lr": 0.001}, 0, train_loss=0.5)
    report = build.build_report(out, plotted=True)
    [suite] = report.suites
    [sweep] = suite.sweeps  # adamw ran one setting: no sweep
    assert sweep.optim == "sgd" and sweep.warnings == []
    figure = plots.sweeps_figure([sweep], optimizer_looks(report.optims))
    [ax] = figure.axes
    assert ax.get_xscale() == "log"
    assert ax.get_xlabel() == "lr"
    drawn = render.render_figures(report, workers=1)
    [png] = [f for f in drawn if f.name == "hand-sweeps"]
    assert set(png.run_ids) == {f"sgd-lr{lr}-s{s}" for lr in (0.001, 0.01, 0.1) for s in range(2)}
    with monkeypatch.context() as patched:  # the sweep figure is kept in the figure cache like the others
        patched.setattr(render, "_draw", lambda task: pytest.fail(f"drew the figures of task {task} again"))
        assert render.render_figures(build.build_report(out, plotted=True), workers=1) == drawn

    result = cli("report", "--out", out, "--format", "all", "--to", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rep" / "figures" / "hand-sweeps.png").is_file()
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "### hand: sweeps" in md and "#### hand: sgd over lr" in md
    assert md.count("figures/hand-sweeps.png") == 1
    assert md.index("### hand: sweeps") < md.index("figures/hand-sweeps.png") < md.index("#### hand: sgd over lr")
    # lr 0.01: median (0.4 + 0.5) / 2 = 0.45, range 0.4 - 0.5, two seeds, selected.
    assert "| [lr=0.01](#runs-hand-sgd-lr-0-01) | 2 | **0.45** | 0.4 – 0.5 | ◀ selected |" in md
    assert "Selected on training loss (no validation split)" in md
    html = (tmp_path / "rep" / "report.html").read_text()
    assert 'id="sweeps-hand"' in html and html.count('id="fig-hand-sweeps"') == 1
    assert "selected on training loss (no validation split)" in html


@pytest.mark.parametrize(
    ("count", "anchor", "width", "spacing", "expected"),
    [
        (10, 7, 30.0, 20.0, [1, 3, 5, 7, 9]),  # 30 * 1.2 / 20 = 1.8: every second, counted from the selected
        (10, 0, 60.0, 20.0, [0, 4, 8]),  # 72 / 20 = 3.6: every fourth
        (5, 2, 10.0, 40.0, [0, 1, 2, 3, 4]),  # room for every label
        (1, 0, 30.0, 0.0, [0]),
    ],
)
def test_labelled_ticks_thin_to_every_kth_from_the_selected_value(count, anchor, width, spacing, expected):
    assert plots.labelled_ticks(count, anchor, width, spacing) == expected


def test_the_suites_sweeps_are_small_multiples_with_the_seed_counts_written_once(tmp_path):
    """Five swept optimizers: five panels, four to a row, the y axis labelled on the first column; a panel whose
    points all have both seeds says so in its title and annotates nothing; one seed diverging at one lr is written
    above that point only."""
    out = tmp_path / "results"
    store.prepare(out)
    optims = ["adamw", "lion", "muon", "sgd", "soap"]
    for optim in optims:
        for lr, loss in ((0.001, 0.5), (0.01, 0.3), (0.1, 0.4)):
            for seed in range(2):
                diverged = optim == "sgd" and lr == 0.1 and seed == 1
                status = "diverged" if diverged else "ok"
                sweep_run(out, optim, {"lr": lr}, seed, train_loss=loss + 0.01 * seed, status=status)
    report = build.build_report(out, plotted=True)
    [suite] = report.suites
    looks = optimizer_looks(report.optims)
    figure = plots.sweeps_figure(suite.sweeps, looks)
    assert len(figure.axes) == 5
    assert [ax.get_subplotspec().get_geometry()[:2] for ax in figure.axes] == [(2, 4)] * 5
    assert [ax.get_ylabel() != "" for ax in figure.axes] == [True, False, False, False, True]
    for ax, optim in zip(figure.axes, optims, strict=True):
        [errorbar] = ax.containers
        assert errorbar.lines[0].get_color() == looks[optim].color
        if optim == "sgd":
            assert ax.get_title(loc="left") == "sgd\nn=2 unless marked"
            [note] = ax.texts
            assert note.get_text() == "n=1/2, 1 diverged" and note.xy[0] == 0.1  # the point's own lr: exact
        else:
            assert ax.get_title(loc="left") == f"{optim}\nn=2 at each point"
            assert len(ax.texts) == 0
    [png] = [f for f in render.render_figures(report, workers=1, cache=False) if f.name == "hand-sweeps"]
    assert png.title == "hand: sweeps, selected on training loss (no validation split)"
    assert len(png.run_ids) == 5 * 3 * 2


def test_a_dense_lr_grid_keeps_its_tick_labels_apart_and_labels_the_selected_value(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    grid = [0.001 * 1.8**i for i in range(10)]
    write_grid(out, {lr: (abs(i - 7) * 0.1 + 0.1,) for i, lr in enumerate(grid)})  # grid[7]: best, not a multiple
    [suite] = build.build_report(out).suites
    figure = plots.sweeps_figure(suite.sweeps, optimizer_looks(["sgd"]))
    FigureCanvasAgg(figure).draw()
    [ax] = figure.axes
    shown = [t for t in ax.xaxis.get_ticklabels() if t.get_text()]
    assert 2 <= len(shown) < 10
    assert f"{grid[7]:.3g}" in [t.get_text() for t in shown]
    boxes = sorted((t.get_window_extent().x0, t.get_window_extent().x1) for t in shown)
    assert all(right < left for (_, right), (left, _) in itertools.pairwise(boxes))


def test_sweeps_selected_on_different_metrics_label_every_panel_and_leave_the_metric_out_of_the_title(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    for lr, loss in ((0.01, 0.5), (0.1, 0.3)):
        for seed in range(2):
            sweep_run(out, "adamw", {"lr": lr}, seed, train_loss=loss, final_val_metric=1 - loss)  # validated
            sweep_run(out, "sgd", {"lr": lr}, seed, train_loss=loss)  # training loss only
    report = build.build_report(out, plotted=True)
    [suite] = report.suites
    assert [s.criterion.describe() for s in suite.sweeps] == [
        "selected on validation accuracy",
        "selected on training loss (no validation split)",
    ]
    adamw_ax, sgd_ax = plots.sweeps_figure(suite.sweeps, optimizer_looks(report.optims)).axes
    assert (adamw_ax.get_ylabel(), sgd_ax.get_ylabel()) == ("final validation accuracy ↑", "final training loss ↓")
    [png] = [f for f in render.render_figures(report, workers=1, cache=False) if f.name == "hand-sweeps"]
    assert png.title == "hand: sweeps"
