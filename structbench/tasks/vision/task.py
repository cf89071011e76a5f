"""The `image-classification` task: a named model trained on a real on-disk image dataset held on the device.

Data pipeline (everything after loading runs on the task's device, with no host round trip per step):

- the dataset is read through `structbench.data` (never downloaded, never substituted) and kept on the device as
  uint8 images, the training split zero-padded once when augmenting;
- each epoch draws one seeded permutation of the training split (and, with `augment = "crop-flip"`, every example's
  crop offset and flip) from a CPU generator and moves it to the device in one copy; a step takes the next
  `batch_size` positions of that order. Every training example is visited exactly once per epoch; the last, partial
  batch is kept unless `drop_last` is true (then `N mod batch_size` examples, different ones each epoch, sit out);
- a batch is gathered (crop and flip in the same gather, `augment.crop_flip`) and normalised per channel with the
  training split's mean and (population) standard deviation of pixel / pixel_max, computed exactly from the
  per-channel histogram of pixel values;
- a model with an `init_whitening(images)` method (speed-net's data-dependent first layer) gets it called once,
  before training, on the first `WHITENING_IMAGES` normalised training images;
- `channels_last` lays batches and the model out channels-last; `autocast` runs the forward pass under bfloat16
  autocast; both are `"auto"` (on for CUDA, off for CPU), `"on"` or `"off"`, and the decision is in `resolved_args`.

Validation: `val_fraction` (default 0.1) of the training split is held out before anything else is computed from
it (`structbench.data.holdout`: the same examples for every run, chosen by `split_seed`); the task trains, and takes
its normalisation statistics, on the rest. 0 holds out nothing (then there is no validation split).

The training loss is cross-entropy with `label_smoothing` (Szegedy et al., CVPR 2016, Sec. 7: the target is
(1 - eps) one-hot + eps / K uniform). Evaluation runs the whole test split, and the validation subset, in
`eval_batch_size` chunks and reports each one's plain (unsmoothed) mean cross-entropy and top-1 accuracy.
`eval_examples` > 0 evaluates a fixed subset of that many examples of each instead (`structbench.data.holdout`: the
same images for every optimizer and seed of a suite), for a check that must be quick on a CPU; 0, the default, is the
whole splits. `resolved_args` says how many examples each evaluation read (`eval_test_size`, `eval_val_size`).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from structbench.data import dataset_info, load, require
from structbench.data.holdout import evaluation_subset, hold_out, validation_count
from structbench.errors import UsageError
from structbench.tasks.base import EvalResult, TaskContext, TaskDef, check_memory
from structbench.tasks.vision.augment import CropFlip, crop_flip, draw_crop_flip, zero_pad
from structbench.tasks.vision.models import build_model

AUGMENTS = ("none", "crop-flip")
WHITENING_IMAGES = 5000
"""A model with `init_whitening` (speed-net) gets it called on this many normalised, unaugmented training images
before training, as airbench94 does with its first 5000."""
SWITCHES = ("auto", "on", "off")

DEFAULTS: dict[str, Any] = {
    "dataset": "digits",
    "model": "mlp",
    "model_options": None,
    "augment": "none",
    "crop_padding": 4,
    "drop_last": False,
    "label_smoothing": 0.0,
    "channels_last": "auto",
    "autocast": "auto",
    "eval_batch_size": 1024,
    "val_fraction": 0.1,
    "split_seed": 0,
    "eval_examples": 0,
}
"""`model_options`: None (the model's own defaults) or a table of its options, e.g. `{hidden = 256}` for `mlp`;
`val_fraction` of the training split is held out for validation, chosen by `split_seed` (module docstring);
`eval_examples` > 0 evaluates a fixed subset of that many test (and validation) examples, 0 the whole splits."""


def validate_args(args: dict[str, Any]) -> None:
    """Raise UsageError for task arguments no run could use; called before any run starts."""
    if args["augment"] not in AUGMENTS:
        raise UsageError(f"task_args.augment must be one of {', '.join(AUGMENTS)}, got {args['augment']!r}.")
    for key in ("channels_last", "autocast"):
        if args[key] not in SWITCHES:
            raise UsageError(f"task_args.{key} must be one of {', '.join(SWITCHES)}, got {args[key]!r}.")
    if args["model_options"] is not None and not isinstance(args["model_options"], dict):
        raise UsageError(f"task_args.model_options must be a table, got {args['model_options']!r}.")
    if args["crop_padding"] < 0 or args["eval_batch_size"] < 1:
        raise UsageError("task_args.crop_padding must be >= 0 and task_args.eval_batch_size >= 1.")
    if not 0.0 <= args["label_smoothing"] < 1.0:
        raise UsageError(f"task_args.label_smoothing must be in [0, 1), got {args['label_smoothing']}.")
    if not 0.0 <= args["val_fraction"] < 1.0:
        raise UsageError(f"task_args.val_fraction must be in [0, 1), got {args['val_fraction']}.")
    if args["eval_examples"] < 0:
        raise UsageError(f"task_args.eval_examples must be >= 0 (0: the whole splits), got {args['eval_examples']}.")


def resolve_switch(value: str, device: torch.device) -> bool:
    """`"auto"` is on for CUDA and off elsewhere; `"on"` and `"off"` are taken as given."""
    return device.type == "cuda" if value == "auto" else value == "on"


def channel_stats(images: torch.Tensor, pixel_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact per-channel mean and population standard deviation of uint8 N,C,H,W `images` / `pixel_max`
    (float64, shape (C,)), from each channel's histogram of pixel values."""
    values = torch.arange(256, dtype=torch.float64) / pixel_max
    means, stds = [], []
    for channel in range(images.shape[1]):
        counts = torch.bincount(images[:, channel].reshape(-1), minlength=256).double()
        weights = counts / counts.sum()
        mean = float((weights * values).sum())
        means.append(mean)
        stds.append(math.sqrt(float((weights * (values - mean) ** 2).sum())))
    return torch.tensor(means, dtype=torch.float64), torch.tensor(stds, dtype=torch.float64)


class ImageClassificationTask:
    metric_name = "accuracy"
    metric_mode: Literal["min", "max"] = "max"
    item_unit = "images"

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        validate_args(args)
        full_train, test, meta = load(args["dataset"], ctx.data_root)
        train, val = hold_out(full_train, float(args["val_fraction"]), int(args["split_seed"]))
        full_test_size = len(test)
        test = evaluation_subset(test, int(args["eval_examples"]), int(args["split_seed"]))
        if val is not None:
            val = evaluation_subset(val, int(args["eval_examples"]), int(args["split_seed"]))
        self.data_source = f"{meta.name} from {meta.source}"
        self.device = ctx.device
        self.channels_last = resolve_switch(args["channels_last"], ctx.device)
        self.autocast = resolve_switch(args["autocast"], ctx.device)
        self.memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        self.label_smoothing = float(args["label_smoothing"])
        self.eval_batch_size = int(args["eval_batch_size"])
        self.batch_size = ctx.batch_size
        self.shard = ctx.shard
        self.train_size = len(train)
        self.drop_last = bool(args["drop_last"])
        if self.drop_last:
            check_drop_last(self.batch_size, self.train_size)
        full_batches, remainder = divmod(self.train_size, self.batch_size)
        self.steps_per_epoch = full_batches + (1 if remainder and not self.drop_last else 0)
        self.epoch_positions = full_batches * self.batch_size if self.drop_last else self.train_size
        self.items_per_call = self.batch_size
        self.eval_items = len(test) + (len(val) if val is not None else 0)

        mean, std = channel_stats(train.inputs, meta.pixel_max)
        shape = (1, -1, 1, 1)
        self.scale = (1.0 / (meta.pixel_max * std)).float().view(shape).to(ctx.device)
        self.shift = (-mean / std).float().view(shape).to(ctx.device)
        _, channels, height, width = train.inputs.shape
        self.image_size = (height, width)
        self.augment = args["augment"] == "crop-flip"
        self.padding = int(args["crop_padding"]) if self.augment else 0
        if self.augment:
            # Channels-last storage makes each gathered pixel one contiguous run of C bytes.
            self.train_images = zero_pad(train.inputs.to(ctx.device), self.padding).contiguous(
                memory_format=torch.channels_last
            )
        else:
            self.train_images = train.inputs.to(ctx.device).contiguous(memory_format=self.memory_format)
        self.train_labels = train.labels.to(ctx.device)
        self.test_images = test.inputs.to(ctx.device).contiguous(memory_format=self.memory_format)
        self.test_labels = test.labels.to(ctx.device)
        self.val_images = self.val_labels = None
        if val is not None:
            self.val_images = val.inputs.to(ctx.device).contiguous(memory_format=self.memory_format)
            self.val_labels = val.labels.to(ctx.device)

        self.generator = torch.Generator().manual_seed(ctx.seed + 1)
        self.order = torch.empty(0, dtype=torch.int64, device=ctx.device)
        self.draws: CropFlip | None = None
        self.cursor = self.epoch_positions

        model_options = dict(args["model_options"] or {})
        torch.manual_seed(ctx.seed)
        model = build_model(
            args["model"], in_channels=channels, image_size=height, num_classes=meta.num_classes, **model_options
        )
        self.model = model.to(ctx.device, memory_format=self.memory_format)
        self.forward: torch.nn.Module = self.model
        whitening_images = 0
        init_whitening = getattr(self.model, "init_whitening", None)
        if init_whitening is not None:
            whitening_images = min(WHITENING_IMAGES, self.train_size)
            first = train.inputs[:whitening_images].to(ctx.device).contiguous(memory_format=self.memory_format)
            init_whitening(self.normalise(first))
        self.resolved_args = {
            **args,
            "model_options": model_options,
            "channels_last": "on" if self.channels_last else "off",
            "autocast": "on" if self.autocast else "off",
            "autocast_dtype": "bfloat16" if self.autocast else None,
            "data_pipeline": (
                f"whole dataset as uint8 on {ctx.device}; per-epoch seeded permutation"
                + (f", crop (zero padding {self.padding}) + flip" if self.augment else "")
                + " and per-channel normalisation on the device"
            ),
            "whitening_images": whitening_images,
            "train_size": self.train_size,
            "val_size": len(full_train) - self.train_size,
            "test_size": full_test_size,
            "eval_val_size": len(val) if val is not None else 0,
            "eval_test_size": len(test),
            "steps_per_epoch": self.steps_per_epoch,
            "normalisation_mean": mean.tolist(),
            "normalisation_std": std.tolist(),
        }

    def _start_epoch(self) -> None:
        """Draw the next epoch's order (and augmentation) on the CPU generator; move it to the device in one go."""
        order = torch.randperm(self.train_size, generator=self.generator)
        self.order = order.to(self.device)
        if self.augment:
            self.draws = draw_crop_flip(self.train_size, self.padding, self.generator).to(self.device)
        self.cursor = 0

    def stream_state(self) -> dict[str, Any]:
        """The epoch's order, its augmentation draws and the position in it, and the generator of the next epochs."""
        draws = None if self.draws is None else {"offsets": self.draws.offsets, "flips": self.draws.flips}
        return {"generator": self.generator.get_state(), "order": self.order, "draws": draws, "cursor": self.cursor}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.order = state["order"].to(self.device)
        draws = state["draws"]
        self.draws = None if draws is None else CropFlip(draws["offsets"], draws["flips"]).to(self.device)
        self.cursor = state["cursor"]

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images to float32, standardised per channel; keeps the batch's memory layout."""
        return images.float().mul_(self.scale).add_(self.shift)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next training batch (normalised inputs, labels) of the current epoch, starting a new epoch as needed."""
        if self.cursor >= self.epoch_positions:
            self._start_epoch()
        start = self.cursor
        stop = min(start + self.batch_size, self.train_size)
        self.cursor = stop
        self.global_batch = stop - start
        first, last = self.shard.span(stop - start)
        start, stop = start + first, start + last
        index = self.order[start:stop]
        if self.draws is not None:
            images = crop_flip(self.train_images, self.draws[start:stop], self.image_size, index)
        else:
            images = self.train_images[index]
        images = images.contiguous(memory_format=self.memory_format)
        return self.normalise(images), self.train_labels[index]

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_loss(self, step: int) -> torch.Tensor:
        inputs, labels = self.next_batch()
        with self._autocast():
            logits = self.forward(inputs)
        if self.shard.world_size == 1:
            return F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing)
        # This rank's share of the global batch's summed loss, times the world size (DDP averages over ranks): an
        # epoch's last, partial batch may leave a rank fewer examples, or none.
        total = F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing, reduction="sum")
        return total * (self.shard.world_size / self.global_batch)

    def distribute(self, ddp_module: torch.nn.Module) -> None:
        self.forward = ddp_module

    def _loss_and_accuracy(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
        """Mean cross-entropy and top-1 accuracy over one evaluation split, in `eval_batch_size` chunks."""
        total_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        for start in range(0, len(labels), self.eval_batch_size):
            inputs = self.normalise(images[start : start + self.eval_batch_size])
            chunk = labels[start : start + self.eval_batch_size]
            with self._autocast():
                logits = self.model(inputs).float()
            total_loss += F.cross_entropy(logits, chunk, reduction="sum").double()
            correct += (logits.argmax(dim=1) == chunk).sum()
        return float(total_loss) / len(labels), int(correct) / len(labels)

    def evaluate(self) -> EvalResult:
        loss, accuracy = self._loss_and_accuracy(self.test_images, self.test_labels)
        if self.val_images is None or self.val_labels is None:
            return EvalResult(loss=loss, metric=accuracy)
        val_loss, val_accuracy = self._loss_and_accuracy(self.val_images, self.val_labels)
        return EvalResult(loss=loss, metric=accuracy, val_loss=val_loss, val_metric=val_accuracy)


def preflight(args: dict[str, Any], data_root: Path, batch_size: int) -> None:
    validate_args(args)
    require(args["dataset"], data_root)
    check_model_size(args)
    if args["drop_last"]:
        train, _, _ = load(args["dataset"], data_root)
        check_drop_last(batch_size, len(train) - validation_count(len(train), float(args["val_fraction"])))


def check_drop_last(batch_size: int, train_size: int) -> None:
    """With drop_last a batch larger than the training split leaves no batch to train on."""
    if batch_size > train_size:
        raise UsageError(f"batch size {batch_size} exceeds the {train_size} training examples with drop_last = true.")


def check_model_size(args: dict[str, Any]) -> None:
    """Build the model on the meta device (no memory taken) for the dataset's image shape: options it cannot take,
    or float32 parameters beyond this machine's memory, are usage errors before any run."""
    info = dataset_info(args["dataset"])
    channels, height, _ = info.image_shape
    options = dict(args["model_options"] or {})
    try:
        with torch.device("meta"):
            model = build_model(
                args["model"], in_channels=channels, image_size=height, num_classes=info.num_classes, **options
            )
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a size beyond int64 elements
        raise UsageError(f"model {args['model']!r} cannot take task_args.model_options {options!r}: {exc}") from None
    params = sum(p.numel() for p in model.parameters())
    check_memory(f"model {args['model']!r} with options {options!r}: its {params} float32 parameters", 4 * params)


IMAGE_CLASSIFICATION = TaskDef(
    name="image-classification",
    summary="A named model (MLP, CNN, ResNet, VGG, ViT, DLA, speed net) on a real on-disk image dataset",
    defaults=DEFAULTS,
    build=ImageClassificationTask,
    preflight=preflight,
    metric_name=ImageClassificationTask.metric_name,
    distributable=True,
)
