"""The image-classification task and its on-device augmentation, on tiny datasets in the real on-disk formats.

Expected values are computed here from first principles — windows cut from an explicitly zero-padded array, the
normalisation from numpy's float64 mean and population std of the raw pixels, the label-smoothed cross-entropy
from its definition (Szegedy et al. 2016, Sec. 7) — never read back from the task.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from structbench.errors import UsageError
from structbench.tasks.vision.augment import random_crop_flip
from structbench.tasks.vision.task import DEFAULTS, preflight
from tests.support.datasets import write_cifar10
from tests.support.tasks import vision_task

pytestmark = pytest.mark.filterwarnings("ignore::structbench.data.ChecksumWarning")
U64, U32 = 2.0**-53, 2.0**-24  # float64 and float32 unit roundoff


def gamma(n: int, u: float = U32) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of an n-term sum or dot product."""
    return n * u / (1 - n * u)


# ---------------------------------------------------------------- helpers


def explicit_pad(images: torch.Tensor, padding: int) -> torch.Tensor:
    """Zero padding written out: a zero array with the images copied into its centre."""
    n, c, h, w = images.shape
    out = torch.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=images.dtype)
    out[:, :, padding : padding + h, padding : padding + w] = images
    return out


def window_and_flip_of(out: torch.Tensor, padded: torch.Tensor) -> set[tuple[int, int, bool]]:
    """Every (row, column, flipped) placement whose window of `padded` equals `out` exactly."""
    h, w = out.shape[-2:]
    found = set()
    for row in range(padded.shape[-2] - h + 1):
        for col in range(padded.shape[-1] - w + 1):
            window = padded[:, row : row + h, col : col + w]
            for flipped in (False, True):
                if torch.equal(out, window.flip(-1) if flipped else window):
                    found.add((row, col, flipped))
    return found


