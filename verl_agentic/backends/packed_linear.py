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

**Fewer bytes per weight** (``weight_dtype``, opt-in): the copies can be ``bfloat16`` (oneDNN's packed
bf16 inner product) or ``int8`` (per-output-channel symmetric scales, torch's weight-only int8 matmul
``_weight_int8pack_mm``). The model keeps its fp32 weights (a trainer sharing it is untouched); the
activations enter each linear in bf16 and leave in the model's dtype, so norms, residuals, attention
and the KV cache stay fp32. Generation then differs from the fp32 model's (its logprobs are the
low-precision model's): the trainer corrects that with rollout correction (docs/training.md). Both paths
are fast only with the right instructions: :func:`check_weight_dtype` refuses, before anything loads,
where torch would fall back to a slow kernel (DEVLOG: bf16 once ran on a reference GEMM).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from verl_agentic.interfaces import ConfigError, canonical_weight_dtype

logger = logging.getLogger(__name__)

# torch private ops used here (a test checks they still exist): oneDNN linear with a packed weight,
# the weight-only int8 matmul, and the CPU's instruction sets as torch's cpuinfo sees them.
ONEDNN_OPS = ("mkldnn._reorder_linear_weight", "mkldnn._linear_pointwise")
PRIVATE_OPS = (*ONEDNN_OPS, "aten._weight_int8pack_mm")
PRIVATE_FUNCTIONS = ("torch._C._cpu._get_cpu_capability",)

# the torch dtype of each canonical weight_dtype name (interfaces.WEIGHT_DTYPE_NAMES: every accepted name)
WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}

# what each low-precision path needs from the CPU to run its fast kernel (any one of the flags, as
# torch's cpuinfo names them): oneDNN's bf16 GEMM uses AVX512-BF16 or AMX (x86) / BF16 (Arm); torch's
# int8 weight-only matmul has a vectorized kernel for AVX512 (x86) and Arm NEON.
FAST_PATH_FLAGS = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16"),
    torch.int8: ("avx512_f", "neon", "asimd"),
}


def weight_dtype_of(name: str | torch.dtype, setting: str = "rollout.hf.weight_dtype") -> torch.dtype:
    """The torch dtype of a ``weight_dtype`` name (``float32|fp32``, ``bfloat16|bf16``, ``int8``).

    Raises:
        ConfigError: an unknown name.
    """
    return WEIGHT_DTYPES[canonical_weight_dtype(name, setting)]


def cpu_flags() -> dict[str, object]:
    """The CPU's features as torch's bundled cpuinfo reports them (``{"avx512_bf16": True, ...}``)."""
    return dict(torch._C._cpu._get_cpu_capability())


def check_weight_dtype(name: str | torch.dtype, flags: dict[str, object] | None = None,
                       setting: str = "rollout.hf.weight_dtype") -> torch.dtype:
    """Check that generation can use ``weight_dtype`` on this CPU at full speed; return its torch dtype.

    Args:
        name: the ``weight_dtype`` setting.
        flags: the CPU's features (default: :func:`cpu_flags`; a test passes a CPU it does not have).
        setting: the config key the messages name.

    Raises:
        ConfigError: an unknown name, or a CPU without the instructions the low-precision kernel needs
            (the message names them and what this CPU is).
    """
    dtype = weight_dtype_of(name, setting)
    if dtype == torch.float32:
        return dtype
    flags = cpu_flags() if flags is None else flags
    needed = FAST_PATH_FLAGS[dtype]
    if not any(flags.get(flag) for flag in needed):
        label = "bfloat16" if dtype == torch.bfloat16 else "int8"
        raise ConfigError(
            f"{setting}={label} needs one of the CPU instruction sets {', '.join(needed)} "
            f"for a fast kernel, and this CPU ({flags.get('cpu_name', 'unknown')}, "
            f"{flags.get('architecture', 'unknown architecture')}) has none: torch would run a slow reference "
            f"kernel, slower than float32. Use {setting}=float32.")
    if dtype == torch.int8 and not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        raise ConfigError(f"{setting}=int8 needs torch's _weight_int8pack_mm, missing in torch "
                          f"{torch.__version__}; use bfloat16 or float32")
    return dtype


