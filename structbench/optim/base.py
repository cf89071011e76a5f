"""The base class of structbench's own optimizers.

`torch.optim.Optimizer.load_state_dict` casts every floating-point parameter's state tensors to the
parameter's dtype (uint8 codes and float32 preconditioners included). Structured optimizers keep
statistics in float32 — and packed codes in uint8 — whatever the parameter dtype, so that cast would
silently change them on resume. `StructuredOptimizer.load_state_dict` restores each state tensor with
the dtype it was saved with, so a resumed run continues bit-identically.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class StructuredOptimizer(torch.optim.Optimizer):
    solver_failures: int = 0

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = copy.deepcopy(state_dict)
        super().load_state_dict(state_dict)
        params = {
            saved_id: param
            for saved_group, group in zip(saved["param_groups"], self.param_groups, strict=True)
            for saved_id, param in zip(saved_group["params"], group["params"], strict=True)
        }
        for saved_id, values in saved["state"].items():
            param = params[saved_id]
            self.state[param] = {
                key: value.to(device=param.device) if isinstance(value, torch.Tensor) else value
                for key, value in values.items()
            }
