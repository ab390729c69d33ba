"""``--web-config FILE``: TLS and basic auth for a command that serves HTTP (one option, one meaning)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvguardian.core.exporters.webconfig import WebConfig

__all__ = ["add_web_config", "web_config"]


def add_web_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web-config", metavar="FILE", default=None,
                   help="exporter-toolkit web configuration: tls_server_config (cert_file, key_file) and "
                        "basic_auth_users (bcrypt hashes); see docs/isolation.md")


def web_config(args: argparse.Namespace) -> WebConfig:
    """The parsed ``--web-config`` (plain HTTP without one); a bad file is a one-line usage error."""
    from kvguardian.core.exporters.webconfig import load_web_config  # TLS and bcrypt load only for a server command

    return load_web_config(getattr(args, "web_config", None))
