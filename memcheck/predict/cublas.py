"""What cuBLAS and cuBLASLt take from the caching allocator (torch 2.11, CUDA build), from
aten/src/ATen/cuda/CublasHandlePool.cpp as of early 2026 (after "enable unified cuBLASLt workspace by default",
pytorch#168175, before "fix unified workspace env var handling", pytorch#175879, merged after the 2.11 branch cut):

- getChosenWorkspaceSize / parseChosenWorkspaceSize: the cuBLAS workspace is 32 MiB on sm_90 (4096 KiB x 8), else
  :4096:2:16:8 (8 MiB + 128 KiB); CUBLAS_WORKSPACE_CONFIG=":SIZE_KiB:COUNT..." replaces it with the sum.
- getCurrentCUDABlasHandle -> setWorkspaceForHandle: every cuBLAS op, and every cuBLASLt op (getCurrentCUDABlasLtHandle
  is the cuBLAS handle on CUDA), allocates that workspace from the caching allocator the first time it runs on a
  (handle, stream) and keeps it in a map: never freed, so empty_cache cannot release its segment.
- getCUDABlasLtWorkspace: cuBLASLt ops (addmm with a bias, _addmm_activation, _scaled_mm, _int_mm) also allocate and
  keep their own workspace per (handle, stream) unless TORCH_CUBLASLT_UNIFIED_WORKSPACE is set true; its size
  (getCUDABlasLtWorkspaceSize) is CUBLASLT_WORKSPACE_SIZE KiB, 1024 by default, capped at the cuBLAS size.
- Capture: CUDAGraph::capture_begin clears nothing. A capture on a new stream allocates that stream's workspaces
  during the capture, so they come from (and pin a segment of) the graph's private pool. Only torch.compile's
  CUDA-graph trees clear the map (clearCublasWorkspaces, from cudagraph_trees.clear_cublass_cache): the workspaces'
  blocks go back to the allocator's cache.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from .allocator import KiB, CachingAllocator

# aten ops that reach cuBLAS for float32/float16/bfloat16 CUDA tensors. Composite ops (linear, matmul, einsum,
# tensordot, the math attention) reach these after decomposition.
CUBLAS_OPS = frozenset({
    "mm",  # at::cuda::blas::gemm: cublasGemmEx / cublasSgemm
    "bmm", "baddbmm",  # bgemm: cublasGemmStridedBatchedEx
    "addbmm",  # a loop of in-place addmm: never the Lt path
    "addmv", "mv",  # gemv (half/bf16 through gemm)
    "dot", "vdot",  # cublasDot*
    "addmm",  # cuBLAS unless the Lt path takes it: see LT_OPS
    "linear", "matmul",
    "triangular_solve", "linalg_solve_triangular",  # trsm
})
# ops that also use cuBLASLt: addmm when its bias is a vector, beta is 1 and every gemm dimension exceeds 1 (the
# usual prefill of a linear layer with bias; not a single-token decode); the fused activation; fp8 and int8 gemms
# (_scaled_mm with tensor-wise scales; row-wise fp8 on sm_90 runs a CUTLASS kernel instead).
LT_OPS = frozenset({"addmm", "_addmm_activation", "_scaled_mm", "_int_mm"})
_OP_NAME = re.compile(r"^(?:torch\.ops\.)?(?:aten\.)?([A-Za-z0-9_]+?)(_?)(?:\.[A-Za-z0-9_]+)?$")


@functools.lru_cache(maxsize=None)
def parse_op(op) -> tuple[str, bool]:
    """'aten.addmm_.default' (or the OpOverload itself, remembered: the recorder asks before every operator) ->
    ('addmm', True): the op without namespace or overload, and whether it is in-place."""
    name = str(op)
    m = _OP_NAME.match(name)
    return (m.group(1), bool(m.group(2))) if m else (name, False)


def chosen_workspace_size(sm: tuple[int, int] = (9, 0), env: Mapping[str, str] | None = None) -> int:
    """parseChosenWorkspaceSize: the cuBLAS workspace's bytes."""
    default = 4096 * KiB * 8 if tuple(sm) == (9, 0) else 4096 * KiB * 2 + 16 * KiB * 8
    config = (env or {}).get("CUBLAS_WORKSPACE_CONFIG")
    if config is None:
        return default
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    return sum(int(size) * KiB * int(count) for size, count in pairs) if pairs else default


def _env_true(value: str | None) -> bool | None:
    """c10::utils::check_env: "1" true, "0" false, anything else (or unset) None."""
    return {"1": True, "0": False}.get(value)


def lt_workspace_size(sm: tuple[int, int] = (9, 0), env: Mapping[str, str] | None = None) -> int:
    """getCUDABlasLtWorkspaceSize: CUBLASLT_WORKSPACE_SIZE KiB (1024 by default), capped at the cuBLAS workspace
    while unification is not turned off (the size side already treats unset as on)."""
    env = env or {}
    kib = 1024
    match = re.match(r"\s*[+-]?[0-9]+", env.get("CUBLASLT_WORKSPACE_SIZE", ""))  # std::stoi: a leading integer
    if match:
        kib = int(match.group())
    size = kib * KiB
    if _env_true(env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")) is not False:
        size = min(size, chosen_workspace_size(sm, env))
    return size


class CublasWorkspaces:
    """The workspaces one thread's cuBLAS handle takes on each stream, allocated in `allocator` on first use."""

    def __init__(self, allocator: CachingAllocator, sm: tuple[int, int] = (9, 0),
                 env: Mapping[str, str] | None = None):
        self.allocator = allocator
        self.cublas_size = chosen_workspace_size(sm, env)
        self.lt_size = lt_workspace_size(sm, env)
        # getCUDABlasLtWorkspace shares the cuBLAS workspace only when the variable is set true
        self.unified = _env_true((env or {}).get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")) is True
        self.cublas: dict[int, int] = {}  # stream -> block handle (cublas_handle_stream_to_workspace)
        self.lt: dict[int, int] = {}  # stream -> block handle (cublaslt_handle_stream_to_workspace)

    def before_op(self, op_name, stream: int = 0, lt: bool | None = None) -> None:
        """Before an aten op (its name or OpOverload) runs on `stream`: the workspaces it needs that the stream has not
        got yet. `lt` says whether the op takes the cuBLASLt path; None: as the op usually does (addmm: yes, with its
        bias)."""
        op, inplace = parse_op(op_name)
        if op not in CUBLAS_OPS and op not in LT_OPS:
            return
        if lt is None:  # an in-place addmm_ writes its bias operand: addmm_out_cuda_impl keeps it off the Lt path
            lt = op in LT_OPS and not inplace
        if stream not in self.cublas:  # getCurrentCUDABlasHandle -> setWorkspaceForHandle
            self.cublas[stream] = self.allocator.malloc(self.cublas_size, stream)
        if lt and not self.unified and stream not in self.lt:
            self.lt[stream] = self.allocator.malloc(self.lt_size, stream)  # getCUDABlasLtWorkspace

    def at_capture_begin(self, cudagraph_trees: bool = False) -> None:
        """What capture begin does to the workspaces: nothing for torch.cuda.graph / CUDAGraph.capture_begin (a
        capture stream's own workspaces are then allocated during the capture, from its private pool); torch.compile's
        CUDA-graph trees clear them around warm-up and recording."""
        if cudagraph_trees:
            self.clear()

    def clear(self) -> None:
        """clearCublasWorkspaces: the maps drop their blocks, which go back to the allocator's cache."""
        for handle in (*self.cublas.values(), *self.lt.values()):
            self.allocator.free(handle)
        self.cublas.clear()
        self.lt.clear()
