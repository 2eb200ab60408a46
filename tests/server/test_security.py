"""Who may call what (server/security.py): inference keys, the admin key, the loopback
guard, metrics access, worker TLS options and per-key cache salts."""

from __future__ import annotations

import pytest

from gateway.protocol.errors import AuthenticationError, PermissionDeniedError
from gateway.server.security import (
    Authenticator,
    InsecureAdminError,
    SecurityConfig,
    bearer_token,
    check_startup,
    is_loopback,
    key_id,
)


def _h(token: str | None) -> dict[str, str]:
    return {} if token is None else {"authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True), ("127.8.0.1", True),
     ("0.0.0.0", False), ("", False), ("10.0.0.1", False), ("example.com", False)],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_open_admin_endpoints_only_on_loopback_unless_allowed() -> None:
    check_startup("127.0.0.1", SecurityConfig())
    check_startup("0.0.0.0", SecurityConfig(admin_api_key="a"))
    check_startup("0.0.0.0", SecurityConfig(allow_unauthenticated_admin=True))
    with pytest.raises(InsecureAdminError, match="--admin-api-key"):
        check_startup("0.0.0.0", SecurityConfig())


def test_bearer_tokens_and_key_ids() -> None:
    assert bearer_token({"authorization": "Bearer  abc "}) == "abc"
    assert bearer_token({"authorization": "bearer abc"}) == "abc"
    assert bearer_token({"authorization": "Basic abc"}) is None
    assert bearer_token({"authorization": "Bearer "}) is None and bearer_token({}) is None
    assert key_id(None) is None and key_id("k") == key_id("k") and len(key_id("k") or "") == 12
    assert key_id("k") != key_id("k2") and "k" not in (key_id("secret") or "")


def test_inference_takes_any_inference_key_or_the_admin_key() -> None:
    auth = Authenticator(["k1", "k2", ""], SecurityConfig(admin_api_key="adm"))
    assert auth.inference(_h("k2")) == key_id("k2")
    assert auth.inference(_h("adm")) == key_id("adm")
    for bad in (None, "nope", ""):
        with pytest.raises(AuthenticationError):
            auth.inference(_h(bad))
    assert Authenticator([], SecurityConfig()).inference(_h("anything")) is None  # open: anonymous


def test_admin_takes_only_the_admin_key() -> None:
    auth = Authenticator(["k1"], SecurityConfig(admin_api_key="adm"))
    auth.admin(_h("adm"))
    assert auth.admin_call(_h("adm")) == key_id("adm") and not auth.admin_open
    with pytest.raises(PermissionDeniedError):
        auth.admin(_h("k1"))  # a valid inference key: 403, not 401
    with pytest.raises(PermissionDeniedError):
        auth.reader(_h("k1"))
    with pytest.raises(AuthenticationError):
        auth.admin(_h("other"))
    open_admin = Authenticator(["k1"], SecurityConfig())
    assert open_admin.admin_open and open_admin.admin_call({}) is None


def test_inspection_is_admin_only_unless_opened_to_any_key() -> None:
    strict = Authenticator(["k1"], SecurityConfig(admin_api_key="adm"))
    with pytest.raises(PermissionDeniedError):
        strict.inspector(_h("k1"))
    assert strict.inspector(_h("adm")) == key_id("adm")
    opened = Authenticator(["k1"], SecurityConfig(admin_api_key="adm", inspect_access="any"))
    assert opened.inspector(_h("k1")) == key_id("k1")
    no_admin = Authenticator(["k1"], SecurityConfig())
    with pytest.raises(AuthenticationError):
        no_admin.inspector({})  # no admin key: as strict as inference


def test_metrics_need_some_key_and_one_must_exist() -> None:
    with pytest.raises(AuthenticationError, match="has none configured"):
        Authenticator([], SecurityConfig()).metrics(_h("x"))
    auth = Authenticator(["k1"], SecurityConfig(admin_api_key="adm"))
    auth.metrics(_h("k1"))
    auth.metrics(_h("adm"))
    with pytest.raises(AuthenticationError):
        auth.metrics(_h("x"))


def test_cache_salts_per_key_only_when_asked() -> None:
    assert Authenticator(["k"], SecurityConfig()).key_salt("id") is None
    salted = Authenticator(["k"], SecurityConfig(cache_salt_per_key=True))
    assert salted.key_salt("id") == "key:id" and salted.key_salt(None) is None


def test_worker_tls_options() -> None:
    assert SecurityConfig().tls() is None
    tls = SecurityConfig(worker_tls_ca_file="ca.pem").tls()
    assert tls is not None and tls.ca_file == "ca.pem"
    with pytest.raises(ValueError, match="go together"):
        SecurityConfig(worker_tls_cert_file="c.pem").tls()
