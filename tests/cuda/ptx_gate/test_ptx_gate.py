#!/usr/bin/env python3
"""Unit tests of scripts/ptx_gate.py on literal PTX. Standard library only:
python3 tests/cuda/ptx_gate/test_ptx_gate.py"""

import contextlib
import io
import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "scripts"))
import ptx_gate  # noqa: E402

HEADER = ".version 9.0\n.target sm_90\n.address_size 64\n"


def check(body):
    return ptx_gate.check_text(HEADER + body, "t.ptx")


def rules(line):
    """The rules one instruction breaks (sorted), [] when it is allowed."""
    result = check(line + "\n")
    assert result.instructions == 1, (line, result)
    return sorted(r for v in result.violations for r in v.rules)


class Instructions(unittest.TestCase):
    def test_allowed(self):
        for line in [
                "add.rn.f32 %f1, %f2, %f3;",
                "sub.rz.f32 %f1, %f2, %f3;",
                "mul.rn.f32 %f1, %f2, 0f3F800000;",
                "mul.rm.f64 %fd1, %fd2, %fd3;",
                "add.rn.sat.f32 %f1, %f2, %f3;",
                "add.rn.bf16x2 %r1, %r2, %r3;",
                "div.rn.f32 %f1, %f2, %f3;",
                "sqrt.rn.f32 %f1, %f2;",
                "rcp.rn.f32 %f1, %f2;",
                "rcp.rn.f64 %fd1, %fd2;",
                "cvt.rn.f16.f32 %rs1, %f1;",
                "cvt.f32.f16 %f1, %rs1;",
                "cvt.rni.s32.f32 %r1, %f1;",
                "cvt.rn.satfinite.e4m3x2.f32 %rs1, %f1, %f2;",
                "neg.f32 %f1, %f2;",
                "abs.f32 %f1, %f2;",
                "min.f32 %f1, %f2, %f3;",
                "max.NaN.f32 %f1, %f2, %f3;",
                "setp.lt.f32 %p1, %f1, 0f00800000;",
                "selp.f32 %f1, %f2, %f3, %p1;",
                "testp.finite.f32 %p1, %f1;",
                "copysign.f32 %f1, %f2, %f3;",
                "ld.global.nc.L1::no_allocate.f32 %f1, [%rd1];",
                "ld.global.v2.f32 {%f1, %f2}, [%rd1];",
                "st.global.f32 [%rd1], %f1;",
                "mov.b32 %f1, %r1;",
                "shfl.sync.bfly.b32 %r1, %r2, 8, 4127, -1;",
                "atom.global.min.f32 %f1, [%rd1], %f2;",
                "atom.global.add.noftz.u32 %r1, [%rd1], %r2;",
                "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                "{%r1,%r2,%r3,%r4}, {%r5,%r6}, {%r7}, {%r8,%r9,%r10,%r11};",
                "ret;",
        ]:
            with self.subTest(line=line):
                self.assertEqual(rules(line), [])

    def test_integer_mad_mul_add(self):
        for line in [
                "mad.lo.s32 %r1, %r2, %r3, %r4;",
                "mad.wide.u32 %rd1, %r2, %r3, %rd4;",
                "mad.hi.u64 %rd1, %rd2, %rd3, %rd4;",
                "mad.lo.cc.u32 %r1, %r2, %r3, %r4;",
                "madc.hi.cc.u32 %r1, %r2, %r3, %r4;",
                "mul.lo.s32 %r1, %r2, %r3;",
                "mul.wide.s32 %rd1, %r2, 4;",
                "add.s64 %rd1, %rd2, %rd3;",
                "add.cc.u32 %r1, %r2, %r3;",
                "sub.u32 %r1, %r2, %r3;",
                "sub.s16 %rs1, %rs2, %rs3;",
                "div.s32 %r1, %r2, %r3;",
        ]:
            with self.subTest(line=line):
                self.assertEqual(rules(line), [])

    def test_fma_mad_on_floating_types(self):
        for line in [
                "fma.rn.f32 %f1, %f2, %f3, %f4;",
                "fma.rz.f64 %fd1, %fd2, %fd3, %fd4;",
                "fma.rn.f16 %rs1, %rs2, %rs3, %rs4;",
                "fma.rn.bf16x2 %r1, %r2, %r3, %r4;",
                "fma.rn.relu.f16x2 %r1, %r2, %r3, %r4;",
                "fma.rn.f32x2 %rd1, %rd2, %rd3, %rd4;",
                "fma.rn.sat.f32 %f1, %f2, %f3, %f4;",
                "mad.rn.f32 %f1, %f2, %f3, %f4;",
                "mad.f32 %f1, %f2, %f3, %f4;",
        ]:
            with self.subTest(line=line):
                self.assertIn("fma", rules(line))

    def test_bare_arithmetic_is_contractible(self):
        for line in [
                "add.f32 %f1, %f2, %f3;",
                "sub.f32 %f1, %f2, %f3;",
                "mul.f32 %f1, %f2, %f3;",
                "add.sat.f32 %f1, %f2, %f3;",
                "mul.f64 %fd1, %fd2, %fd3;",
                "add.f16 %rs1, %rs2, %rs3;",
                "sub.bf16x2 %r1, %r2, %r3;",
                "mul.f16x2 %r1, %r2, %r3;",
        ]:
            with self.subTest(line=line):
                self.assertEqual(rules(line), ["contractible"])

    def test_add_rn_vs_add(self):
        self.assertEqual(rules("add.rn.f32 %f1, %f2, %f3;"), [])
        self.assertEqual(rules("add.f32 %f1, %f2, %f3;"), ["contractible"])

    def test_approx_ftz_div_full(self):
        self.assertEqual(rules("cvt.rn.ftz.f32.f16 %f1, %rs1;"), ["ftz"])
        self.assertEqual(rules("mul.rn.ftz.f32 %f1, %f2, %f3;"), ["ftz"])
        self.assertEqual(rules("neg.ftz.f32 %f1, %f2;"), ["ftz"])
        self.assertEqual(rules("div.full.f32 %f1, %f2, %f3;"), ["div.full"])
        self.assertEqual(rules("div.full.ftz.f32 %f1, %f2, %f3;"), ["div.full", "ftz"])
        self.assertEqual(rules("div.rn.f32 %f1, %f2, %f3;"), [])
        self.assertEqual(rules("rcp.rn.f32 %f1, %f2;"), [])
        self.assertEqual(rules("rcp.approx.ftz.f64 %fd1, %fd2;"), ["approx", "ftz"])
        for op in ["rsqrt.approx.f32", "rcp.approx.f32", "sqrt.approx.f32", "ex2.approx.f32",
                   "lg2.approx.f32", "sin.approx.f32", "cos.approx.f32", "tanh.approx.f32",
                   "ex2.approx.ftz.bf16x2"]:
            with self.subTest(op=op):
                self.assertIn("approx", rules(op + " %f1, %f2;"))
        self.assertEqual(rules("div.approx.f32 %f1, %f2, %f3;"), ["approx"])

    def test_matrix_and_atomics(self):
        self.assertEqual(
            rules("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                  "{%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f5,%f6,%f7,%f8};"),
            ["mma"])
        self.assertEqual(rules("tcgen05.mma.cta.kind::tf32 [%r1], %rd1, %rd2, %r2, %p1;"),
                         ["mma"])
        self.assertEqual(rules("tcgen05.mma.cta.kind::i8 [%r1], %rd1, %rd2, %r2, %p1;"), [])
        self.assertEqual(rules("atom.global.add.f32 %f1, [%rd1], %f2;"), ["float-atomic"])
        self.assertEqual(rules("red.global.add.noftz.f16x2 [%rd1], %r1;"), ["float-atomic"])


class Syntax(unittest.TestCase):
    def test_predicated(self):
        self.assertEqual(rules("@%p1 add.f32 %f1, %f2, %f3;"), ["contractible"])
        self.assertEqual(rules("@!%p1 fma.rn.f32 %f1, %f2, %f3, %f4;"), ["fma"])
        self.assertEqual(rules("@%p2 bra $L__BB0_2;"), [])
        self.assertEqual(rules("@p add.rn.f32 %f1, %f2, %f3;"), [])

    def test_comments_are_not_instructions(self):
        result = check("// fma.rn.f32 %f1, %f2, %f3, %f4;\n"
                       "/* add.f32 %f1, %f2, %f3;\n mul.f32 %f1, %f2, %f3; */\n"
                       "add.rn.f32 %f1, %f2, %f3; // rsqrt.approx.ftz.f32\n"
                       "mul.rn.f32 /* .ftz */ %f1, %f2, %f3;\n")
        self.assertEqual(result.instructions, 2)
        self.assertEqual(result.violations, [])

    def test_directives_and_strings(self):
        result = check('.file 1 "/src/fma.approx.ftz.cu"\n'
                       '.file 2 "a;b{c" , 1700000000, 0\n'
                       ".visible .entry k(\n.param .u64 k_param_0\n)\n.maxntid 128, 1, 1\n{\n"
                       ".reg .f32 %f<4>;\n"
                       ".loc 1 7 3\n"
                       '.pragma "nounroll";\n'
                       "add.rn.f32 %f1, %f2, %f3;\n"
                       "}\n"
                       ".global .align 1 .b8 $str[9] = {102, 109, 97, 46, 102, 51, 50, 59, 0};\n"
                       ".global .align 8 .u64 tbl[2] = {fma_f32, mad_f32};\n"
                       '.section .debug_str\n{\n$L__info_string0:\n.b8 102,109,97\n}\n')
        self.assertEqual(result.instructions, 1)
        self.assertEqual(result.violations, [])

    def test_line_numbers_labels_and_blocks(self):
        # Lines 1-3 are HEADER.
        result = check("$L__BB0_2:\n"
                       "\tadd.rn.f32 %f1, %f2, %f3;\n"
                       "$L__BB0_3: mul.f32 %f1, %f2, %f3;\n"
                       "{\n"
                       "\t.reg .pred p;\n"
                       "\tsetp.ne.b32 p, %r1, 0;\n"
                       "\t@p sub.f32 %f1, %f2, %f3; add.f32 %f4, %f5, %f6;\n"
                       "}\n"
                       "call.uni (retval0),\n vprintf,\n (param0, param1);\n"
                       "mov.b64 {%r1, %r2}, %rd1; fma.rn.f32 %f1, %f2, %f3, %f4;\n")
        self.assertEqual(result.instructions, 8)
        got = [(v.line, v.rules, v.text) for v in result.violations]
        self.assertEqual(got, [
            (6, ["contractible"], "mul.f32 %f1, %f2, %f3"),
            (10, ["contractible"], "@p sub.f32 %f1, %f2, %f3"),
            (10, ["contractible"], "add.f32 %f4, %f5, %f6"),
            (15, ["fma"], "fma.rn.f32 %f1, %f2, %f3, %f4"),
        ])

    def test_unclosed_brace_does_not_hide_instructions(self):
        result = check("ld.global.v2.f32 {%f1, %f2, [%rd1];\nmul.f32 %f1, %f2, %f3;\n")
        self.assertEqual(result.instructions, 2)
        self.assertEqual([v.rules for v in result.violations], [["contractible"]])


GEMM = "_ZN12kernel_align4cuda12kernel_entryINS0_4GemmINS0_8CudaGridEEEEEvNT_6ParamsE"
NORM = ("_ZN12kernel_align4cuda12kernel_entryINS0_18NormForwardGenericINS0_8CudaGridEEEEEv"
        "NT_6ParamsE")


def entry(name, body):
    return (f".visible .entry {name}(\n.param .align 8 .b8 {name}_param_0[64]\n)\n"
            f".maxntid 256, 1, 1\n{{\n.reg .f32 %f<9>;\n{body}ret;\n}}\n")


class FmaScope(unittest.TestCase):
    """--fma-in: fma.rn.f32 allowed only inside the functions it names."""

    FMA = "fma.rn.f32 %f1, %f2, %f3, %f4;\n"

    def check(self, body, *patterns):
        return ptx_gate.check_text(HEADER + body, "t.ptx", [re.compile(p) for p in patterns])

    def test_function_names(self):
        self.assertEqual(ptx_gate.function_name(".visible .entry k(\n.param .u64 p\n)"), "k")
        self.assertEqual(ptx_gate.function_name(".entry k2 ()"), "k2")
        self.assertEqual(ptx_gate.function_name(
            ".func  (.param .b32 func_retval0) _Z3fooi(\n.param .b32 _Z3fooi_param_0\n)"),
            "_Z3fooi")
        self.assertEqual(ptx_gate.function_name(".weak .func _Z3barv()"), "_Z3barv")
        self.assertEqual(ptx_gate.function_name(".extern .func (.param .b32 r) vprintf(.param "
                                                ".b64 a, .param .b64 b)"), "vprintf")
        self.assertIsNone(ptx_gate.function_name(".global .align 4 .b8 entry[4]"))
        self.assertIsNone(ptx_gate.function_name(".reg .f32 %f<4>"))

    def test_allowed_only_in_matching_functions(self):
        body = entry(GEMM, self.FMA * 3 + "mul.rn.f32 %f1, %f2, %f3;\n") + entry(NORM, self.FMA)
        result = self.check(body, "4GemmI")
        self.assertEqual([(v.rules, v.text) for v in result.violations],
                         [(["fma"], "fma.rn.f32 %f1, %f2, %f3, %f4")])
        self.assertEqual([(f.name, f.allowed_fma, f.fma) for f in result.functions],
                         [(GEMM, True, 3), (NORM, False, 0)])
        # Without the allowance every fma is refused, as always.
        self.assertEqual(len(self.check(body).violations), 4)

    def test_only_fma_rn_f32(self):
        for line in ["fma.rz.f32 %f1, %f2, %f3, %f4;", "fma.rn.ftz.f32 %f1, %f2, %f3, %f4;",
                     "fma.rn.sat.f32 %f1, %f2, %f3, %f4;", "fma.rn.f64 %fd1, %fd2, %fd3, %fd4;",
                     "fma.rn.bf16x2 %r1, %r2, %r3, %r4;", "mad.f32 %f1, %f2, %f3, %f4;",
                     "mul.f32 %f1, %f2, %f3;"]:
            with self.subTest(line=line):
                result = self.check(entry(GEMM, line + "\n"), "4GemmI")
                self.assertEqual(len(result.violations), 1)
                self.assertEqual(result.functions[0].fma, 0)

    def test_instructions_belong_to_the_last_header(self):
        # A declaration of the gemm before another kernel's body does not lend it the
        # allowance; the body after a later header belongs to that header.
        body = (f".extern .func (.param .b32 r) {GEMM}_helper(.param .b32 a);\n" +
                entry(NORM, self.FMA) + entry(GEMM, self.FMA))
        result = self.check(body, "4GemmI")
        self.assertEqual([v.line for v in result.violations], [11])
        self.assertEqual([f.fma for f in result.functions], [0, 0, 1])

    def run_gate(self, *args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                status = ptx_gate.main(list(args))
            except SystemExit as e:
                status = e.code
        return status, out.getvalue()

    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_count(self):
        two = self.write(HEADER + entry(GEMM, self.FMA * 2) + entry(NORM, ""))
        self.assertEqual(self.run_gate("--fma-in", "4GemmI", two)[0], 0)
        self.assertEqual(self.run_gate("--fma-in", "4GemmI", "--fma-count", "2", two)[0], 0)
        status, out = self.run_gate("--fma-in", "4GemmI", "--fma-count", "3", two)
        self.assertEqual(status, 1)
        self.assertIn(f"{two}:4: fma-count: {GEMM} holds 2 fma.rn.f32, expected 3\n", out)
        # Each matching function is held to the count.
        both = self.write(HEADER + entry(GEMM, self.FMA * 2) + entry(GEMM + "2", self.FMA))
        self.assertEqual(self.run_gate("--fma-in", "4GemmI", "--fma-count", "2", both)[0], 1)
        # A count needs a function to hold it.
        status, out = self.run_gate("--fma-in", "nothing", "--fma-count", "2", two)
        self.assertEqual(status, 1)
        self.assertIn("fma-count: no function matches --fma-in nothing", out)
        self.assertEqual(self.run_gate("--fma-in", "nothing", "--fma-count", "2",
                                       "--expect", "fma-count", "--expect", "fma", two)[0], 0)
        # Counts pair with the patterns by position, each pattern held to its own.
        mixed = self.write(HEADER + entry(GEMM, self.FMA * 2) + entry(NORM, self.FMA))
        self.assertEqual(self.run_gate("--fma-in", "4GemmI", "--fma-in", NORM, "--fma-count",
                                       "2", "--fma-count", "1", mixed)[0], 0)
        status, out = self.run_gate("--fma-in", "4GemmI", "--fma-in", NORM, "--fma-count",
                                    "1", "--fma-count", "2", mixed)
        self.assertEqual(status, 1)
        self.assertIn(f"{GEMM} holds 2 fma.rn.f32, expected 1", out)
        self.assertIn(f"{NORM} holds 1 fma.rn.f32, expected 2", out)
        # Every pattern needs a function.
        status, out = self.run_gate("--fma-in", "4GemmI", "--fma-in", "nothing", "--fma-count",
                                    "2", "--fma-count", "1", two)
        self.assertEqual(status, 1)
        self.assertIn("no function matches --fma-in nothing", out)
        # Usage errors.
        self.assertEqual(self.run_gate("--fma-in", "4GemmI", "--fma-in", NORM, "--fma-in", "x",
                                       "--fma-count", "2", "--fma-count", "1", mixed)[0], 2)
        self.assertEqual(self.run_gate("--fma-count", "2", two)[0], 2)
        self.assertEqual(self.run_gate("--fma-in", "(", two)[0], 2)


class CommandLine(unittest.TestCase):
    def run_gate(self, *args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                status = ptx_gate.main(list(args))
            except SystemExit as e:
                status = e.code
        return status, out.getvalue()

    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_exit_status_and_summary(self):
        clean = self.write(HEADER + "add.rn.f32 %f1, %f2, %f3;\nret;\n")
        bad = self.write(HEADER + "add.rn.f32 %f1, %f2, %f3;\n\tfma.rn.f32 %f1, %f2, %f3, %f4;\n")
        status, out = self.run_gate(clean)
        self.assertEqual(status, 0)
        self.assertEqual(out, "ptx gate: 1 file, 2 instructions checked, clean\n")
        status, out = self.run_gate(clean, bad)
        self.assertEqual(status, 1)
        self.assertIn(f"{bad}:5: fma: fma.rn.f32 %f1, %f2, %f3, %f4\n", out)
        self.assertIn("ptx gate: 2 files, 4 instructions checked, 1 violating instructions in "
                      "1 file\n", out)

    def test_errors(self):
        self.assertEqual(self.run_gate("/nonexistent/x.ptx")[0], 2)
        self.assertEqual(self.run_gate(self.write("add.f32 %f1, %f2, %f3;\n"))[0], 2)
        self.assertEqual(self.run_gate()[0], 2)

    def test_expect(self):
        bad = self.write(HEADER + "fma.rn.f32 %f1, %f2, %f3, %f4;\n")
        clean = self.write(HEADER + "ret;\n")
        self.assertEqual(self.run_gate("--expect", "fma", bad)[0], 0)
        self.assertEqual(self.run_gate("--expect", "fma", "--expect", "ftz", bad)[0], 1)
        self.assertEqual(self.run_gate("--expect", "fma", clean)[0], 1)
        self.assertEqual(self.run_gate("--expect", "fma", "/nonexistent/x.ptx")[0], 2)
        self.assertEqual(self.run_gate("--expect", "nonsense", bad)[0], 2)


if __name__ == "__main__":
    unittest.main()
