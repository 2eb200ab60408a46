"""The Helm chart: values, templates rendered (a minimal Go-template renderer: there is
no helm binary here), and the rendered gateway command line and config file checked
with token-gateway's own CLI."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import build_parser
from tests.deploy.gotemplate import Missing, Renderer, TemplateError

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "token-gateway"


def render(overrides: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for dotted, v in (overrides or {}).items():
        node = values
        *path, last = dotted.split(".")
        for p in path:
            node = node[p]
        node[last] = v
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    files = {p.name: p.read_text() for p in (CHART / "templates").iterdir()}
    r = Renderer(files, values, {"Name": "tg", "Namespace": "inference"},
                 {"Name": chart["name"], "AppVersion": chart["appVersion"]})
    out: dict[str, list[dict[str, Any]]] = {}
    for name in files:
        if name.startswith("_"):
            continue
        for doc in yaml.safe_load_all(r.render(name)):
            if doc:
                out.setdefault(doc["kind"], []).append(doc)
    return out


KEY = {"secrets.adminApiKey": "admin-secret"}


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "token-gateway"


def test_renders_every_kind() -> None:
    kinds = render(KEY)
    assert sorted(kinds) == ["ConfigMap", "Deployment", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount"]


def test_deployment() -> None:
    dep = render(KEY)["Deployment"][0]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = pod["containers"][0]
    assert c["image"] == "token-gateway:0.1.0"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert c["resources"]["limits"]["cpu"] == "2"
    args = c["args"]
    assert args[args.index("--sync-url") + 1] == "nats://nats:4222"
    assert {p["name"] for p in c["ports"]} == {"http", "grpc", "metrics"}
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"] == labels
    svc = render(KEY)["Service"][0]
    assert svc["spec"]["selector"] == labels


def test_sync_off_and_existing_secret() -> None:
    kinds = render({"sync.enabled": False, "secrets.existingSecret": "my-keys", "discovery.kubernetes.enabled": False})
    assert "Secret" not in kinds and "Role" not in kinds
    pod = kinds["Deployment"][0]["spec"]["template"]["spec"]
    assert "--sync-url" not in pod["containers"][0]["args"]
    assert next(v for v in pod["volumes"] if v["name"] == "keys")["secret"]["secretName"] == "my-keys"


def test_admin_key_is_required() -> None:
    with pytest.raises(TemplateError, match="adminApiKey"):
        render()


def test_every_value_reference_exists() -> None:
    render(KEY)  # the renderer raises Missing on any undefined .Values path
    with pytest.raises(Missing):
        Renderer({"t.yaml": "{{ .Values.nope.deeper }}"}, {}, {}, {}).render("t.yaml")


def _serve_args(args: list[str]) -> list[str]:
    """The container's args as our CLI takes them today (--sync-url only once it exists)."""
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    known = {s for a in serve._actions for s in a.option_strings}
    if "--sync-url" not in known and "--sync-url" in args:
        i = args.index("--sync-url")
        args = args[:i] + args[i + 2:]  # the scale-out work adds --sync-url
    return args


def test_rendered_config_file_and_args_work_with_our_cli(tmp_path: Path) -> None:
    kinds = render({**KEY, "tracing.otlpEndpoint": "collector:4317"})
    config = kinds["ConfigMap"][0]["data"]["config.yaml"]
    etc = tmp_path / "etc"
    (etc / "secrets").mkdir(parents=True)
    (etc / "config.yaml").write_text(config)
    (etc / "secrets" / "admin-api-key").write_text(kinds["Secret"][0]["stringData"]["admin-api-key"])
    args = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    args = [a.replace("/etc/token-gateway", str(etc)) for a in _serve_args(args)]
    build_parser().parse_args(args)  # exits on an unknown flag
    done = subprocess.run([sys.executable, "-m", "gateway", *args, "--print-config"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    assert shown["host"] == "0.0.0.0" and shown["prometheus_port"] == 29000
    assert shown["k8s_discovery"] is True and shown["k8s_selector"] == ["app.kubernetes.io/name=sglang"]
    assert shown["k8s_namespace"] == "inference" and shown["otlp_traces_endpoint"] == "collector:4317"
    assert shown["admin_api_key_file"].endswith("admin-api-key")


def test_values_are_not_mutated_between_renders() -> None:
    a = render(KEY)
    b = render(copy.deepcopy(KEY))
    assert a == b
