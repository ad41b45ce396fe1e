#!/usr/bin/env python3
"""PTX gate: refuse PTX whose floating-point instructions break the arithmetic contract.

The contract (docs/contract.md) rounds every fp32 operation on its own: no fused or
contractible multiply-add, no approximate instructions, no flush-to-zero. ptxas may fuse a
bare `mul.f32` with a following `add.f32` into FFMA, but never one carrying an explicit
rounding modifier (`mul.rn.f32`), so the gate checks PTX, where that distinction is still
visible. See docs/ptx-gate.md.

One exception, for the GEMM's leaves (the contract's one use of fma, section 10): with
`--fma-in REGEX`, `fma.rn.f32` is allowed inside the PTX functions (.entry/.func) whose
name matches REGEX, and nowhere else; `--fma-count N` then demands exactly N of them in
each such function (the explicit __fmaf_rn calls, so a contraction shows as a surplus).

Standard library only; Python 3.8 or later.
"""

from __future__ import annotations

import argparse
import bisect
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Pattern, Sequence, Tuple

# Floating-point types of PTX instructions (scalar, packed, and those of matrix ops).
FLOAT_TYPES = frozenset({
    "f16", "f16x2", "bf16", "bf16x2", "f32", "f32x2", "f64", "tf32",
    "e4m3", "e5m2", "e4m3x2", "e5m2x2", "e2m3", "e3m2", "e2m1", "e2m1x2", "ue8m0", "ue4m3",
})
ROUNDING = frozenset({"rn", "rz", "rm", "rp"})

# Rule names, as --expect takes them, with the reason a report gives.
RULES = {
    "fma": "fused multiply-add on a floating type (fma/mad)",
    "contractible": "floating add/sub/mul/div/sqrt/rcp without a rounding modifier "
                    "(.rn/.rz/.rm/.rp): ptxas may contract or approximate it",
    "approx": "approximate instruction (.approx)",
    "ftz": "flush-to-zero (.ftz)",
    "div.full": "div.full is not correctly rounded",
    "mma": "matrix multiply-accumulate on floating types (fused, unspecified order)",
    "float-atomic": "floating atomic or reduction add (order-dependent rounding)",
    "fma-count": "a function allowed fma.rn.f32 (--fma-in) holds another number of them "
                 "than --fma-count, or no function matches --fma-in",
}

# Bare arithmetic that ptxas may contract (mul/add/sub) or that has no defined rounding.
NEEDS_ROUNDING = frozenset({"add", "sub", "mul", "div", "sqrt", "rcp"})
FMA_OPS = frozenset({"fma", "mad", "madc"})
MMA_OPS = frozenset({"mma", "wmma", "wgmma", "tcgen05"})

# Directives that end at the end of their line instead of at ';'.
LINE_DIRECTIVES = frozenset({
    ".version", ".target", ".address_size", ".file", ".loc", ".maxntid", ".reqntid",
    ".minnctapersm", ".maxnctapersm", ".maxnreg", ".maxclusterrank", ".reqnctapercluster",
    ".explicitcluster", ".noreturn", ".abi_preserve", ".abi_preserve_control",
})

_LABEL = re.compile(r"[A-Za-z_$%][\w$]*\s*:(?!:)")
_GUARD = re.compile(r"@!?[%\w$]+\s*")
_OPCODE = re.compile(r"[A-Za-z_]\w*(?:\.\w+(?:::\w+)*)*")
_DIRECTIVE_WORD = re.compile(r"\.\w+")
# A function's header: linkage directives, .entry or .func, for .func an optional return
# parameter list, then the name.
_FUNCTION = re.compile(r"(?:\.(?:visible|extern|weak|common)\s+)*\.(?:entry|func)\b\s*")
_NAME = re.compile(r"[A-Za-z_$%][\w$]*")
# The one fused instruction --fma-in allows: fp32, round to nearest even, nothing else.
ALLOWED_FMA = ("fma", ["rn", "f32"])


@dataclass
class Violation:
    path: str
    line: int
    rules: List[str]
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {', '.join(self.rules)}: {self.text}"


@dataclass
class Function:
    name: str
    line: int
    allowed_fma: bool  # its name matches --fma-in
    fma: int = 0  # fma.rn.f32 instructions in it


@dataclass
class Result:
    instructions: int = 0
    violations: List[Violation] = field(default_factory=list)
    has_version: bool = False
    functions: List[Function] = field(default_factory=list)  # in order, declarations too


