"""Which implementation runs: Triton on CUDA tensors, Triton under its interpreter on CPU
tensors when TRITON_INTERPRET=1, the torch reference otherwise (so CPU runs need no Triton)."""
import functools
import os


MAX_PROGRAMS_PER_SM = 32  # resident blocks per multiprocessor on sm_80/sm_90: a one-wave grid's cap


def use_triton(t) -> bool:
    return triton_runs_on(t.device)


def triton_runs_on(device) -> bool:
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple:
    import torch

    return torch.cuda.get_device_capability(index)


def compute_capability(device) -> tuple:
    """(major, minor) of a CUDA device, asked once a device (decode and prefill ask it every step); (0, 0) off CUDA."""
    return _capability(device.index or 0) if device.type == "cuda" else (0, 0)


def on_hopper(device) -> bool:
    """Whether the Gluon kernels for sm_90 (memcheck/kernels/*_hopper.py, mla_seesaw.py) run on this device."""
    return compute_capability(device)[0] == 9


def launches_early(device) -> bool:
    """Whether kernels on this device take programmatic dependent launch (a CUDA GPU of sm_90 or later): a kernel so
    launched may start while the one before it drains, and waits (griddepcontrol.wait) before it reads what that one
    wrote; decode's attention and combine lose the launch latency between them (0.3-0.6 us a layer). They do not
    signal early (launch_dependents at their start): small decode layers were 1.03-1.18x slower."""
    return compute_capability(device)[0] >= 9


def pdl_options(early: bool) -> dict:
    """A Triton launch's PDL constexpr (its griddepcontrol.wait) and, where on, the launch option."""
    return {"PDL": early, "launch_pdl": True} if early else {"PDL": False}


def sm_count(device) -> int:
    """Multiprocessors the launch should fill; a token 4 under the CPU interpreter."""
    return _sm_count(device.index or 0) if device.type == "cuda" else 4


def dot_precision(dtype) -> str:
    """fp32 inputs get exact fp32 dots (Triton's default would be tf32); fp16/bf16 ignore it."""
    import torch

    return "ieee" if dtype == torch.float32 else "tf32"


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def fix_triton_interpreter() -> None:
    """Triton 3.6's interpreter takes int() of 1-element arrays (loop bounds), which numpy >= 2.4
    refuses (triton-lang/triton#9171, fixed upstream by #9172). Patch that one attribute."""
    from triton.runtime import interpreter

    if getattr(interpreter, "_memcheck_index_fix", False):
        return
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter._memcheck_index_fix = True


def upcast_dots(t) -> bool:
    """Whether dots must widen their operands: bf16 under the CPU interpreter (see memcheck/kernels/dot.py)."""
    import torch

    return t.device.type == "cpu" and t.dtype == torch.bfloat16


_RESIDENT: dict = {}


def resident_programs(kernel_fn, key, device, num_warps: int, warmup) -> int:
    """How many programs of a compiled kernel fit on the GPU at once (multiprocessors x programs
    per multiprocessor, from its registers and shared memory): the grid of a one-wave launch.
    `warmup()` compiles the kernel without running it; the answer is cached under `key`."""
    if device.type != "cuda":
        return sm_count(device)
    full_key = (kernel_fn, key, device.index)
    if full_key not in _RESIDENT:
        import torch

        compiled = warmup()
        compiled._init_handles()
        props = torch.cuda.get_device_properties(device)
        regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
        smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
        threads_per_sm = getattr(props, "max_threads_per_multi_processor", 2048)
        regs_per_warp = -(-compiled.n_regs * 32 // 256) * 256  # allocated per warp, 256 at a time
        by_regs = (regs_per_sm // max(regs_per_warp, 256)) // num_warps
        by_smem = smem_per_sm // (compiled.metadata.shared + 1024)  # 1 KiB reserved per block
        by_threads = threads_per_sm // (32 * num_warps)
        per_sm = min(by_regs, by_smem, by_threads, MAX_PROGRAMS_PER_SM)
        _RESIDENT[full_key] = props.multi_processor_count * max(1, per_sm)
    return _RESIDENT[full_key]
