"""Image-classification models by name: `build_model(name, ...)` gives an `nn.Module` mapping N,C,H,W to logits.

Every model's classifier head is an `nn.Linear` registered last, so the parameter partition recognises it as the
output head. All take 1 or 3 input channels and 28x28 or 32x32 images (global pooling before the head; `vit-small`
needs the image size divisible by its patch size). Initialisation draws from torch's global generator: seed it
before building. Model options and their defaults are in `OPTIONS`; an option a model does not have is an error.

- `mlp`: flatten, two ReLU hidden layers of width `hidden`, linear head.
- `cnn`: two 3x3 conv + ReLU + max-pool stages (32, 64 channels) and a linear head on the flattened map.
- `resnet18`, `resnet34`: CIFAR ResNets (resnet.py).
- `vgg19-bn`: CIFAR VGG-19 with BatchNorm and a single linear head (vgg.py).
- `vit-small`: ViT-S with patch 4, the 4-bit Shampoo paper's CIFAR-100 transformer (vit.py).
- `simple-dla`: kuangliu's SimpleDLA, the FISMO paper's CIFAR-10 net (dla.py).
- `speed-net`: the airbench94 CIFAR-10 speedrun net (speednet.py); call its `init_whitening` before training.
- `torchvision:<arch>`: `torchvision.models.get_model(arch, weights=None, num_classes=...)` when torchvision is
  installed (an optional dependency); the options go to torchvision unchanged.

`width_div` divides every channel count of a conv net (a CPU-sized variant); 1 is the published width.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from structbench.errors import UsageError
from structbench.tasks.vision.dla import SimpleDLA
from structbench.tasks.vision.resnet import CifarResNet
from structbench.tasks.vision.speednet import SpeedNet
from structbench.tasks.vision.vgg import CifarVGG
from structbench.tasks.vision.vit import VisionTransformer

OPTIONS: dict[str, dict[str, int | float]] = {
    "mlp": {"hidden": 128},
    "cnn": {},
    "resnet18": {"width_div": 1},
    "resnet34": {"width_div": 1},
    "vgg19-bn": {"width_div": 1},
    "vit-small": {"patch_size": 4, "embed_dim": 384, "depth": 12, "heads": 6, "mlp_ratio": 4.0, "drop_path": 0.1},
    "simple-dla": {"width_div": 1},
    "speed-net": {"width_div": 1, "scale": 1 / 9},
}
MODELS = tuple(OPTIONS)
TORCHVISION_PREFIX = "torchvision:"


def build_model(name: str, *, in_channels: int, image_size: int, num_classes: int, **options: Any) -> nn.Module:
    """The model `name` for `in_channels` x `image_size` x `image_size` inputs and `num_classes` logits."""
    if name.startswith(TORCHVISION_PREFIX):
        return _torchvision_model(
            name[len(TORCHVISION_PREFIX) :], in_channels=in_channels, num_classes=num_classes, **options
        )
    if name not in OPTIONS:
        raise UsageError(f"unknown model {name!r}; valid: {', '.join(MODELS)}, or {TORCHVISION_PREFIX}<name>.")
    opts = _resolve_options(name, options)
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * image_size * image_size, opts["hidden"]),
            nn.ReLU(),
            nn.Linear(opts["hidden"], opts["hidden"]),
            nn.ReLU(),
            nn.Linear(opts["hidden"], num_classes),
        )
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * (image_size // 4) ** 2, num_classes),
        )
    if name in ("resnet18", "resnet34"):
        return CifarResNet(int(name[len("resnet") :]), in_channels=in_channels, num_classes=num_classes, **opts)
    if name == "vgg19-bn":
        return CifarVGG(in_channels=in_channels, num_classes=num_classes, **opts)
    if name == "vit-small":
        return VisionTransformer(in_channels=in_channels, image_size=image_size, num_classes=num_classes, **opts)
    if name == "simple-dla":
        return SimpleDLA(in_channels=in_channels, num_classes=num_classes, **opts)
    return SpeedNet(in_channels=in_channels, num_classes=num_classes, **opts)


def _resolve_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The model's defaults overridden by `options`, each converted to its default's type."""
    defaults = OPTIONS[name]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        valid = ", ".join(f"{key} (default {value:g})" for key, value in defaults.items()) or "none"
        raise UsageError(f"model {name!r} has no option {', '.join(unknown)}; its options: {valid}.")
    resolved: dict[str, Any] = dict(defaults)
    for key, value in options.items():
        resolved[key] = _convert(name, key, value, type(defaults[key]))
    return resolved


def _convert(name: str, key: str, value: Any, kind: type) -> int | float:
    """`value` as an int or a float; booleans, non-numbers and non-integral ints are usage errors."""
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or (kind is int and not number.is_integer()):
        raise UsageError(
            f"model {name!r}: option {key} must be {'an integer' if kind is int else 'a number'}, got {value!r}."
        )
    return int(number) if kind is int else number


def _torchvision_model(arch: str, *, in_channels: int, num_classes: int, **options: Any) -> nn.Module:
    """An untrained torchvision classifier; its head must be an `nn.Linear` registered last."""
    try:
        import torchvision
    except ImportError as err:
        raise UsageError(
            f"model {TORCHVISION_PREFIX}{arch} needs torchvision, which is not installed "
            f"(pip install torchvision), or use a built-in model: {', '.join(MODELS)}."
        ) from err
    if in_channels != 3:
        raise UsageError(f"model {TORCHVISION_PREFIX}{arch} takes 3-channel images, got {in_channels} channels.")
    try:
        model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **options)
    except (TypeError, ValueError) as err:
        raise UsageError(f"model {TORCHVISION_PREFIX}{arch}: {err}") from err
    owners = [module for module in model.modules() if next(module.parameters(recurse=False), None) is not None]
    if not owners or not isinstance(owners[-1], nn.Linear):
        raise UsageError(f"model {TORCHVISION_PREFIX}{arch} does not end in a linear head, which structbench needs.")
    return model
