"""fp32 linear layers through oneDNN with weights packed once, for the hf backend's forward passes on CPU.

``F.linear`` in fp32 on a CPU is MKL's sgemm, which packs the weight matrix into panels at every call.
At a decode batch of 8 rows that packing is most of the work: py-spy put 45% of a SmolLM2 decode step
in ``mkl_blas_def_sgemm_scopy_right16_bdz``, a copy of the weights. oneDNN's inner product takes weights
reordered once (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU freezing pass uses) and
reads them as they are: decode steps 1.16-1.32x faster at 8-32 rows here (bench/RESULTS.md).

:class:`PackedLinears` keeps a packed copy of every fp32 ``nn.Linear`` of a model and, only inside
``with packed.active():``, swaps each layer's ``forward`` for the packed one; outside it the model is
untouched (a trainer sharing the model object computes as before, with gradients). The copies are
stale once the weights change: the backend calls :meth:`pack` again when the parameters' version
counters move. The ops are private to torch, so :func:`packed_linear_supported` checks that they exist
and agree with ``F.linear`` before anything uses them; otherwise the backend keeps ``F.linear``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

# torch private ops used here (a test checks they still exist): oneDNN linear with a packed weight.
PRIVATE_OPS = ("mkldnn._reorder_linear_weight", "mkldnn._linear_pointwise")


def _ops_exist() -> bool:
    return (torch.backends.mkldnn.is_available()
            and all(hasattr(getattr(torch.ops, ns), name) for ns, name in (op.split(".") for op in PRIVATE_OPS)))


def packed_linear_supported(model: torch.nn.Module) -> bool:
    """Whether the model's linears can run packed here: CPU, fp32, the ops present and correct."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears or not _ops_exist():
        return False
    weight = linears[0].weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return False
    try:
        with torch.inference_mode():
            x = torch.randn(3, weight.shape[1])
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)
            got = torch.ops.mkldnn._linear_pointwise(x, packed, linears[0].bias, "none", [], "")
            return bool(torch.allclose(got, F.linear(x, weight, linears[0].bias), atol=1e-4, rtol=1e-4))
    except RuntimeError as exc:  # an op that exists but refuses this build or shape
        logger.warning("packed linear layers unavailable (%s); using F.linear", exc)
        return False


class PackedLinears:
    """Packed copies of a model's fp32 linear weights and a context that computes with them."""

    def __init__(self, model: torch.nn.Module, batch_hint: int = 8) -> None:
        self.linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        self.batch_hint = batch_hint
        self._packed: list[torch.Tensor] = []

    def pack(self) -> None:
        """(Re)build the packed weights from the current ones."""
        with torch.inference_mode():
            self._packed = [torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), self.batch_hint)
                            for m in self.linears]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside: every linear layer computes with its packed weight (no autograd)."""
        if not self._packed:
            self.pack()
        for m, packed in zip(self.linears, self._packed):
            m.__dict__["forward"] = _packed_forward(packed, m.bias)  # an instance attribute wins over the method
        try:
            yield
        finally:
            for m in self.linears:
                m.__dict__.pop("forward", None)  # back to nn.Linear.forward


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward
