"""The CIFAR model zoo: shapes, gradients, head placement, and parameter counts from hand-derived formulas.

The counting formulas below are written from the architecture descriptions (He et al. / kuangliu ResNet, VGG-19
configuration E with BN, kuangliu SimpleDLA, ViT-S, airbench94), layer by layer, without reading the models.
"""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from structbench.errors import UsageError
from structbench.optim.partition import parameter_kinds
from structbench.tasks.vision.blocks import BasicBlock
from structbench.tasks.vision.models import MODELS, build_model
from tests.support.measures import n_params

HEAVY = ("resnet18", "resnet34", "vgg19-bn", "vit-small", "simple-dla", "speed-net")

U64, U32 = 2.0**-53, 2.0**-24  # float64 and float32 unit roundoff


def gamma(n: int, u: float = U32) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of an n-term sum or dot product."""
    return n * u / (1 - n * u)


def resnet_rounding_bound(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A first-order bound on |float32 ResNet(x) - exact|, per logit, whatever order each kernel sums in: every op's
    own rounding (a K-term conv: gamma_K |W| * |a|; an eval BatchNorm x s + t with s, t rounded: gamma_5 (|x s| +
    |t|); the residual add: u |out| (its ReLU is 1-Lipschitz); the average pool of the final 4 x 4 map (32 x 32
    inputs): gamma_16 |pooled|; the head: gamma_{K+1} (|W| |a| + |b|)) carried to the logits by the exact Jacobian
    (autograd in float64). Second-order terms are O(u^2)."""
    model64 = copy.deepcopy(model).double().eval()
    local: list[tuple[torch.Tensor, torch.Tensor]] = []  # (where the error is made, bound on it)

    def record(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        a = inputs[0]
        with torch.no_grad():
            if isinstance(module, nn.Conv2d):
                terms = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
                magnitude = F.conv2d(a.abs(), module.weight.abs(), None, module.stride, module.padding)
                local.append((output, gamma(terms) * magnitude))
            elif isinstance(module, nn.BatchNorm2d):
                scale = module.weight / torch.sqrt(module.running_var + module.eps)
                shift = (module.bias - module.running_mean * scale).view(1, -1, 1, 1)
                local.append((output, gamma(5) * ((a * scale.view(1, -1, 1, 1)).abs() + shift.abs())))
            elif isinstance(module, BasicBlock):
                local.append((output, U32 * output.abs()))
            elif isinstance(module, nn.Linear):
                local.append((a, gamma(16) * a.abs()))
                magnitude = a.abs() @ module.weight.abs().T + module.bias.abs()
                local.append((output, gamma(module.in_features + 1) * magnitude))

    handles = [m.register_forward_hook(record) for m in model64.modules()]
    logits = model64(x.double())
    for handle in handles:
        handle.remove()
    classes = logits.shape[1]
    seeds = torch.eye(classes, dtype=logits.dtype)[:, None, :].expand(classes, *logits.shape)
    jacobians = torch.autograd.grad(logits, [t for t, _ in local], seeds, is_grads_batched=True)
    bound = sum((j.abs() * m).flatten(2).sum(2) for j, (_, m) in zip(jacobians, local, strict=True))
    return bound.T  # (batch, classes): the samples are independent in eval mode


def conv(c_in: int, c_out: int, k: int, bias: bool = False) -> int:
    return c_in * c_out * k * k + (c_out if bias else 0)


def bn(c: int) -> int:
    return 2 * c


def linear(d_in: int, d_out: int, bias: bool = True) -> int:
    return d_in * d_out + (d_out if bias else 0)


def basic_block(c_in: int, c_out: int, stride: int) -> int:
    count = conv(c_in, c_out, 3) + bn(c_out) + conv(c_out, c_out, 3) + bn(c_out)
    if stride != 1 or c_in != c_out:
        count += conv(c_in, c_out, 1) + bn(c_out)
    return count


def resnet_count(blocks: tuple[int, ...], classes: int, c_in: int = 3) -> int:
    """3x3 stem (64) + BN; stages 64/128/256/512 with strides 1/2/2/2; Linear(512, classes)."""
    count = conv(c_in, 64, 3) + bn(64)
    channels = 64
    for width, stride, n in zip((64, 128, 256, 512), (1, 2, 2, 2), blocks, strict=True):
        for i in range(n):
            count += basic_block(channels, width, stride if i == 0 else 1)
            channels = width
    return count + linear(512, classes)


def vgg19_bn_count(classes: int, c_in: int = 3) -> int:
    """Configuration E: 16 biased 3x3 convs, each with BN; Linear(512, classes)."""
    widths = [64, 64, 128, 128, 256, 256, 256, 256] + [512] * 8
    count, channels = 0, c_in
    for width in widths:
        count += conv(channels, width, 3, bias=True) + bn(width)
        channels = width
    return count + linear(512, classes)


def dla_tree_count(c_in: int, c_out: int, level: int, stride: int) -> int:
    root = conv(2 * c_out, c_out, 1) + bn(c_out)
    if level == 1:
        return root + basic_block(c_in, c_out, stride) + basic_block(c_out, c_out, 1)
    return root + dla_tree_count(c_in, c_out, level - 1, stride) + dla_tree_count(c_out, c_out, level - 1, 1)


def simple_dla_count(classes: int, c_in: int = 3, div: int = 1) -> int:
    """Stem 3->16->16->32 (3x3 conv + BN each); trees (width, level, stride) as below; Linear(512, classes)."""
    count = conv(c_in, 16 // div, 3) + bn(16 // div) + conv(16 // div, 16 // div, 3) + bn(16 // div)
    count += conv(16 // div, 32 // div, 3) + bn(32 // div)
    channels = 32 // div
    for width, level, stride in ((64, 1, 1), (128, 2, 2), (256, 2, 2), (512, 1, 2)):
        count += dla_tree_count(channels, width // div, level, stride)
        channels = width // div
    return count + linear(512 // div, classes)


def vit_count(classes: int, c_in: int = 3, image: int = 32, patch: int = 4, d: int = 384, depth: int = 12) -> int:
    """Patch conv + class token + (tokens+1) position rows + depth x (2 LN, qkv, proj, 4x MLP) + final LN + head."""
    tokens = (image // patch) ** 2
    block = 2 * 2 * d + linear(d, 3 * d) + linear(d, d) + linear(d, 4 * d) + linear(4 * d, d)
    return conv(c_in, d, patch, bias=True) + d + (tokens + 1) * d + depth * block + 2 * d + linear(d, classes)


def speed_net_count(classes: int, c_in: int = 3) -> int:
    """Whitening 2x2 conv (2*c_in*4 channels, bias); groups 64/256/256 of two 3x3 convs + BN; bias-free head."""
    whiten = 2 * c_in * 4
    count = conv(c_in, whiten, 2, bias=True)
    channels = whiten
    for width in (64, 256, 256):
        count += conv(channels, width, 3) + bn(width) + conv(width, width, 3) + bn(width)
        channels = width
    return count + linear(256, classes, bias=False)


FORMULAS = {
    "resnet18": lambda classes, c_in: resnet_count((2, 2, 2, 2), classes, c_in),
    "resnet34": lambda classes, c_in: resnet_count((3, 4, 6, 3), classes, c_in),
    "vgg19-bn": vgg19_bn_count,
    "simple-dla": lambda classes, c_in: simple_dla_count(classes, c_in),
    "vit-small": lambda classes, c_in: vit_count(classes, c_in),
    "speed-net": speed_net_count,
}


def meta_model(name: str, c_in: int = 3, image: int = 32, classes: int = 10, **options: object) -> nn.Module:
    """Shapes only (no initialisation work): enough for counting."""
    with torch.device("meta"):
        return build_model(name, in_channels=c_in, image_size=image, num_classes=classes, **options)


def test_the_kuangliu_resnet_counts_follow_from_the_formula() -> None:
    assert resnet_count((2, 2, 2, 2), 10) == 11_173_962
    assert resnet_count((3, 4, 6, 3), 10) == 21_282_122


def test_the_simple_dla_formula_gives_the_specs_15_14m() -> None:
    assert round(simple_dla_count(10) / 1e4) == 1514


@pytest.mark.parametrize("name", sorted(FORMULAS))
@pytest.mark.parametrize(("classes", "c_in"), [(10, 3), (100, 3), (10, 1)])
def test_parameter_counts_match_the_hand_formulas(name: str, classes: int, c_in: int) -> None:
    assert n_params(meta_model(name, c_in=c_in, classes=classes)) == FORMULAS[name](classes, c_in)


def test_vit_position_table_grows_with_the_token_count() -> None:
    assert n_params(meta_model("vit-small", image=28)) == vit_count(10, image=28)
    small = meta_model("vit-small", patch_size=8, embed_dim=64, depth=2, heads=4)
    assert n_params(small) == vit_count(10, patch=8, d=64, depth=2)


def test_width_div_divides_every_channel_count() -> None:
    assert n_params(meta_model("simple-dla", width_div=8)) == simple_dla_count(10, div=8)
    with pytest.raises(UsageError, match="width_div=3"):
        meta_model("resnet18", width_div=3)


def last_parameterised_module(model: nn.Module) -> nn.Module:
    owners = [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]
    return owners[-1]


@pytest.mark.parametrize("name", MODELS)
def test_forward_backward_and_head_on_3x32x32(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, in_channels=3, image_size=32, num_classes=7)
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 7)
    out.square().sum().backward()
    for param_name, param in model.named_parameters():
        if param.requires_grad:
            assert param.grad is not None and torch.isfinite(param.grad).all(), param_name
        else:
            assert param.grad is None, param_name
    head = last_parameterised_module(model)
    assert isinstance(head, nn.Linear) and head.out_features == 7
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    head_ids = {id(p) for p in head.parameters()}
    kinds = parameter_kinds(model, trainable)
    assert {n for n, kind in kinds.items() if kind == "head"} == {n for n, p in trainable if id(p) in head_ids}

    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))


@pytest.mark.parametrize("name", MODELS)
def test_one_channel_28x28_inputs(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, in_channels=1, image_size=28, num_classes=3).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 3) and torch.isfinite(out).all()


def test_channels_last_gives_the_same_output() -> None:
    torch.manual_seed(0)
    model = build_model("resnet18", in_channels=3, image_size=32, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    # Both layouts evaluate the same network with different kernels (summation orders): each is within
    # resnet_rounding_bound of the exact logits, so they differ by at most twice that. In float32 that is 3e-3 on
    # logits of 0.05 (the gamma_4608 of the widest convs is a worst case; the layouts agree to 2e-8), so float64
    # (the bound scales by at most 2^-53 / 2^-24) carries the sharp check: a layout-dependent step in the model
    # (a view of a channels_last tensor, a flatten in another order) moves the logits by far more than 1e-11.
    bound32 = 2 * resnet_rounding_bound(model, x)
    for dtype, bound in ((torch.float32, bound32), (torch.float64, bound32 * 2.0**-29)):
        typed, inputs = copy.deepcopy(model).to(dtype), x.to(dtype)
        with torch.no_grad():
            reference = typed(inputs)
            from_cl_input = typed(inputs.contiguous(memory_format=torch.channels_last))
            channels_last = typed.to(memory_format=torch.channels_last)
            from_cl_model = channels_last(inputs.contiguous(memory_format=torch.channels_last))
        for output in (from_cl_input, from_cl_model):
            error = (output.double() - reference.double()).abs()
            assert bool((error <= bound).all()), f"{dtype}: max error / bound {float((error / bound).max()):.3g}"


def test_initialisation_follows_the_callers_seed() -> None:
    def state(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return list(build_model("speed-net", in_channels=3, image_size=32, num_classes=10).state_dict().values())

    first, again, other = state(1), state(1), state(2)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_vit_routes_position_table_and_class_token_to_the_fallback() -> None:
    model = meta_model("vit-small")
    kinds = parameter_kinds(model, list(model.named_parameters()))
    assert kinds["pos_embed.weight"] == "embedding"
    assert kinds["cls_token"] == "vector"
    assert kinds["blocks.0.attn.qkv.weight"] == "matrix"
    assert kinds["head.weight"] == kinds["head.bias"] == "head"


def test_speed_net_freezes_the_whitening_filters_and_batchnorm_scales() -> None:
    model = meta_model("speed-net")
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    norm_scales = {f"layers.{g}.norm{i}.weight" for g in (1, 2, 3) for i in (1, 2)}
    assert frozen == {"whiten.weight"} | norm_scales


def test_speed_net_whitening_makes_patch_second_moments_nearly_identity() -> None:
    torch.manual_seed(0)
    mixing = torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.5, 0.5, 0.7]])
    images = torch.einsum("ij,njhw->nihw", mixing, torch.randn(64, 3, 16, 16)) + 0.3
    model = build_model("speed-net", in_channels=3, image_size=32, num_classes=10)
    eps = 1e-8
    model.init_whitening(images, eps=eps)
    with torch.no_grad():
        responses = nn.functional.conv2d(images, model.whiten.weight)
    # The uncentred second moments of the 2x2 patches, flattened channel-major, as the docstring defines them; in
    # float32 with the same expression as init_whitening (bit-identical in this process), and exactly in float64.
    patches = images.unfold(2, 2, 1).unfold(3, 2, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 12)
    moments = (patches.T @ patches / patches.shape[0]).double()
    filters = model.whiten.weight[:12].reshape(12, 12).double()
    # The filters whiten those moments: with E D E^T = M + E2 from float32 eigh (||E2|| <= 12 u ||M||, E
    # orthogonal to 12^2 u), F = D^-1/2 E^T (rounded: 6 u on F M F^T), F M F^T = D / (D + eps) to within
    # (12 u + 2 * 12^2 u) ||M|| / lambda_min + 6 u, and eps / lambda_min from I (4e-4 here; the float64 product
    # adds 2^-53 terms). Ignoring eps (the default 5e-4), centred moments or unscaled filters: off by >= 3e-3.
    spectrum = torch.linalg.eigvalsh(moments)
    lambda_min, lambda_max = float(spectrum.min()), float(spectrum.max())
    tolerance = ((12 + 2 * 12**2) * U32 * lambda_max + eps) / lambda_min + 6 * U32 + gamma(2 * 12, U64)
    torch.testing.assert_close(
        filters @ moments @ filters.T, torch.eye(12, dtype=torch.float64), atol=tolerance, rtol=0
    )
    # The conv applies them to the patches in the same layout: each response is a 12-term float32 dot product,
    # within gamma_12 |P| |F|^T of the float64 P F^T; the negated half within twice that of minus the first half.
    # A weight layout other than the patches' (spatial-major, transposed) is off by O(1).
    first_half = responses[:, :12].permute(0, 2, 3, 1).reshape(-1, 12).double()
    bound = gamma(12) * patches.double().abs() @ filters.abs().T
    assert bool(((first_half - patches.double() @ filters.T).abs() <= bound).all())
    second_half = responses[:, 12:].permute(0, 2, 3, 1).reshape(-1, 12).double()
    assert bool(((second_half + first_half).abs() <= 2 * bound).all())


def test_mlp_hidden_option_and_option_errors() -> None:
    model = build_model("mlp", in_channels=1, image_size=28, num_classes=10, hidden=7)
    assert model[1].out_features == 7
    with pytest.raises(UsageError, match=r"'resnet18' has no option hidden; its options: width_div \(default 1\)"):
        build_model("resnet18", in_channels=3, image_size=32, num_classes=10, hidden=128)
    with pytest.raises(UsageError, match="'cnn' has no option depth; its options: none"):
        build_model("cnn", in_channels=3, image_size=32, num_classes=10, depth=2)
    with pytest.raises(UsageError, match=r"option depth must be an integer, got 2\.5"):
        meta_model("vit-small", depth=2.5)
    with pytest.raises(UsageError, match="option drop_path must be a number"):
        meta_model("vit-small", drop_path="lots")


def test_vit_needs_a_patch_size_that_divides_the_image() -> None:
    with pytest.raises(UsageError, match="image_size 28 is not divisible by patch_size 8"):
        meta_model("vit-small", image=28, patch_size=8)
    with pytest.raises(UsageError, match="embed_dim 384 is not divisible by heads 5"):
        meta_model("vit-small", heads=5)


def test_unknown_model_lists_the_valid_names() -> None:
    with pytest.raises(
        UsageError, match=r"unknown model 'resnet9'; valid: mlp, cnn, resnet18, .*speed-net, or torchvision"
    ):
        build_model("resnet9", in_channels=3, image_size=32, num_classes=10)


def test_torchvision_models_need_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(UsageError, match="torchvision:resnet50 needs torchvision, which is not installed"):
        build_model("torchvision:resnet50", in_channels=3, image_size=32, num_classes=10)


def test_torchvision_models_come_from_get_model(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def get_model(arch: str, **kwargs: object) -> nn.Module:
        calls.append((arch, kwargs))
        if arch == "no-such-net":
            raise ValueError("Unknown model no-such-net")
        if arch == "conv-head":
            return nn.Sequential(nn.Linear(3, 4), nn.Conv2d(4, 10, 1))
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(10))

    fake = types.SimpleNamespace(models=types.SimpleNamespace(get_model=get_model))
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    build_model("torchvision:resnet50", in_channels=3, image_size=32, num_classes=10, dropout=0.2)
    assert calls == [("resnet50", {"weights": None, "num_classes": 10, "dropout": 0.2})]
    with pytest.raises(UsageError, match="torchvision:no-such-net: Unknown model no-such-net"):
        build_model("torchvision:no-such-net", in_channels=3, image_size=32, num_classes=10)
    with pytest.raises(UsageError, match="does not end in a linear head"):
        build_model("torchvision:conv-head", in_channels=3, image_size=32, num_classes=10)
    with pytest.raises(UsageError, match="takes 3-channel images, got 1"):
        build_model("torchvision:resnet50", in_channels=1, image_size=28, num_classes=10)
