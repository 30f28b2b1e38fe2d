"""VERIFIER_HOOKS parsing: valid entries are kept, each bad entry gets one clear message."""

from __future__ import annotations

import pytest
from servewitness_probe._hooks import HookDecl, parse_hooks


def test_valid_entries_of_both_forms_are_parsed() -> None:
    decls, errors = parse_hooks(" a=pkg.mod:Cls.meth , b=pkg.other ,, c=m:f")
    assert errors == []
    assert decls == [
        HookDecl("a", "pkg.mod", "Cls.meth"),
        HookDecl("b", "pkg.other", None),
        HookDecl("c", "m", "f"),
    ]
    assert [d.target for d in decls] == ["pkg.mod:Cls.meth", "pkg.other", "m:f"]


def test_empty_value_declares_nothing() -> None:
    assert parse_hooks("") == ([], [])


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("noequals", "expected name=module:qualname"),
        ("=mod:f", "expected name=module:qualname"),
        ("name=", "expected name=module:qualname"),
        ("bad name=mod:f", "hook name may use"),
        ("n=1mod:f", "target must be a dotted module"),
        ("n=mod:", "target must be a dotted module"),
        ("n=mod:a..b", "target must be a dotted module"),
    ],
)
def test_malformed_entry_is_reported_and_the_rest_kept(entry: str, fragment: str) -> None:
    decls, errors = parse_hooks(f"good=m:f,{entry},other=m2")
    assert [d.name for d in decls] == ["good", "other"]
    assert len(errors) == 1
    assert fragment in errors[0]
    assert repr(entry.strip()) in errors[0]


def test_duplicate_name_keeps_the_first_and_reports_the_second() -> None:
    decls, errors = parse_hooks("a=m:f,a=m:g")
    assert decls == [HookDecl("a", "m", "f")]
    assert errors == ["entry 'a=m:g': hook 'a' declared twice; keeping the first"]


def test_device_suffix_marks_a_device_counted_hook() -> None:
    decls, errors = parse_hooks("d=pkg.mod:Net.forward@device,m=pkg.mod@device")
    assert decls == [HookDecl("d", "pkg.mod", "Net.forward", device=True)]
    assert decls[0].target == "pkg.mod:Net.forward@device"
    assert len(errors) == 1 and "@device and @first need a callable" in errors[0]


def test_first_suffix_marks_a_first_hit_hook() -> None:
    decls, errors = parse_hooks("f=pkg.mod:Cls.meth@first,g=pkg.mod@first")
    assert decls == [HookDecl("f", "pkg.mod", "Cls.meth", first=True)]
    assert decls[0].target == "pkg.mod:Cls.meth@first"
    assert len(errors) == 1 and "@device and @first need a callable" in errors[0]
