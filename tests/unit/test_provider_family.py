"""A provider family's declaration (:mod:`reconcile.providers.family`) and what derives from it:
the settings it names exist, are named for it and are all of its settings; its secrets are the
ones redacted; the naming rules are refused where a declaration breaks them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reconcile import Settings
from reconcile.core import redact
from reconcile.kinds import BUILTIN_KINDS, BUILTIN_PROVIDERS
from reconcile.providers import declared_output
from reconcile.providers.family import (
    BUILTIN_FAMILIES,
    Kind,
    ProviderFamily,
    families,
    family,
)
from reconcile.providers.outputs import ANY, MEDIA

FAMILIES = [pytest.param(f, id=f.name) for f in families()]


def _kind(name: str, **fields: object) -> Kind:
    return Kind(name, False, timedelta(minutes=1), None, None, None, "unused:unused",
                **fields)  # type: ignore[arg-type]


def test_the_registry_is_the_builtin_families_in_order() -> None:
    assert tuple(f.name for f in families()) == BUILTIN_FAMILIES == BUILTIN_PROVIDERS
    assert tuple(k.name for f in families() for k in f.kinds) == BUILTIN_KINDS
    assert family("kie") is families()[0] and family("nosuchfamily") is None and family(None) is None


@pytest.mark.parametrize("declared", FAMILIES)
def test_a_familys_settings_are_fields_named_for_it(declared: ProviderFamily) -> None:
    """Every setting a family declares is a Settings field, and every Settings field named for
    the family is declared by it: a field missing on either side fails here."""
    fields = set(Settings.model_fields)
    assert set(declared.setting_fields) <= fields
    named = {f for f in fields if f.startswith(f"{declared.name}_")}
    assert named == set(declared.setting_fields)
    assert declared.urls, "a family's client is pointed somewhere"


@pytest.mark.parametrize("declared", FAMILIES)
def test_a_familys_secrets_are_the_redacted_fields(declared: ProviderFamily) -> None:
    """``secrets`` are exactly the family's ``_Secret`` fields, and a configured value of each is
    redacted wherever the library logs or stores text."""
    marked = {f for f in Settings.secret_fields() if f.startswith(f"{declared.name}_")}
    assert marked == set(declared.secrets)
    values = {name: f"{declared.name}-secret-value-{i:04d}" for i, name in
              enumerate(declared.secrets)}
    Settings(**values)  # type: ignore[arg-type]
    for value in values.values():
        assert value not in redact.text(f"the answer echoed {value} back")


def test_every_redacted_field_belongs_to_a_family() -> None:
    assert set(Settings.secret_fields()) == {s for f in families() for s in f.secrets}


def test_the_output_defaults_come_from_the_declarations() -> None:
    """``declared_output`` answers from each family's ``output`` and ``outputs``."""
    for declared in families():
        assert declared_output(declared.name, "no/such-endpoint") == declared.output
        for model, spec in declared.outputs.items():
            assert declared_output(declared.name, f"{model}/variant") == spec
    assert declared_output("nosuchfamily", "a/b") == MEDIA
    assert {f.name: f.output for f in families()}["replicate"] == ANY


@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "Bad-Name"}, "lower-case letters and digits"),
    ({"name": "kie2", "kinds": (_kind("kie-x"),)}, "is not named kie2-"),
    ({"kinds": (_kind("testfam-x", provider="other"),)}, "provider 'other'"),
    ({"kinds": ()}, "declares no kind"),
    ({"urls": ("other_base_url",)}, "settings are named testfam_"),
    ({"urls": ("testfam_base_url",), "secrets": ("testfam_base_url",)}, "listed once"),
    ({"simulator": "platform.tests.sim"}, "lives under reconcile.testing"),
])
def test_a_declaration_that_breaks_a_naming_rule_is_refused(
        fields: dict[str, object], message: str) -> None:
    given: dict[str, object] = {"name": "testfam", "kinds": (_kind("testfam-render"),), **fields}
    with pytest.raises(ValueError, match=message):
        ProviderFamily(**given)  # type: ignore[arg-type]