def all_windows(padded: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Every h x w window of one C,H',W' image and its mirror image, stacked."""
    windows = [
        padded[:, row : row + h, col : col + w]
        for row in range(padded.shape[-2] - h + 1)
        for col in range(padded.shape[-1] - w + 1)
    ]
    return torch.stack(windows + [window.flip(-1) for window in windows])


def cifar_raw(
    written: dict[str, tuple[np.ndarray, list[int]]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and test images as N,3,32,32 uint8 (CIFAR rows: 1024 red, 1024 green, 1024 blue, row-major) and labels."""
    names = [f"data_batch_{i}" for i in range(1, 6)]
    train_x = np.concatenate([written[n][0] for n in names]).reshape(-1, 3, 32, 32)
    train_y = np.concatenate([written[n][1] for n in names])
    test_x, test_y = written["test_batch"][0].reshape(-1, 3, 32, 32), np.asarray(written["test_batch"][1])
    return train_x, train_y, test_x, test_y


def normaliser(train_x: np.ndarray):
    """x -> (x / 255 - mean_c) / std_c with the training split's float64 mean and population std per channel."""
    scaled = train_x.astype(np.float64) / 255
    mean = scaled.mean(axis=(0, 2, 3)).reshape(1, -1, 1, 1)
    std = scaled.std(axis=(0, 2, 3)).reshape(1, -1, 1, 1)
    return lambda x: (x.astype(np.float64) / 255 - mean) / std


def normalisation_error(train_x: np.ndarray) -> float:
    """A bound on |float32 normalised pixel - float64 (x / 255 - mean) / std| for the task's x * scale + shift:
    scale = 1 / (255 std) and shift = -mean / std rounded to float32 (u |x scale|, u |shift|), the product and
    the sum rounded (u |x scale|, u |z|), with |x scale| <= 1 / std, |shift| = mean / std, |z| <= (1 + mean) / std:
    u (3 + 2 mean) / std, plus the float64 statistics and reference (16 * 2^-53 (1 + mean) / std). Another image
    (or placement) is at least one pixel level, 1 / (255 std) > 1e-2, away: far above this (~1e-6)."""
    scaled = train_x.astype(np.float64) / 255
    mean, std = scaled.mean(axis=(0, 2, 3)), scaled.std(axis=(0, 2, 3))
    return float(((3 + 2 * mean) / std * U32 + 16 * U64 * (1 + mean) / std).max())


def source_of(row: torch.Tensor, candidates: np.ndarray, tolerance: float) -> int:
    """Index of the candidate image `row` is (to the float32 normalisation's `tolerance`); fails if none is."""
    distances = np.abs(candidates - row.double().numpy()[None]).reshape(len(candidates), -1).max(axis=1)
    best = int(distances.argmin())
    assert distances[best] <= tolerance, f"batch row matches no training image (closest off by {distances[best]})"
    return best


def cross_entropy_error(logits: torch.Tensor, loss: float, batch: int) -> float:
    """A bound on |float32 F.cross_entropy (mean, any label smoothing) - the float64 formula| on the same logits.
    log_softmax row i: z_j - m, exp (2 ulp) of it, a C-term sum, its log, two subtractions: within
    gamma_{C+4} (1 + 2 log C + 3 range_i), range_i = max_j z_ij - min_j z_ij; the (1 - s) nll + s / C sum of
    -log p over C classes and the mean over the batch add only nonnegative terms: gamma_{B+C+4} loss. The float64
    reference: the same with 2^-53 (2^-29 of it)."""
    classes = logits.shape[1]
    spread = (logits.amax(dim=1) - logits.amin(dim=1)).double()
    per_row = gamma(classes + 4) * (1 + 2 * math.log(classes) + 3 * spread)
    return (float(per_row.mean()) + gamma(batch + classes + 4) * abs(loss)) * (1 + 2.0**-29)


# ---------------------------------------------------------------- augmentation


def test_crop_is_a_shifted_window_of_the_zero_padded_image() -> None:
    images = torch.randint(0, 256, (200, 3, 6, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = random_crop_flip(images, 2, torch.Generator().manual_seed(1))
    padded = explicit_pad(images, 2)
    assert out.shape == images.shape and out.dtype == torch.uint8
    placements = []
    for k in range(len(images)):
        found = window_and_flip_of(out[k], padded[k])
        assert found, f"example {k} is no window of its padded image"
        placements.append(sorted(found)[0])
    # Every one of the 5 x 5 offsets and both flip states occur among 200 draws (each offset has p = 1/25).
    assert {(r, c) for r, c, _ in placements} == {(r, c) for r in range(5) for c in range(5)}
    assert {f for _, _, f in placements} == {False, True}


def test_flip_is_an_exact_mirror_and_happens_about_half_the_time() -> None:
    images = torch.randint(0, 256, (400, 2, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    out = random_crop_flip(images, 0, torch.Generator().manual_seed(3))
    flipped = []
    for k in range(len(images)):
        same, mirrored = torch.equal(out[k], images[k]), torch.equal(out[k], images[k].flip(-1))
        assert same or mirrored
        flipped.append(mirrored)
    # Binomial(400, 1/2): 4.5 standard deviations either side of 200.
    assert 155 <= sum(flipped) <= 245


def test_same_generator_seed_gives_the_same_batch() -> None:
    images = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    first = random_crop_flip(images, 4, torch.Generator().manual_seed(7))
    again = random_crop_flip(images, 4, torch.Generator().manual_seed(7))
    other = random_crop_flip(images, 4, torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


# ---------------------------------------------------------------- batching, labels, normalisation


def test_every_training_example_once_per_epoch_with_its_label(tmp_path: Path) -> None:
    raw = cifar_raw(write_cifar10(tmp_path, per_batch=5))
    train_x, train_y = raw[0], raw[1]
    candidates, tolerance = normaliser(train_x)(train_x), normalisation_error(train_x)
    task = vision_task(tmp_path, batch_size=4)
    assert task.steps_per_epoch == 7  # 25 examples: six batches of 4, then the partial batch of 1 is kept
    orders = []
    for _ in range(2):
        sources, sizes = [], []
        for _ in range(task.steps_per_epoch):
            inputs, labels = task.next_batch()
            sizes.append(len(labels))
            for row, label in zip(inputs, labels.tolist(), strict=True):
                source = source_of(row, candidates, tolerance)
                assert label == train_y[source]
                sources.append(source)
        assert sizes == [4, 4, 4, 4, 4, 4, 1]
        assert sorted(sources) == list(range(25))
        orders.append(sources)
    assert orders[0] != orders[1], "each epoch draws a new permutation"

    replay = vision_task(tmp_path, batch_size=4)
    assert [source_of(row, candidates, tolerance) for row in replay.next_batch()[0]] == orders[0][:4]


def test_drop_last_keeps_only_full_batches(tmp_path: Path) -> None:
    train_x = cifar_raw(write_cifar10(tmp_path, per_batch=5))[0]
    candidates, tolerance = normaliser(train_x)(train_x), normalisation_error(train_x)
    task = vision_task(tmp_path, batch_size=4, drop_last=True)
    assert task.steps_per_epoch == 6
    for _ in range(2):
        sources = [source_of(row, candidates, tolerance) for _ in range(6) for row in task.next_batch()[0]]
        assert len(sources) == len(set(sources)) == 24


def test_normalised_training_inputs_have_zero_mean_unit_std_per_channel(tmp_path: Path) -> None:
    train_x = cifar_raw(write_cifar10(tmp_path, per_batch=5))[0]
    task = vision_task(tmp_path, batch_size=25)
    inputs, _ = task.next_batch()
    assert inputs.dtype == torch.float32
    # Over the whole split the exact normalised pixels have mean 0 and population std 1; each float32 pixel is
    # within normalisation_error of its exact value, and the mean and the (1-Lipschitz) std move by no more. The
    # float64 mean and std of n = 25 * 1024 values per channel: gamma_{2n} (2^-53) times max z^2 (~3 here).
    # Statistics of another split, or the sample std (n - 1), are off by >= 2e-5.
    n = inputs.numel() // 3
    z_max = float(inputs.double().abs().max())
    tolerance = normalisation_error(train_x) + gamma(2 * n, U64) * max(1.0, z_max**2)
    zeros, ones = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    assert torch.allclose(inputs.double().mean(dim=(0, 2, 3)), zeros, rtol=0, atol=tolerance)
    assert torch.allclose(inputs.double().std(dim=(0, 2, 3), correction=0), ones, rtol=0, atol=tolerance)


def test_crop_flip_batches_are_windows_of_black_padded_images_with_their_labels(tmp_path: Path) -> None:
    raw = cifar_raw(write_cifar10(tmp_path, per_batch=2))
    train_x, train_y = raw[0], raw[1]
    normalise = normaliser(train_x)
    padded = torch.from_numpy(normalise(explicit_pad(torch.from_numpy(train_x), 4).numpy())).float()
    views = torch.stack([all_windows(image, 32, 32) for image in padded])  # (image, placement, C, H, W)
    # The task's float32 pixels (normalisation_error) against these float64 values rounded to float32 (u |z|,
    # |z| <= max |view|); another image or placement is >= 1 / (255 std) > 1e-2 away.
    tolerance = normalisation_error(train_x) + U32 * float(views.abs().max())
    task = vision_task(tmp_path, batch_size=5, augment="crop-flip", crop_padding=4)
    for _ in range(task.steps_per_epoch):
        inputs, labels = task.next_batch()
        for row, label in zip(inputs, labels.tolist(), strict=True):
            close = (views - row).abs().flatten(2).amax(dim=2) <= tolerance
            images_matched = close.any(dim=1).nonzero().flatten().tolist()
            assert len(images_matched) == 1 and train_y[images_matched[0]] == label


# ---------------------------------------------------------------- loss and evaluation


def chunked_logits(task, images: torch.Tensor, chunk: int) -> torch.Tensor:
    """The float32 logits the evaluation computes, bit for bit: the same normalisation and model on the same
    chunks, in this process."""
    return torch.cat(
        [task.model(task.normalise(images[start : start + chunk])) for start in range(0, len(images), chunk)]
    )


def check_normalised(task, images: torch.Tensor, expected: np.ndarray, tolerance: float) -> None:
    """The task's normalisation of `images` against the first-principles float64 values, within `tolerance`."""
    error = (task.normalise(images).double() - torch.from_numpy(expected)).abs().max()
    assert float(error) <= tolerance, f"normalised pixels off by {float(error)}"


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_training_loss_is_label_smoothed_cross_entropy(tmp_path: Path, smoothing: float) -> None:
    raw = cifar_raw(write_cifar10(tmp_path, per_batch=5))
    train_x, train_y = raw[0], raw[1]
    task = vision_task(tmp_path, batch_size=25, label_smoothing=smoothing)
    loss = float(task.train_loss(0).detach())
    # The batch train_loss drew, from a twin task (same seed: the same permutation and float32 normalisation),
    # checked against the first-principles pixels; then the model on it gives train_loss's logits bit for bit
    # (the same float32 ops on the same inputs, in this process), so only the loss formula is compared.
    inputs, labels = vision_task(tmp_path, batch_size=25, label_smoothing=smoothing).next_batch()
    candidates, tolerance = normaliser(train_x)(train_x), normalisation_error(train_x)
    assert [train_y[source_of(row, candidates, tolerance)] for row in inputs] == labels.tolist()
    with torch.no_grad():
        logits = task.model(inputs)
    log_p = torch.log_softmax(logits.double(), dim=1)
    classes = log_p.shape[1]
    target = torch.full_like(log_p, smoothing / classes)
    target[torch.arange(len(labels)), labels] += 1.0 - smoothing
    expected = float(-(target * log_p).sum(dim=1).mean())
    # cross_entropy_error: ~1e-5 (5e-6 relative); smoothing over the C - 1 other classes, or none, is off by >= 7e-4.
    assert math.isclose(loss, expected, rel_tol=0, abs_tol=cross_entropy_error(logits, expected, len(labels)))


def test_evaluation_covers_the_whole_test_split_in_chunks(tmp_path: Path) -> None:
    train_x, _, test_x, test_y = cifar_raw(write_cifar10(tmp_path, per_batch=5))
    task = vision_task(tmp_path, batch_size=4, eval_batch_size=2)
    task.model.eval()
    with torch.no_grad():
        result = task.evaluate()
        logits = chunked_logits(task, task.test_images, 2)
    check_normalised(task, task.test_images, normaliser(train_x)(test_x), normalisation_error(train_x))
    labels = torch.from_numpy(test_y)
    expected = float(F.cross_entropy(logits.double(), labels))
    # Per-chunk float32 sums (cross_entropy_error with the chunk as the batch), accumulated in float64 (2^-53 per
    # chunk, inside its 2^-29 margin).
    assert math.isclose(result.loss, expected, rel_tol=0, abs_tol=cross_entropy_error(logits, expected, 2))
    assert result.metric == float((logits.argmax(dim=1) == labels).double().mean())  # the same logits: exact


def test_validation_subset_is_held_out_of_training_and_evaluated_apart(tmp_path: Path) -> None:
    """val_fraction 0.2 of 25 training examples: round(5.0) = 5 held out, the same five for every run seed and
    another five for another split seed; the task trains on the other 20 only, normalises with their statistics,
    and reports the five's loss and accuracy beside the test split's."""
    train_x, train_y, test_x, test_y = cifar_raw(write_cifar10(tmp_path, per_batch=5))
    everything = torch.from_numpy(train_x)
    task = vision_task(tmp_path, batch_size=4, eval_batch_size=3, val_fraction=0.2)

    def rows_of(images: torch.Tensor) -> list[int]:
        return sorted(int((everything == image).flatten(1).all(dim=1).nonzero()[0]) for image in images)

    held = rows_of(task.val_images)
    assert len(held) == 5 and task.train_size == 20 and task.resolved_args["val_size"] == 5
    trained = [i for i in range(25) if i not in held]
    assert rows_of(task.train_images) == trained
    normalise = normaliser(train_x[trained])
    candidates, tolerance = normalise(train_x), normalisation_error(train_x[trained])
    batches = [task.next_batch()[0] for _ in range(task.steps_per_epoch)]
    seen = sorted(source_of(row, candidates, tolerance) for batch in batches for row in batch)
    assert seen == trained and task.steps_per_epoch == 5
    assert rows_of(vision_task(tmp_path, batch_size=4, seed=7, val_fraction=0.2).val_images) == held
    assert rows_of(vision_task(tmp_path, batch_size=4, val_fraction=0.2, split_seed=1).val_images) != held
    task.model.eval()
    with torch.no_grad():
        result = task.evaluate()
        val_logits = chunked_logits(task, task.val_images, 3)
        test_logits = chunked_logits(task, task.test_images, 3)
    # Both splits normalised with the 20 training images' statistics; the losses and the accuracy as in
    # test_evaluation_covers_the_whole_test_split_in_chunks.
    check_normalised(task, task.val_images, normalise(train_x[held]), tolerance)
    check_normalised(task, task.test_images, normalise(test_x), tolerance)
    val_labels, test_labels = torch.from_numpy(train_y[held]), torch.from_numpy(test_y)
    assert result.validated
    val_loss, test_loss = (
        float(F.cross_entropy(val_logits.double(), val_labels)),
        float(F.cross_entropy(test_logits.double(), test_labels)),
    )
    assert math.isclose(result.val_loss, val_loss, rel_tol=0, abs_tol=cross_entropy_error(val_logits, val_loss, 3))
    assert result.val_metric == float((val_logits.argmax(dim=1) == val_labels).double().mean())
    assert math.isclose(result.loss, test_loss, rel_tol=0, abs_tol=cross_entropy_error(test_logits, test_loss, 3))
    with torch.no_grad():
        assert not vision_task(tmp_path, batch_size=4).evaluate().validated  # val_fraction 0: no validation split


# ---------------------------------------------------------------- switches and arguments


def test_auto_switches_resolve_off_on_cpu_and_on_when_asked(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=2)
    auto = vision_task(tmp_path, batch_size=4)
    assert auto.resolved_args["channels_last"] == "off" and auto.resolved_args["autocast"] == "off"
    assert auto.resolved_args["steps_per_epoch"] == auto.steps_per_epoch == 3
    forced = vision_task(tmp_path, batch_size=4, model="cnn", model_options=None, channels_last="on", autocast="on")
    assert forced.resolved_args["channels_last"] == "on" and forced.resolved_args["autocast"] == "on"
    inputs, _ = forced.next_batch()
    assert inputs.is_contiguous(memory_format=torch.channels_last)
    conv = next(p for p in forced.model.parameters() if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert math.isfinite(float(forced.train_loss(0).detach()))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"augment": "mixup"}, "task_args.augment"),
        ({"autocast": "fp16"}, "task_args.autocast"),
        ({"channels_last": True}, "task_args.channels_last"),
        ({"model_options": 3}, "model_options must be a table"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"val_fraction": -0.1}, "val_fraction"),
    ],
)
def test_bad_arguments_are_usage_errors_before_any_data_is_read(
    tmp_path: Path, override: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        preflight({**DEFAULTS, "dataset": "cifar10", **override}, tmp_path, 64)