def strip_comments_and_strings(text: str) -> str:
    """Blanks out // and /* */ comments and the contents of "..." strings, keeping every
    newline (and so every line number) and every other character's offset."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            for k in range(i + 1, j - 1):
                out[k] = " "
            i = j
        else:
            i += 1
    return "".join(out)


def _strip_labels(s: str, pos: int) -> Tuple[str, int]:
    while True:
        m = _LABEL.match(s)
        if not m:
            return s, pos
        rest = s[m.end():]
        stripped = rest.lstrip()
        pos += m.end() + (len(rest) - len(stripped))
        s = stripped


def statements(clean: str) -> Iterable[Tuple[str, int]]:
    """Splits comment-free PTX into statements (directives and instructions), each with the
    offset of its first character. Braces that open blocks split statements; braces of
    vector operands ({%f1, %f2}) and of initializers (= {1, 2}) do not."""
    buf: List[str] = []
    start = -1
    depth = 0  # of operand or initializer braces inside the current statement

    def head() -> Tuple[str, int]:
        s = "".join(buf)
        stripped = s.lstrip()
        return _strip_labels(stripped, start + len(s) - len(stripped))

    for i, c in enumerate(clean):
        if depth == 0 and c in ";{}\n":
            s, pos = head() if buf else ("", start)
            if c == "\n":
                word = _DIRECTIVE_WORD.match(s)
                if s.startswith("@@") or (word and word.group(0) in LINE_DIRECTIVES):
                    yield s.rstrip(), pos
                    buf, start = [], -1
                    continue
            elif c == "{" and s and (not s.startswith(".") or "=" in s):
                depth = 1  # operand vector or initializer
            else:
                if s.strip():
                    yield s.rstrip(), pos
                buf, start = [], -1
                continue
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == ";":
            # Braces left open by malformed text: end the statement anyway rather than
            # let it swallow the instructions that follow.
            depth = 0
            s, pos = head()
            yield s.rstrip(), pos
            buf, start = [], -1
            continue
        if start < 0:
            if c.isspace():
                continue
            start = i
        buf.append(c)
    s, pos = head() if buf else ("", start)
    if s.strip():
        yield s.rstrip(), pos


def parse_instruction(stmt: str) -> Optional[Tuple[str, List[str]]]:
    """Returns (base opcode, modifiers) of an instruction statement, None for a directive
    or anything else that is not an instruction."""
    s = stmt
    if s.startswith("."):
        return None
    m = _GUARD.match(s)
    if m:
        s = s[m.end():]
    m = _OPCODE.match(s)
    if not m:
        return None
    end = m.end()
    if end < len(s) and not (s[end].isspace() or s[end] in "{[(%;"):
        return None  # e.g. an initializer's symbol list
    parts = m.group(0).split(".")
    return parts[0], parts[1:]


def rules_broken(base: str, mods: Sequence[str]) -> List[str]:
    """The rules (keys of RULES) an instruction breaks, given its dot-separated parts."""
    mods_set = set(mods)
    is_float = bool(mods_set & FLOAT_TYPES)
    broken = []
    if base in FMA_OPS and is_float:
        broken.append("fma")
    if (base in NEEDS_ROUNDING and is_float and
            not mods_set & (ROUNDING | {"approx", "full"})):
        broken.append("contractible")
    if "approx" in mods_set:
        broken.append("approx")
    if "ftz" in mods_set:
        broken.append("ftz")
    if base == "div" and "full" in mods_set:
        broken.append("div.full")
    if base in MMA_OPS and (base == "mma" or any(m.startswith("mma") for m in mods)):
        # tcgen05.mma names its types by kind::f16, kind::tf32, kind::f8f6f4, kind::i8...
        kinds = [m.split("::", 1)[1] for m in mods if m.startswith("kind::")]
        if is_float or any(not k.startswith("i") for k in kinds):
            broken.append("mma")
    if is_float and "add" in mods_set and (
            base in ("atom", "red", "multimem") or (base == "cp" and "reduce" in mods_set)):
        broken.append("float-atomic")
    return broken


def function_name(stmt: str) -> Optional[str]:
    """The name a .entry/.func header (or declaration) statement names, else None."""
    m = _FUNCTION.match(stmt)
    if not m:
        return None
    rest = stmt[m.end():]
    if rest.startswith("("):  # .func's return parameters
        depth = 0
        for i, c in enumerate(rest):
            depth += 1 if c == "(" else (-1 if c == ")" else 0)
            if depth == 0:
                rest = rest[i + 1:].lstrip()
                break
    name = _NAME.match(rest)
    return name.group(0) if name else None


def check_text(text: str, path: str = "<ptx>",
               fma_in: Sequence[Pattern[str]] = ()) -> Result:
    """Checks PTX text. Instructions belong to the function of the last .entry/.func
    header before them (no header occurs inside a function body); inside a function whose
    name matches one of `fma_in`, fma.rn.f32 is allowed and counted."""
    result = Result()
    clean = strip_comments_and_strings(text)
    newlines = [i for i, c in enumerate(clean) if c == "\n"]
    function: Optional[Function] = None
    for stmt, pos in statements(clean):
        if stmt.startswith(".version"):
            result.has_version = True
        name = function_name(stmt)
        if name is not None:
            function = Function(name, bisect.bisect_left(newlines, pos) + 1,
                                any(p.search(name) for p in fma_in))
            result.functions.append(function)
            continue
        parsed = parse_instruction(stmt)
        if parsed is None:
            continue
        result.instructions += 1
        base, mods = parsed
        if (base, mods) == ALLOWED_FMA and function is not None and function.allowed_fma:
            function.fma += 1
            continue
        broken = rules_broken(base, mods)
        if broken:
            line = bisect.bisect_left(newlines, pos) + 1
            result.violations.append(Violation(path, line, broken, " ".join(stmt.split())))
    return result


def fma_count_violations(results: Sequence[Tuple[str, Result]], fma_counts: Sequence[int],
                         patterns: Sequence[str]) -> List[Violation]:
    """--fma-count: each function allowed fma.rn.f32 holds exactly the count of the first
    --fma-in pattern its name matches (the counts pair with the patterns by position; one
    count holds for every pattern), and every pattern matches a defined function. A function
    defined twice (a declaration, then the definition) is judged by its definition: the
    entry with instructions, or the last."""
    violations = []
    compiled = [re.compile(p) for p in patterns]
    matched = [0] * len(patterns)
    for path, result in results:
        by_name: Dict[str, Function] = {}
        for f in result.functions:
            if f.allowed_fma and (f.name not in by_name or f.fma > 0):
                by_name[f.name] = f
        for f in by_name.values():
            index = next(i for i, p in enumerate(compiled) if p.search(f.name))
            matched[index] += 1
            expected = fma_counts[index if len(fma_counts) > 1 else 0]
            if f.fma != expected:
                violations.append(Violation(
                    path, f.line, ["fma-count"],
                    f"{f.name} holds {f.fma} fma.rn.f32, expected {expected}"))
    for pattern, count in zip(patterns, matched):
        if count == 0:
            violations.append(Violation(
                results[0][0] if results else "<ptx>", 0, ["fma-count"],
                "no function matches --fma-in " + pattern))
    return violations


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ptx_gate.py",
        description="Refuse PTX whose floating-point instructions break the kernel-align "
        "arithmetic contract: fma/mad on floating types, floating add/sub/mul (and "
        "div/sqrt/rcp) without an explicit rounding modifier, any .approx, any .ftz, "
        "div.full, floating mma, floating atomic adds. Allowed: *.rn/.rz/.rm/.rp "
        "arithmetic, div.rn, sqrt.rn, rcp.rn, cvt, neg, abs, min, max, setp, selp, "
        "memory, moves, shuffles, integer ops. See docs/ptx-gate.md.",
        epilog="Exit status: 0 clean; 1 violations found (each listed as file:line: "
        "rules: instruction); 2 usage error or a file that cannot be read or is not PTX. "
        "With --expect: 0 when every expected rule is broken at least once, 1 otherwise.")
    parser.add_argument("ptx", nargs="+", help=".ptx files to check")
    parser.add_argument(
        "--expect", action="append", default=[], metavar="RULE", choices=sorted(RULES),
        help="planted-test mode: succeed only if RULE is broken (repeatable); rules: " +
        ", ".join(sorted(RULES)))
    parser.add_argument(
        "--fma-in", action="append", default=[], metavar="REGEX",
        help="allow fma.rn.f32 (only that form) inside the functions whose PTX name "
        "matches REGEX (re.search; repeatable): the GEMM kernel's explicit __fmaf_rn leaves")
    parser.add_argument(
        "--fma-count", type=int, action="append", default=[], metavar="N",
        help="with --fma-in: each function it matches must hold exactly N fma.rn.f32, and "
        "at least one function must match it; repeatable, the i-th count for the i-th "
        "--fma-in (one count holds for every pattern)")
    args = parser.parse_args(argv)
    if args.fma_count and not args.fma_in:
        parser.error("--fma-count needs --fma-in")
    if len(args.fma_count) > 1 and len(args.fma_count) != len(args.fma_in):
        parser.error(f"--fma-count: {len(args.fma_count)} counts for {len(args.fma_in)} "
                     "--fma-in patterns (give one count, or one per pattern)")
    try:
        fma_in = [re.compile(p) for p in args.fma_in]
    except re.error as e:
        parser.error(f"--fma-in: {e}")

    total = 0
    violations: List[Violation] = []
    results: List[Tuple[str, Result]] = []
    for path in args.ptx:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            print(f"ptx gate: error: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 2
        result = check_text(text, path, fma_in)
        if not result.has_version:
            print(f"ptx gate: error: {path} is not PTX (no .version directive)",
                  file=sys.stderr)
            return 2
        total += result.instructions
        violations.extend(result.violations)
        results.append((path, result))
    if args.fma_count:
        violations.extend(fma_count_violations(results, args.fma_count, args.fma_in))

    for v in violations:
        print(v)
    bad_files = len({v.path for v in violations})
    files = f"{len(args.ptx)} file{'s' if len(args.ptx) != 1 else ''}"
    if violations:
        print(f"ptx gate: {files}, {total} instructions checked, {len(violations)} "
              f"violating instructions in {bad_files} file{'s' if bad_files != 1 else ''}")
    else:
        print(f"ptx gate: {files}, {total} instructions checked, clean")

    if args.expect:
        seen = {r for v in violations for r in v.rules}
        missing = [r for r in args.expect if r not in seen]
        if missing:
            print(f"ptx gate: expected violations not found: {', '.join(missing)}")
            return 1
        print(f"ptx gate: expected violations found: {', '.join(args.expect)}")
        return 0
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
