"""scripts/kernel_sass.py's readers, on SASS and ptxas reports shaped like nvdisasm's and ptxas's."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton")
spec = importlib.util.spec_from_file_location("kernel_sass", Path(__file__).parents[2] / "scripts" / "kernel_sass.py")
kernel_sass = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel_sass)

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ;
.L_x_2:
        /*0020*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], RZ ;
        /*0030*/                   LDL R7, [R1+0x10] ;
        /*0040*/                   STL [R1+0x14], R9 ;
        /*0050*/               @P0 BRA `(.L_x_2) ;
        /*0060*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0070*/               @P1 BRA `(.L_x_1) ;
        /*0080*/                   LDL R2, [R1] ;
        /*0090*/               @P2 BRA `(.L_x_3) ;
.L_x_3:
        /*00a0*/                   EXIT ;
"""


def test_the_hot_loop_is_the_innermost_loop_on_the_tensor_cores():
    """Two nested loops with tensor-core instructions: the inner one (4 instructions), with its LDL and STL; the
    LDL after both loops and the forward branch count nowhere."""
    assert kernel_sass.hot_loop(SASS) == {"first": 0x20, "last": 0x50, "instructions": 4, "mma": 1, "LDL": 1,
                                          "STL": 1}


def test_no_hot_loop_without_tensor_cores():
    assert kernel_sass.hot_loop(SASS.replace("HGMMA", "FFMA").replace("HMMA", "FFMA")) is None


# Two partitions' tile loops (0x10-0x30, 0x50-0x70), the first's mbarrier wait retried from past the kernel's end
# (0x90 branches back to 0x20): that range overlaps the loop and reads as a larger one.
TWO_PARTITIONS = """
.L_x_1:
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ ;
.L_x_9:
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5], R2 ;
        /*0030*/               @P1 BRA `(.L_x_1) ;
        /*0040*/                   EXIT ;
.L_x_2:
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ ;
        /*0060*/                   LDL R7, [R1+0x10] ;
        /*0070*/               @P1 BRA `(.L_x_2) ;
        /*0080*/                   EXIT ;
        /*0090*/               @!P0 BRA `(.L_x_9) ;
"""


def test_tile_loops_are_each_partitions_loop_not_a_waits_retry():
    loops = kernel_sass.tile_loops(TWO_PARTITIONS)
    assert [(loop["first"], loop["last"], loop["LDL"]) for loop in loops] == [(0x10, 0x30, 0), (0x50, 0x70, 1)]


def test_ptxas_report():
    report = ("ptxas info    : 184 bytes stack frame, 252 bytes spill stores, 248 bytes spill loads\n"
              "ptxas info    : Used 255 registers, used 1 barriers, 184 bytes cumulative stack size")
    assert kernel_sass.ptxas_info(report) == {"registers": 255, "spill_stores": 252, "spill_loads": 248}
