"""The API reference stays true: every public Python name has a docstring that ``help()``
shows (naming every parameter of a function), every public C++ declaration of
include/kernel_align/*.hpp and cmake/version.hpp.in has a comment, and docs/api.md lists
them all. Each test fails with the list of what is missing."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import kernel_align

ROOT = Path(__file__).resolve().parents[2]
API_MD = ROOT / "docs" / "api.md"
PUBLIC_HEADERS = sorted((ROOT / "include" / "kernel_align").glob("*.hpp"))
VERSION_HEADER = ROOT / "cmake" / "version.hpp.in"
MIN_DOC_CHARS = 40

# The public modules. kernel_align.diffusers needs diffusers; kernel_align.alignment may not
# exist yet: each is skipped (with the reason) where it cannot be imported.
PYTHON_MODULES = (
    "kernel_align",
    "kernel_align.functional",
    "kernel_align.modules",
    "kernel_align.positions",
    "kernel_align.runtime",
    "kernel_align.diffusers",
    "kernel_align.alignment",
    "kernel_align.sequence_parallel",
    "kernel_align.tensor_parallel",
)


# ---------------------------------------------------------------------------------------
# docs/api.md


def api_code_text() -> str:
    """The code of docs/api.md: its fenced blocks and inline code spans, one per line."""
    text = API_MD.read_text(encoding="utf-8")
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"``(.+?)``|`([^`\n]+)`", prose)
    return "\n".join(fenced + [a or b for a, b in spans])


def mentioned(name: str, code: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", code) is not None


def missing_from_api_md(names) -> list[str]:
    code = api_code_text()
    return sorted({n for n in names if not mentioned(n, code)})


# ---------------------------------------------------------------------------------------
# C++: a small parser of the public headers


@dataclasses.dataclass
class Declaration:
    name: str
    kind: str  # function, struct, class, enum, constant, variable, alias, macro
    header: str
    line: int  # first line of the declaration (template <...> included), 0-based
    head_end: int  # line of the ';' or '{' that ends its head
    end: int  # last line (its body's '}' included)
    has_body: bool
    enumerators: tuple[str, ...] = ()

    def where(self) -> str:
        return f"{self.header}:{self.line + 1} {self.kind} {self.name}"


def strip_comments(text: str) -> tuple[str, list[bool]]:
    """The text with comments and the contents of string and character literals blanked
    (newlines kept, so lines and columns stay), and for each line whether it holds a
    comment."""
    out = list(text)
    commented = [False] * (text.count("\n") + 1)
    line = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            commented[line] = True
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if text[k] == "\n":
                    line += 1
                else:
                    out[k] = " "
                commented[line] = True
            i = j
        elif c == '"' or (c == "'" and re.match(r"'(\\.|[^\\'\n])'", text[i:i + 4])):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out), commented


def skip_template_prefix(head: str) -> str:
    while head.startswith("template"):
        start = head.find("<")
        depth, i = 0, start
        for i in range(start, len(head)):
            depth += {"<": 1, ">": -1}.get(head[i], 0)
            if depth == 0:
                break
        head = head[i + 1:].strip()
    return head


def classify(head: str) -> tuple[str, str] | None:
    """(kind, name) of a namespace-scope declaration's head (its text up to the ';' or
    '{' that ends it), None for what declares no name (static_assert, ...)."""
    head = skip_template_prefix(" ".join(head.split()))
    head = re.sub(r"^(\[\[.*?\]\]\s*)+", "", head)
    if re.match(r"(static_assert|extern\s+template)\b", head):
        return None
    if m := re.match(r"enum\s+(?:class\s+|struct\s+)?(?:\[\[.*?\]\]\s*)?(\w+)", head):
        return "enum", m.group(1)
    if m := re.match(r"(struct|class|union)\s+(?:\[\[.*?\]\]\s*)?(\w+)", head):
        return m.group(1), m.group(2)
    if m := re.match(r"using\s+(\w+)\s*=", head):
        return "alias", m.group(1)
    if m := re.match(r"using\s+(?:typename\s+)?[\w:]*::(\w+)$", head):
        return "alias", m.group(1)
    paren, equals = head.find("("), head.find("=")
    if paren >= 0 and (equals < 0 or paren < equals):
        m = re.search(r"(~?\w+)\s*$", head[:paren])
        if m is None or m.group(1) == "operator":
            return None
        return "function", m.group(1)
    declarator = head if equals < 0 else head[:equals]
    m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", declarator)
    if m is None:
        return None
    return ("constant" if re.search(r"\b(constexpr|const)\b", declarator) else "variable",
            m.group(1))


def matching_brace(code: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(code)):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise AssertionError(f"unbalanced braces after offset {open_at}")


def parse_header(path: Path) -> list[Declaration]:
    """The names a header declares at the scope of a public namespace (kernel_align, not
    its detail/internal namespaces), and its KERNEL_ALIGN_* macros."""
    text = path.read_text(encoding="utf-8")
    code, _ = strip_comments(text)
    # Preprocessor lines (with continuations) are not declarations: blank them, noting
    # the macros they define.
    lines = code.split("\n")
    declarations: list[Declaration] = []
    in_directive = False
    for number, line in enumerate(lines):
        if in_directive or line.lstrip().startswith("#"):
            if m := re.match(r"\s*#\s*define\s+(KERNEL_ALIGN_\w+)", line):
                declarations.append(Declaration(m.group(1), "macro", path.name, number, number,
                                                number, False))
            in_directive = line.rstrip().endswith("\\")
            lines[number] = " " * len(line)
    code = "\n".join(lines)
    line_of = [0] * (len(code) + 1)
    number = 0
    for i, c in enumerate(code):
        line_of[i] = number
        number += c == "\n"
    line_of[len(code)] = number

    namespaces: list[str] = []  # the enclosing namespaces
    start, paren, i = None, 0, 0
    while i < len(code):
        c = code[i]
        if start is None:
            if c.isspace() or c == ";":
                i += 1
                continue
            if c == "}":
                assert namespaces, f"{path.name}:{line_of[i] + 1}: '}}' closes no namespace"
                namespaces.pop()
                i += 1
                continue
            start, paren = i, 0
        if c in "([":
            paren += 1
        elif c in ")]":
            paren -= 1
        elif paren == 0 and c in ";{":
            head = code[start:i]
            public = bool(namespaces) and not any(
                part in ("detail", "internal") for ns in namespaces for part in ns.split("::"))
            if c == "{" and (m := re.match(r"\s*(?:inline\s+)?namespace\s*([\w:]*)\s*$", head)):
                namespaces.append(m.group(1))
                start = None
                i += 1
                continue
            end = i
            if c == "{":
                end = matching_brace(code, i)
                after = re.match(r"\s*;", code[end + 1:])
                if after:
                    end += after.end()
            kind_name = classify(head) if public else None
            if kind_name is not None:
                kind, name = kind_name
                enumerators = ()
                if kind == "enum" and c == "{":
                    body = code[i + 1:matching_brace(code, i)]
                    enumerators = tuple(re.findall(r"(\w+)\s*(?:=[^,]*)?(?:,|$)", body.strip()))
                declarations.append(Declaration(name, kind, path.name, line_of[start], line_of[i],
                                                line_of[end], c == "{", enumerators))
            start = None
            i = end + 1
            continue
        i += 1
    assert start is None and not namespaces, f"{path.name}: a declaration or namespace is open"
    return declarations


def is_commented(declaration: Declaration, raw_lines: list[str], commented: list[bool],
                 declarations: list[Declaration]) -> bool:
    """A comment on a line of the declaration's head (a trailing one), or a comment line
    directly above it or above the contiguous group of declarations it ends (body-less
    or one-line ones: a multi-line body ends a group). A macro's group is the
    preprocessor block above it (the version header documents its macros in its opening
    comment)."""
    if any(commented[line] for line in range(declaration.line, declaration.head_end + 1)):
        return True
    line = declaration.line - 1
    while line >= 0:
        raw = raw_lines[line].strip()
        if raw.startswith(("//", "/*")) or raw.endswith("*/"):
            return True
        if declaration.kind == "macro":
            if raw and not raw.startswith("#"):
                return False
            line -= 1
            continue
        if not raw:
            return False
        above = next((d for d in declarations if d.kind != "macro" and d.line <= line <= d.end),
                     None)
        if above is None or (above.has_body and above.end > above.line):
            return False
        line = above.line - 1
    return False


def cpp_declarations() -> list[Declaration]:
    return [d for path in PUBLIC_HEADERS + [VERSION_HEADER] for d in parse_header(path)]


def test_the_header_parser_finds_the_known_names():
    """Not vacuous: every public header declares something, and the names the other tests
    rely on are found with their kinds."""
    assert len(PUBLIC_HEADERS) >= 10, PUBLIC_HEADERS
    for path in PUBLIC_HEADERS + [VERSION_HEADER]:
        assert parse_header(path), f"no public declaration found in {path}"
    kinds = {d.name: d.kind for d in cpp_declarations()}
    expected = {
        "qk_rmsnorm_forward": "function", "qk_norm_rope_backward": "function",
        "fp32_option": "function", "narrow": "function", "dtype_size": "function",
        "TensorView": "alias", "ConstTensorView": "alias", "BasicTensorView": "struct",
        "Error": "class", "NormMode": "enum", "DType": "enum", "kMaxHeadDim": "constant",
        "kMaxRank": "constant", "CallReport": "struct", "version": "function",
        "contract_version": "function", "KERNEL_ALIGN_VERSION_STRING": "macro",
    }
    wrong = {name: kinds.get(name) for name, kind in expected.items() if kinds.get(name) != kind}
    assert not wrong, f"expected kinds {expected}, found {wrong}"
    enums = {d.name: d.enumerators for d in cpp_declarations() if d.kind == "enum"}
    assert enums["Platform"] == ("Cpu", "Cuda", "Rocm", "Musa", "Npu")
    assert enums["DType"] == ("F32", "BF16", "F16", "Bool")
    assert len(kinds) >= 60, sorted(kinds)


def test_every_public_cpp_declaration_has_a_comment():
    missing = []
    for path in PUBLIC_HEADERS + [VERSION_HEADER]:
        raw_lines = path.read_text(encoding="utf-8").split("\n")
        _, commented = strip_comments(path.read_text(encoding="utf-8"))
        declarations = parse_header(path)
        missing += [d.where() for d in declarations
                    if not is_commented(d, raw_lines, commented, declarations)]
    assert not missing, "public C++ declarations without a comment:\n  " + "\n  ".join(missing)


def test_every_public_cpp_name_is_in_api_md():
    declarations = cpp_declarations()
    names = {d.name for d in declarations} | {e for d in declarations for e in d.enumerators}
    headers = {f"kernel_align/{p.name}" for p in PUBLIC_HEADERS} | {"kernel_align/version.hpp"}
    missing = missing_from_api_md(names | headers)
    assert not missing, "C++ names missing from docs/api.md: " + ", ".join(missing)


# ---------------------------------------------------------------------------------------
# Python


def load(module_name: str):
    if module_name == "kernel_align.alignment" and importlib.util.find_spec(module_name) is None:
        pytest.skip("kernel_align.alignment does not exist (yet)")
    if module_name == "kernel_align.diffusers" and importlib.util.find_spec("diffusers") is None:
        pytest.skip("kernel_align.diffusers needs diffusers, which is not installed")
    return importlib.import_module(module_name)


def public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__]
    return list(names)


def own_doc(obj) -> str | None:
    """The object's own docstring (a class inherits none here), cleaned as help() shows it."""
    if inspect.isclass(obj) and "__doc__" not in vars(obj):
        return None
    return inspect.getdoc(obj) if obj.__doc__ else None


