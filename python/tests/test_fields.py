"""The package reads and sets crew's structs through libcrew's own table of them (crew_struct_fields),
never through a copy of their layout. Held here against include/crew.h: every member of every
struct the table describes has its row, of the type crew.h declares, and nothing else does; so a
member added to crew.h and forgotten in src/train/fields.c fails this test."""
import os
import re

import pytest

from crew import _lib
from conftest import SOURCE

HEADER = os.path.join(SOURCE, "include", "crew.h")


def _structs(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return {m.group(2): m.group(1) for m in re.finditer(r"typedef struct \w+ \{(.*?)\} (\w+);", text, flags=re.S)}


def _members(body, structs, prefix=""):
    """(name, kind) of each member: kind is the crew_field_type the C declaration makes."""
    out = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        decl = " ".join(decl.split())
        fn = re.match(r".*\(\s*\*\s*(\w+)\s*\)\s*\(.*\)$", decl)
        if fn:
            out.append((prefix + fn.group(1), _lib.POINTER))
            continue
        first, *more = decl.split(",")
        m = re.match(r"(.*?)(\w+)\s*(\[[^\]]*\])?$", first)
        ctype = m.group(1).strip()
        if more:  # "double a, b, c": each declarator of the one type
            body_more = ";".join(f"{ctype} {d.strip()}" for d in [m.group(2) + (m.group(3) or "")] + more)
            out += _members(body_more, structs, prefix)
            continue
        name, array = m.group(2), m.group(3)
        if ctype in structs:  # a nested struct: its members, "augment.flip"
            out += _members(structs[ctype], structs, f"{prefix}{name}.")
        elif array and ctype == "char":
            out.append((prefix + name, _lib.CHARS))
        elif "*" in ctype:
            plain = ctype.replace("const", "").replace(" ", "")
            out.append((prefix + name, _lib.STRING if plain == "char*" else _lib.POINTER))
        else:
            base = ctype.replace("const", "").strip()
            kind = {"int64_t": _lib.INT64, "uint64_t": _lib.UINT64, "size_t": _lib.UINT64, "float": _lib.FLOAT,
                    "double": _lib.DOUBLE}.get(base, _lib.INT)  # int, and the enums
            out.append((prefix + name, kind))
    return out


def _described():
    names, i = [], 0
    while _lib.lib.crew_struct_name(i):
        names.append(_lib.lib.crew_struct_name(i).decode())
        i += 1
    return names


@pytest.mark.parametrize("struct", _described())
def test_every_member_has_its_row(struct):
    with open(HEADER, encoding="utf-8") as f:
        structs = _structs(f.read())
    assert struct in structs, f"{struct} is not in crew.h"
    declared = _members(structs[struct], structs)
    table, size = _lib.layout(struct)
    assert [n for n, _ in declared] == list(table), f"{struct}: crew.h and src/train/fields.c list other members"
    for name, kind in declared:
        assert table[name][0] == kind, f"{struct}.{name}: fields.c says type {table[name][0]}, crew.h {kind}"
    offsets = [off for _, off, _ in table.values()]
    assert offsets == sorted(offsets) and offsets[-1] < size


def test_structs_read_and_set_by_name():
    s = _lib.Struct("crew_fit_options")
    s["epochs"] = 7
    s["lr"] = 0.25
    s["device_kind"] = "cpu"
    s["augment.flip"] = 1
    assert s["epochs"] == 7 and s["lr"] == 0.25 and s["device_kind"] == "cpu" and s["augment.flip"] == 1
    with pytest.raises(KeyError, match="crew_fit_options has no member 'nope'"):
        s["nope"] = 1
    plan = _lib.Struct("crew_fit_plan")
    assert len(plan["stage_first"]) == 65 and plan["conv_choice"] == ""
