"""What kind of target a string names, told without loading the collector that reads it: the endpoint collector
loads http.client, ssl and the email parser; the pod collector the Kubernetes client's helpers. ``check`` asks
these first, so an SSH or capture target loads neither (tests/test_startup.py)."""

from __future__ import annotations


def is_endpoint(target: str) -> bool:
    """A live server's own HTTP endpoints (kvaudit.collect.endpoint)."""
    return target.startswith(("http://", "https://"))


def is_pod_target(target: str) -> bool:
    """A pod or pod group through the Kubernetes API (kvaudit.collect.kube)."""
    return target.startswith("k8s:")