def _ops_exist() -> bool:
    return (torch.backends.mkldnn.is_available()
            and all(hasattr(getattr(torch.ops, ns), name) for ns, name in (op.split(".") for op in ONEDNN_OPS)))


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
    """Packed (and optionally lower-precision) copies of a model's fp32 linear weights and a context
    that computes with them.

    Args:
        model: the model whose ``nn.Linear`` layers are copied (its weights are never changed).
        batch_hint: the batch size oneDNN packs fp32/bf16 weights for.
        weight_dtype: ``float32`` (exact, the weights reordered for oneDNN), ``bfloat16`` or ``int8``
            (see the module docstring; check the CPU first with :func:`check_weight_dtype`).
        onednn: pack through oneDNN (``packed_linear_supported``); False keeps plain tensors for
            ``F.linear`` (bf16) — int8 never uses oneDNN.
    """

    def __init__(self, model: torch.nn.Module, batch_hint: int = 8, weight_dtype: str | torch.dtype = "float32",
                 onednn: bool = True) -> None:
        self.linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        self.batch_hint = batch_hint
        self.weight_dtype = weight_dtype_of(weight_dtype)
        self.onednn = onednn and _ops_exist()
        self._forwards: list = []

    @property
    def nbytes(self) -> int:
        """Bytes the copies take (what generation reads per step, besides embeddings and norms)."""
        return sum(m.weight.numel() * self.weight_dtype.itemsize for m in self.linears)

    def pack(self) -> None:
        """(Re)build the copies from the current weights."""
        with torch.inference_mode():
            self._forwards = [None if self.weight_dtype == torch.float32 and not self.onednn  # nn.Linear's own
                              else linear_copy(m.weight.detach(), m.bias, self.weight_dtype, self.batch_hint,
                                               self.onednn)
                              for m in self.linears]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside: every linear layer computes with its copy (no autograd)."""
        if not self._forwards:
            self.pack()
        for m, forward in zip(self.linears, self._forwards):
            if forward is not None:
                m.__dict__["forward"] = forward  # an instance attribute wins over the method
        try:
            yield
        finally:
            for m in self.linears:
                m.__dict__.pop("forward", None)  # back to nn.Linear.forward


def linear_copy(weight: torch.Tensor, bias: torch.Tensor | None, weight_dtype: torch.dtype, batch_hint: int,
                onednn: bool):
    """``x -> x @ weight.T + bias`` computed with a copy of ``weight`` in ``weight_dtype`` (fp32: packed
    for oneDNN when ``onednn``, else the tensor itself), for fp32 activations."""
    bias = None if bias is None else bias.detach()
    if weight_dtype == torch.float32:
        if onednn:
            return _packed_forward(torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), batch_hint), bias)
        return lambda x: F.linear(x, weight, bias)
    if weight_dtype == torch.bfloat16:
        w = weight.to(torch.bfloat16).contiguous()
        b = None if bias is None else bias.to(torch.bfloat16)
        if onednn:
            return _cast_forward(_packed_forward(torch.ops.mkldnn._reorder_linear_weight(w, batch_hint), b))
        return _cast_forward(lambda x: F.linear(x, w, b))
    q, scales = quantize_int8(weight)
    return _int8_forward(q, scales.to(torch.bfloat16), bias)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: ``weight ~= q * scales[:, None]``, ``|q| <= 127``."""
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales.float()


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward


def _cast_forward(inner):
    """A bf16 linear for fp32 activations: cast in, compute, cast back."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        return inner(x.to(torch.bfloat16)).to(x.dtype)

    return forward


def _int8_forward(q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = torch.ops.aten._weight_int8pack_mm(flat, q, scales).to(x.dtype)
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], q.shape[0])

    return forward
