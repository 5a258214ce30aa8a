"""A provider family's declaration (:mod:`reconcile.providers.family`) and what derives from it:
the families are the packages that declare one; the settings it names exist with their
defaults, are named for it and are all of its settings; its secrets are the ones redacted; the
naming rules are refused where a declaration breaks them."""

from __future__ import annotations

import pkgutil
import sys
from datetime import timedelta
from pathlib import Path

import pytest

import reconcile.providers
from reconcile import Settings
from reconcile.core import redact
from reconcile.kinds import BUILTIN_KINDS, BUILTIN_PROVIDERS
from reconcile.providers import declared_output, family as registry
from reconcile.providers.family import (
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


def test_the_registry_is_the_providers_packages_in_order() -> None:
    """The families are the subpackages of ``reconcile.providers`` (each declares ``FAMILY``),
    ordered by name: no list of them is written by hand."""
    packages = sorted(i.name for i in pkgutil.iter_modules(reconcile.providers.__path__) if i.ispkg)
    assert tuple(f.name for f in families()) == tuple(packages) == BUILTIN_PROVIDERS
    assert tuple(k.name for f in families() for k in f.kinds) == BUILTIN_KINDS
    kie = family("kie")
    assert kie is not None and kie in families() and kie.name == "kie"
    assert family("nosuchfamily") is None and family(None) is None


_FAMILY_PACKAGE = """
from datetime import timedelta
from reconcile.providers.family import Kind, ProviderFamily
FAMILY = ProviderFamily({name!r}, kinds=(Kind("{kind}-x", False, timedelta(minutes=1), None,
                        None, None, "unused:unused"),), urls={{"{kind}_base_url": "http://x"}})
"""


def test_discovery_takes_each_package_declaring_a_family_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package that declares ``FAMILY`` is found wherever its name sorts; a package without
    one is not a family; a ``FAMILY`` named for another package is refused at discovery."""
    for package, body in (("aaafam", _FAMILY_PACKAGE.format(name="aaafam", kind="aaafam")),
                          ("zzzhelpers", "HELPER = 1\n")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(body)
    monkeypatch.setattr(reconcile.providers, "__path__", [*reconcile.providers.__path__,
                                                         str(tmp_path)])
    try:
        found = registry._discover()
        assert [f.name for f in found] == ["aaafam", *BUILTIN_PROVIDERS]
        (tmp_path / "mmmfam").mkdir()
        (tmp_path / "mmmfam" / "__init__.py").write_text(
            _FAMILY_PACKAGE.format(name="othername", kind="othername"))
        with pytest.raises(ImportError, match="mmmfam must declare FAMILY"):
            registry._discover()
    finally:
        for name in ("aaafam", "zzzhelpers", "mmmfam"):
            sys.modules.pop(f"reconcile.providers.{name}", None)
    assert families() == tuple(f for f in families() if f.name in BUILTIN_PROVIDERS)


@pytest.mark.parametrize("declared", FAMILIES)
def test_a_familys_settings_are_derived_with_their_defaults(
        declared: ProviderFamily, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Settings()`` holds each field the family declares, at its declared default, read from
    ``RECONCILE_<FIELD>``; ``Settings.model_fields`` keeps only the library's own fields."""
    for name in declared.setting_fields:
        monkeypatch.delenv(f"RECONCILE_{name.upper()}", raising=False)
    settings = Settings()
    assert isinstance(settings, Settings) and type(settings) is Settings.with_families()
    for name, default in declared.setting_defaults.items():
        assert getattr(settings, name) == default
        assert name not in Settings.model_fields
        monkeypatch.setenv(f"RECONCILE_{name.upper()}", f"{name}-from-the-environment")
    again = Settings()
    for name in declared.setting_fields:
        assert getattr(again, name) == f"{name}-from-the-environment"
    assert getattr(Settings(**{name: "given" for name in declared.setting_fields}),
                   declared.setting_fields[0]) == "given"
    assert getattr(Settings.model_construct(), declared.setting_fields[0]) == \
        declared.setting_defaults[declared.setting_fields[0]]


@pytest.mark.parametrize("declared", FAMILIES)
def test_a_familys_settings_are_fields_named_for_it(declared: ProviderFamily) -> None:
    """Every setting a family declares is a Settings field, and every Settings field named for
    the family is declared by it: a field missing on either side fails here."""
    fields = set(Settings.with_families().model_fields)
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
    ({"urls": {"other_base_url": "http://x"}}, "settings are named testfam_"),
    ({"urls": {"testfam_base_url": "http://x"}, "secrets": {"testfam_base_url": ""}},
     "listed once"),
    ({"simulator": "platform.tests.sim"}, "lives under reconcile.testing"),
    ({"urls": {"testfam_base_url": 5}}, "a string or None"),
    # RECONCILE_MEDIA_… holds the library's own settings (media_max_bytes …)
    ({"name": "media", "kinds": (_kind("media-x"),)}, "library's own settings"),
])
def test_a_declaration_that_breaks_a_naming_rule_is_refused(
        fields: dict[str, object], message: str) -> None:
    given: dict[str, object] = {"name": "testfam", "kinds": (_kind("testfam-render"),), **fields}
    with pytest.raises(ValueError, match=message):
        ProviderFamily(**given)  # type: ignore[arg-type]
