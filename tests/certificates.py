"""Throwaway TLS certificates for the tests, made with ``openssl``: a CA and a server
certificate it signs for 127.0.0.1 and localhost."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")


def openssl(folder: Path, *args: str) -> None:
    """Run ``openssl`` in ``folder``; the test skips when it is not installed."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl makes the test certificates")
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def certificate_authority(folder: Path, name: str) -> Path:
    """A self-signed CA, ``folder/name.pem`` (its key beside it), valid one day."""
    folder.mkdir(parents=True, exist_ok=True)
    openssl(
        folder, "req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.pem",
        "-days", "1", "-subj", f"/CN={name}",
    )  # fmt: skip
    return folder / f"{name}.pem"


def server_certificate(folder: Path, ca: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate and key for a server on 127.0.0.1 / localhost, signed by ``ca``."""
    openssl(
        folder, "req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
        "-subj", "/CN=localhost",
    )  # fmt: skip
    (folder / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        folder, "x509", "-req", "-in", f"{name}.csr", "-CA", str(ca),
        "-CAkey", str(ca.with_suffix(".key")), "-CAcreateserial", "-out", f"{name}.pem",
        "-days", "1", "-extfile", f"{name}.ext",
    )  # fmt: skip
    return folder / f"{name}.pem", folder / f"{name}.key"
