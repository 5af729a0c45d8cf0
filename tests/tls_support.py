"""Certificates for the TLS tests, made with the ``openssl`` command."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)


def write_certificates(directory: Path) -> None:
    """Write a CA and two certificates it signs for IP 127.0.0.1, each good for server and client auth.

    Files: ``ca.pem``, ``server.pem`` with ``server.key``, ``client.pem`` with ``client.key``.
    """
    _openssl(
        directory,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=consensus-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    (directory / "usage.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    for name in ("server", "client"):
        _openssl(
            directory,
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        _openssl(
            directory,
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "usage.ext",
            "-out",
            f"{name}.pem",
        )