def mentions(doc: str, name: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", doc) is not None


def function_problems(label: str, func) -> list[str]:
    doc = own_doc(func)
    if doc is None or len(doc) < MIN_DOC_CHARS:
        return [f"{label}: no docstring of at least {MIN_DOC_CHARS} characters"]
    parameters = [p for p in inspect.signature(func).parameters if p not in ("self", "cls")]
    absent = [p for p in parameters if not mentions(doc, p)]
    return [f"{label}: docstring does not name parameter(s) {', '.join(absent)}"] if absent else []


def class_problems(label: str, cls) -> list[str]:
    problems = []
    doc = own_doc(cls)
    if doc is None or len(doc) < MIN_DOC_CHARS:
        problems.append(f"{label}: no docstring of at least {MIN_DOC_CHARS} characters")
    fields = getattr(cls, "_fields", None)
    if isinstance(fields, tuple) and issubclass(cls, tuple):  # a NamedTuple
        if doc == f"{cls.__name__}({', '.join(fields)})":
            problems.append(f"{label}: only the generated NamedTuple docstring")
        for field in fields:
            field_doc = getattr(cls, field).__doc__ or ""
            if field_doc.startswith("Alias for field number") or not mentions(doc or "", field):
                problems.append(f"{label}.{field}: field not described (class docstring and "
                                "field __doc__)")
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if inspect.isfunction(member):
            problems += function_problems(f"{label}.{name}", member)
        elif isinstance(member, property):
            if not member.__doc__ or len(member.__doc__) < MIN_DOC_CHARS:
                problems.append(f"{label}.{name}: property without a docstring")
    return problems


def object_problems(module, name: str) -> list[str]:
    label = f"{module.__name__}.{name}"
    obj = getattr(module, name)
    if inspect.isclass(obj):
        return class_problems(label, obj)
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return function_problems(label, obj)
    if inspect.ismodule(obj):
        return [] if own_doc(obj) else [f"{label}: module without a docstring"]
    # A constant: its own __doc__ is its type's, so the module's docstring must say it.
    if not mentions(inspect.getdoc(module) or "", name):
        return [f"{label}: constant not described in the docstring of {module.__name__}"]
    return []


@pytest.mark.parametrize("module_name", PYTHON_MODULES)
def test_every_public_python_name_has_a_docstring(module_name):
    module = load(module_name)
    names = public_names(module)
    assert names, f"{module_name} exports no public name"
    problems = []
    doc = own_doc(module)
    if doc is None or len(doc) < MIN_DOC_CHARS:
        problems.append(f"{module_name}: no module docstring of at least {MIN_DOC_CHARS} characters")
    for name in names:
        problems += object_problems(module, name)
    if module_name == "kernel_align" and not mentions(doc or "", "__version__"):
        problems.append("kernel_align: the module docstring does not describe __version__")
    assert not problems, "docstrings missing or incomplete:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("module_name", PYTHON_MODULES)
def test_every_public_python_name_is_in_api_md(module_name):
    module = load(module_name)
    names = {module_name} | set(public_names(module))
    for name in public_names(module):
        obj = getattr(module, name)
        if inspect.isclass(obj):
            names |= {f"{name}.{m}" for m in vars(obj)
                      if not m.startswith("_") and inspect.isfunction(vars(obj)[m])}
            names |= set(getattr(obj, "_fields", ()) if issubclass(obj, tuple) else ())
            if "__call__" in vars(obj):
                names.add(f"{name}.__call__")
    if module_name == "kernel_align":
        names.add("__version__")
    missing = missing_from_api_md(names)
    assert not missing, f"names of {module_name} missing from docs/api.md: " + ", ".join(missing)


def test_the_python_checks_are_not_vacuous():
    names = public_names(kernel_align)
    for known in ("qk_rmsnorm", "qk_norm_rope_", "QkRmsNorm", "CallReport", "HAS_CUDA",
                  "CONTRACT_VERSION", "rope_tables", "set_backend"):
        assert known in names
    assert len(names) >= 20
    # The parameter check does see parameters: qk_norm_rope has fifteen.
    assert len(inspect.signature(kernel_align.qk_norm_rope).parameters) == 15
    assert function_problems("f", lambda x: x)  # no docstring at all

    def undocumented_parameter(x, weight):
        """A docstring long enough, which describes x but not the other parameter."""

    assert function_problems("g", undocumented_parameter) == [
        "g: docstring does not name parameter(s) weight"]
